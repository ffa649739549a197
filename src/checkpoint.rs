//! Run directories: `config.json` (the resolved [`TrainConfig`]) and burn records of the model
//! (`model.mpk`), written atomically so that a crash never leaves a half-written checkpoint.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::Backend;

use crate::config::TrainConfig;
use crate::model::Model;

pub const CONFIG_FILE: &str = "config.json";
pub const MODEL_FILE: &str = "model.mpk";

type Rec = NamedMpkBytesRecorder<FullPrecisionSettings>;

/// Errors reading or writing a run directory; each names the path.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("run directory {} already exists and is not empty; pass another --run-dir (ember never overwrites a run)", .0.display())]
    Exists(PathBuf),
    #[error("{}: not a checkpoint directory (no {CONFIG_FILE}); pass the run directory that `ember train` printed", .0.display())]
    NotACheckpoint(PathBuf),
    #[error("{}: invalid config: {source}", path.display())]
    Config {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: cannot decode the model record ({reason}); the file is corrupt or from another model", path.display())]
    Record { path: PathBuf, reason: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to `path` through a temporary file that is synced and renamed into place.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let mut file = fs::File::create(&tmp).map_err(io(&tmp))?;
    file.write_all(bytes).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(io(path))?;
    // The rename is durable once the directory entry is.
    if let Some(dir) = path.parent() {
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// A run's directory.
#[derive(Clone, Debug)]
pub struct RunDir {
    pub path: PathBuf,
}

impl RunDir {
    /// Creates `path`, which must not exist or be empty.
    pub fn create(path: PathBuf) -> Result<Self, CheckpointError> {
        if path.exists() {
            let empty = fs::read_dir(&path).map_err(io(&path))?.next().is_none();
            if !empty {
                return Err(CheckpointError::Exists(path));
            }
        }
        fs::create_dir_all(&path).map_err(io(&path))?;
        Ok(Self { path })
    }

    /// `runs/<recipe>-<UTC timestamp>`, with a numeric suffix if that exists already.
    pub fn fresh_default(recipe: &str) -> Result<Self, CheckpointError> {
        let stamp = utc_stamp(std::time::SystemTime::now());
        let base = Path::new("runs").join(format!("{recipe}-{stamp}"));
        let mut path = base.clone();
        let mut n = 1;
        while path.exists() {
            n += 1;
            path = PathBuf::from(format!("{}-{n}", base.display()));
        }
        Self::create(path)
    }

    /// An existing run directory, for reading.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        if !path.join(CONFIG_FILE).is_file() {
            return Err(CheckpointError::NotACheckpoint(path.to_owned()));
        }
        Ok(Self { path: path.to_owned() })
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn save_config(&self, config: &TrainConfig) -> Result<(), CheckpointError> {
        let json = serde_json::to_vec_pretty(config).expect("configs serialise");
        write_atomic(&self.file(CONFIG_FILE), &json)
    }

    pub fn load_config(&self) -> Result<TrainConfig, CheckpointError> {
        let path = self.file(CONFIG_FILE);
        let bytes = fs::read(&path).map_err(io(&path))?;
        serde_json::from_slice(&bytes).map_err(|source| CheckpointError::Config { path, source })
    }

    pub fn save_model<B: Backend>(&self, model: &Model<B>) -> Result<(), CheckpointError> {
        let bytes = Recorder::<B>::record(&Rec::default(), model.clone().into_record(), ())
            .expect("in-memory records serialise");
        write_atomic(&self.file(MODEL_FILE), &bytes)
    }

    /// The model saved in this run, built as `config` describes.
    pub fn load_model<B: Backend>(&self, config: &TrainConfig, device: &B::Device) -> Result<Model<B>, CheckpointError> {
        let path = self.file(MODEL_FILE);
        let bytes = fs::read(&path).map_err(io(&path))?;
        let record = Recorder::<B>::load(&Rec::default(), bytes, device).map_err(|e| CheckpointError::Record {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        Ok(config.model.init::<B>(device).load_record(record))
    }
}

/// `YYYYmmdd-HHMMSS` in UTC.
pub fn utc_stamp(time: std::time::SystemTime) -> String {
    let secs = time
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil conversion.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Recipe;
    use crate::train::init_model;
    use burn::backend::NdArray;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn stamps_in_utc() {
        // date -u -d @1764672000 +%Y%m%d-%H%M%S
        assert_eq!(utc_stamp(UNIX_EPOCH + Duration::from_secs(1_764_672_000)), "20251202-104000");
        assert_eq!(utc_stamp(UNIX_EPOCH + Duration::from_secs(951_782_400)), "20000229-000000");
    }

    #[test]
    fn never_reuses_a_non_empty_directory() {
        let dir = tempfile::tempdir().unwrap();
        RunDir::create(dir.path().to_owned()).unwrap();
        fs::write(dir.path().join("keep.txt"), "x").unwrap();
        let err = RunDir::create(dir.path().to_owned()).unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
        assert_eq!(fs::read_to_string(dir.path().join("keep.txt")).unwrap(), "x");
    }

    #[test]
    fn saves_and_reloads_model_and_config() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        let config = Recipe::Flashlight.config();
        let device = Default::default();
        let model = init_model::<NdArray>(&config, &device);
        run.save_config(&config).unwrap();
        run.save_model(&model).unwrap();
        let reopened = RunDir::open(&run.path).unwrap();
        let loaded_config = reopened.load_config().unwrap();
        assert_eq!(loaded_config, config);
        let loaded = reopened.load_model::<NdArray>(&loaded_config, &device).unwrap();
        let (Model::Flashlight(a), Model::Flashlight(b)) = (model, loaded) else {
            panic!("wrong model kind")
        };
        a.fc1.weight.val().into_data().assert_eq(&b.fc1.weight.val().into_data(), true);
        // No temporary files left behind.
        let names: Vec<_> = fs::read_dir(&run.path).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn corrupt_files_are_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        let config = Recipe::PytorchExample.config();
        run.save_config(&config).unwrap();
        fs::write(run.file(MODEL_FILE), b"\x93garbage").unwrap();
        let err = run.load_model::<NdArray>(&config, &Default::default()).unwrap_err().to_string();
        assert!(err.contains("model.mpk") && err.contains("corrupt"), "{err}");
        fs::write(run.file(CONFIG_FILE), b"{\"recipe\": 3}").unwrap();
        let err = run.load_config().unwrap_err().to_string();
        assert!(err.contains("config.json"), "{err}");
        let err = RunDir::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a checkpoint"), "{err}");
    }
}
