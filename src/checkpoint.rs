//! Run directories: `config.json` (the resolved [`TrainConfig`]), and checkpoints: burn records
//! of the model and the optimizer plus `state.json`, which says where training stands.
//!
//! A checkpoint is committed in three atomic writes (temporary file, fsync, rename): the model
//! record, the optimizer record, each under a new name, then `state.json` naming both. Only
//! then are the files of the previous checkpoint removed, so a crash at any point leaves the
//! last complete checkpoint loadable.

use std::fs;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::Optimizer as _;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::files::{sha256_hex, utc_stamp, write_atomic, FileError};
use crate::model::{EmberModel, Model, ModelKind, Trainable};
use crate::optim::Optimizer;
use crate::progress::Progress;

pub const CONFIG_FILE: &str = "config.json";
pub const STATE_FILE: &str = "state.json";
pub const LOCK_FILE: &str = ".lock";

/// `state.json`: where training stands, and the record files that hold it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    #[serde(flatten)]
    pub progress: Progress,
    /// The model the records hold (`config.json`'s when the checkpoint was written); absent in
    /// checkpoints written before ember recorded it, whose records name it themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Model record file, in the run directory.
    pub model_file: String,
    /// Optimizer record file; none for imported weights.
    pub optimizer_file: Option<String>,
    /// SHA-256 of the model and optimizer record files, checked when they are loaded (absent in
    /// checkpoints written before ember recorded them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_sha256: Option<String>,
}

type Rec = NamedMpkBytesRecorder<FullPrecisionSettings>;

/// Errors reading or writing a run directory; each names the path.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error(transparent)]
    Write(#[from] FileError),
    #[error("{}: SHA-256 {actual}, but state.json recorded {expected}; the file is corrupt (restore it from a copy, or train again)", path.display())]
    Checksum {
        path: PathBuf,
        actual: String,
        expected: String,
    },
    #[error("run directory {} already exists and is not empty; pass another --run-dir (ember never overwrites a run)", .0.display())]
    Exists(PathBuf),
    #[error("{}: another ember process is training in this run directory; wait for it to finish or pass another --run-dir", .0.display())]
    Busy(PathBuf),
    #[error("{}: not a checkpoint directory (no {CONFIG_FILE}); pass the run directory that `ember train` printed", .0.display())]
    NotACheckpoint(PathBuf),
    #[error("{}: invalid config: {error}", path.display())]
    Config { path: PathBuf, error: serde_json::Error },
    #[error("{}: {}", path.display(), crate::config::as_fields(&error.to_string()))]
    ConfigValue {
        path: PathBuf,
        error: crate::config::ConfigError,
    },
    #[error("{}: cannot decode the record ({reason}); the file is corrupt or from another model", path.display())]
    Record { path: PathBuf, reason: String },
    #[error("{}: invalid checkpoint state: {error}", path.display())]
    State { path: PathBuf, error: serde_json::Error },
    #[error("{}: holds a {found} model, but {CONFIG_FILE} says {expected}; the files are from different runs", path.display())]
    OtherModel {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("{}: names {name:?}, which is not a record file of this run directory", path.display())]
    ForeignFile { path: PathBuf, name: String },
    #[error("{}: the checkpoint has no optimizer state (imported weights?); it can be evaluated, not resumed", .0.display())]
    NoOptimizer(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_owned(),
        error: source,
    }
}

/// Held while a process trains in a run directory; see [`RunDir::lock`].
#[derive(Debug)]
pub struct RunLock {
    _file: fs::File,
    path: PathBuf,
}

impl RunLock {
    /// Releases the lock and removes its file (for a run directory about to be removed).
    pub fn remove(self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Whether `name` is what a run killed while starting leaves: its lock, or `write_atomic`'s
/// temporary file of `config.json` (`config.json.<pid>.tmp`).
fn left_by_a_start(name: &str) -> bool {
    let config_tmp = name
        .strip_prefix(CONFIG_FILE)
        .and_then(|rest| rest.strip_prefix('.'))
        .and_then(|rest| rest.strip_suffix(".tmp"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
    name == LOCK_FILE || config_tmp
}

/// A run's directory.
#[derive(Clone, Debug)]
pub struct RunDir {
    pub path: PathBuf,
}

impl RunDir {
    /// Creates `path`, which must not exist or be empty. What a run killed before its config
    /// was written leaves counts as empty: `.lock`, and a temporary `config.json.<pid>.tmp` of a
    /// run killed while writing it ([`RunDir::lock`] removes that, and still refuses a directory
    /// that another process holds).
    pub fn create(path: PathBuf) -> Result<Self, CheckpointError> {
        if path.exists() {
            let empty = fs::read_dir(&path)
                .map_err(io(&path))?
                .all(|e| e.is_ok_and(|e| left_by_a_start(&e.file_name().to_string_lossy())));
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

    /// Takes the run directory for this process until the returned guard is dropped: a second
    /// `ember train` on the same directory (two resumes, or two fresh runs racing) is refused
    /// instead of interleaving checkpoints. An advisory `flock` on `.lock`, released by the
    /// kernel when the process ends, however it ends.
    pub fn lock(&self) -> Result<RunLock, CheckpointError> {
        let path = self.file(LOCK_FILE);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        // An exclusive advisory lock (flock on Unix), released by the kernel with the file.
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(CheckpointError::Busy(self.path.clone())),
            Err(fs::TryLockError::Error(error)) => return Err(CheckpointError::Io { path, error }),
        }
        self.remove_leftovers();
        Ok(RunLock { _file: file, path })
    }

    /// What a process killed while checkpointing (SIGKILL, power loss) leaves behind and no
    /// checkpoint names: temporary files of `write_atomic`, and records written before the
    /// `state.json` that would have named them (all records, where a run was killed in its
    /// first checkpoint and there is no state.json). Called with the lock held, so no other
    /// process is writing them. When state.json exists but cannot be read, records are left alone.
    fn remove_leftovers(&self) {
        let none_committed = !self.file(STATE_FILE).exists();
        let state = self.load_state().ok();
        let Ok(entries) = fs::read_dir(&self.path) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let temporary = name.ends_with(".tmp");
            let record = is_record(&name);
            let orphan = record
                && (none_committed
                    || state.as_ref().is_some_and(|s| {
                        name != s.model_file && s.optimizer_file.as_deref() != Some(name.as_str())
                    }));
            if temporary || orphan {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// An existing run directory, for reading.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        if !path.join(CONFIG_FILE).is_file() {
            return Err(CheckpointError::NotACheckpoint(path.to_owned()));
        }
        Ok(Self {
            path: path.to_owned(),
        })
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn save_config(&self, config: &TrainConfig) -> Result<(), CheckpointError> {
        let json = serde_json::to_vec_pretty(config).expect("configs serialise");
        Ok(write_atomic(&self.file(CONFIG_FILE), &json)?)
    }

    /// The run's `config.json`, its values checked ([`TrainConfig::check_saved`]): an error
    /// names the file and the field.
    pub fn load_config(&self) -> Result<TrainConfig, CheckpointError> {
        let path = self.file(CONFIG_FILE);
        let bytes = fs::read(&path).map_err(io(&path))?;
        let config: TrainConfig =
            serde_json::from_slice(&bytes).map_err(|source| CheckpointError::Config {
                path: path.clone(),
                error: source,
            })?;
        config
            .check_saved()
            .map_err(|error| CheckpointError::ConfigValue { path, error })?;
        Ok(config)
    }

    /// Commits a checkpoint: `model`, the optimizer record bytes (see [`optimizer_bytes`]) and
    /// `progress`; then removes older record files. `state.json` names the model of the run's
    /// `config.json`, where there is one.
    pub fn save_checkpoint<B: Backend, M: Module<B>>(
        &self,
        model: &M,
        optimizer: Option<Vec<u8>>,
        progress: &Progress,
    ) -> Result<(), CheckpointError> {
        let tag = format!("e{:04}-s{:07}", progress.epoch, progress.global_step);
        let bytes = Recorder::<B>::record(&Rec::default(), model.clone().into_record(), ())
            .expect("in-memory records serialise");
        let mut state = TrainState {
            progress: progress.clone(),
            model: self.load_config().ok().map(|c| c.model.name().to_string()),
            model_file: format!("model-{tag}.mpk"),
            optimizer_file: None,
            model_sha256: Some(sha256_hex(&bytes)),
            optimizer_sha256: None,
        };
        let committed = (|| {
            write_atomic(&self.file(&state.model_file), &bytes)?;
            if let Some(bytes) = optimizer {
                let name = format!("optimizer-{tag}.mpk");
                write_atomic(&self.file(&name), &bytes)?;
                state.optimizer_file = Some(name);
                state.optimizer_sha256 = Some(sha256_hex(&bytes));
            }
            let json = serde_json::to_vec_pretty(&state).expect("states serialise");
            write_atomic(&self.file(STATE_FILE), &json)
        })();
        if let Err(e) = committed {
            // state.json still names the previous checkpoint: this one's records are orphans,
            // unless they have the previous one's names (the same step saved again).
            let previous = self.load_state().ok();
            let named = |name: &str| {
                previous
                    .as_ref()
                    .is_some_and(|p| p.model_file == name || p.optimizer_file.as_deref() == Some(name))
            };
            let orphans = [Some(state.model_file.clone()), state.optimizer_file.clone()];
            for name in orphans.into_iter().flatten().filter(|n| !named(n)) {
                let _ = fs::remove_file(self.file(&name));
            }
            return Err(e.into());
        }
        // The new checkpoint is committed: older records can go.
        crate::faults::point("checkpoint:committed");
        let keep = [Some(state.model_file.as_str()), state.optimizer_file.as_deref()];
        for entry in fs::read_dir(&self.path).map_err(io(&self.path))?.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let record = is_record(&name);
            if record && !keep.contains(&Some(name.as_str())) {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(())
    }

    pub fn load_state(&self) -> Result<TrainState, CheckpointError> {
        let path = self.file(STATE_FILE);
        let bytes = fs::read(&path).map_err(io(&path))?;
        let state: TrainState = serde_json::from_slice(&bytes).map_err(|source| CheckpointError::State {
            path: path.clone(),
            error: source,
        })?;
        // The record files are plain names inside the run directory, as save_checkpoint writes them.
        for (name, prefix) in [
            (Some(&state.model_file), "model-"),
            (state.optimizer_file.as_ref(), "optimizer-"),
        ] {
            let Some(name) = name else { continue };
            let plain = Path::new(name).file_name().is_some_and(|f| f == name.as_str());
            if !(plain && name.starts_with(prefix) && name.ends_with(".mpk")) {
                return Err(CheckpointError::ForeignFile {
                    path,
                    name: name.clone(),
                });
            }
        }
        Ok(state)
    }

    fn load_record<B: Backend, R: burn::record::Record<B>>(
        &self,
        name: &str,
        sha256: Option<&str>,
        device: &B::Device,
    ) -> Result<R, CheckpointError> {
        let path = self.file(name);
        let bytes = fs::read(&path).map_err(io(&path))?;
        if let Some(expected) = sha256 {
            let actual = sha256_hex(&bytes);
            if actual != expected {
                return Err(CheckpointError::Checksum {
                    path,
                    actual,
                    expected: expected.to_string(),
                });
            }
        }
        Recorder::<B>::load(&Rec::default(), bytes, device).map_err(|e| CheckpointError::Record {
            path,
            reason: record_reason(&e.to_string()),
        })
    }

    /// The latest checkpoint's model, built as `config` describes: one of ember's built-in
    /// models ([`RunDir::load_model_of`] for any).
    pub fn load_model<B: Backend>(
        &self,
        config: &TrainConfig,
        device: &B::Device,
    ) -> Result<Model<B>, CheckpointError> {
        self.load_model_of::<B, _>(&builtin(config), config, device)
    }

    /// The latest checkpoint's `model`, built as `config` describes. A checkpoint of another
    /// model than `config.json`'s is an error naming both (burn's `load_record` would panic).
    pub fn load_model_of<B: Backend, D: EmberModel>(
        &self,
        model: &D,
        config: &TrainConfig,
        device: &B::Device,
    ) -> Result<D::Net<B>, CheckpointError> {
        let state = self.load_state()?;
        let path = self.file(&state.model_file);
        let other = |found: String| CheckpointError::OtherModel {
            path: path.clone(),
            found,
            expected: config.model.name().to_string(),
        };
        if let Some(found) = state.model.clone().filter(|m| m != config.model.name()) {
            return Err(other(found));
        }
        let record: <D::Net<B> as Module<B>>::Record =
            self.load_record::<B, _>(&state.model_file, state.model_sha256.as_deref(), device)?;
        if let Some(found) = model
            .record_name::<B>(&record)
            .filter(|m| m != config.model.name())
        {
            return Err(other(found));
        }
        Ok(crate::train::init_unseeded::<B, D>(model, config, device).load_record(record))
    }

    /// The latest checkpoint's built-in model, optimizer and progress, to resume training
    /// ([`RunDir::load_training_of`] for any model).
    pub fn load_training<B: AutodiffBackend>(
        &self,
        config: &TrainConfig,
        device: &B::Device,
    ) -> Result<Resumed<B, Model<B>>, CheckpointError> {
        self.load_training_of::<B, _>(&builtin(config), config, device)
    }

    /// The latest checkpoint's `model`, optimizer and progress, to resume training.
    pub fn load_training_of<B: AutodiffBackend, D: EmberModel>(
        &self,
        model: &D,
        config: &TrainConfig,
        device: &B::Device,
    ) -> Result<Resumed<B, D::Net<B>>, CheckpointError>
    where
        D::Net<B>: Trainable<B>,
    {
        let state = self.load_state()?;
        let name = state
            .optimizer_file
            .clone()
            .ok_or_else(|| CheckpointError::NoOptimizer(self.file(STATE_FILE)))?;
        let model = self.load_model_of::<B, D>(model, config, device)?;
        let record = self.load_record::<B, _>(&name, state.optimizer_sha256.as_deref(), device)?;
        let optim = config.optimizer.init::<B, D::Net<B>>().load_record(record);
        Ok((model, optim, state.progress))
    }
}

/// The built-in model `config` names.
///
/// # Panics
/// When it names none: the `load_*_of` functions take any model.
fn builtin(config: &TrainConfig) -> ModelKind {
    ModelKind::from_name(config.model.name())
        .unwrap_or_else(|| panic!("{} is not one of ember's built-in models", config.model))
}

/// A model or optimizer record file's name, as checkpoints write them.
fn is_record(name: &str) -> bool {
    (name.starts_with("model-") || name.starts_with("optimizer-")) && name.ends_with(".mpk")
}

/// The reason a record did not decode, without the advice burn appends to every tensor
/// decoding error (about records of burn <= 0.16), which misleads for a damaged file.
fn record_reason(text: &str) -> String {
    if text.contains("UnexpectedEof") {
        return "the file ends early: it is truncated".into();
    }
    let advice = ["\\nThe internal data format", "\nThe internal data format"];
    let end = advice
        .iter()
        .filter_map(|a| text.find(a))
        .min()
        .unwrap_or(text.len());
    text[..end].lines().next().unwrap_or_default().trim().to_string()
}

/// What training resumes from: model, optimizer and where they stood.
pub type Resumed<B, M> = (M, Optimizer<M, B>, Progress);

/// The optimizer's state as record bytes, for [`RunDir::save_checkpoint`].
pub fn optimizer_bytes<B: AutodiffBackend, M: Trainable<B>>(optim: &Optimizer<M, B>) -> Vec<u8> {
    Recorder::<B>::record(&Rec::default(), optim.to_record(), ()).expect("in-memory records serialise")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Recipe;
    use crate::train::init_model;
    use burn::backend::NdArray;

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
        run.save_checkpoint(&model, None, &Progress::default()).unwrap();
        let reopened = RunDir::open(&run.path).unwrap();
        let loaded_config = reopened.load_config().unwrap();
        assert_eq!(loaded_config, config);
        let loaded = reopened.load_model::<NdArray>(&loaded_config, &device).unwrap();
        let (Model::Flashlight(a), Model::Flashlight(b)) = (model, loaded) else {
            panic!("wrong model kind")
        };
        a.fc1
            .weight
            .val()
            .into_data()
            .assert_eq(&b.fc1.weight.val().into_data(), true);
        // No temporary files left behind: config, state, model.
        let names: Vec<_> = fs::read_dir(&run.path)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
        // Imported-style checkpoints have no optimizer to resume from.
        let Err(err) = reopened.load_training::<burn::backend::Autodiff<NdArray>>(&loaded_config, &device)
        else {
            panic!("resumed a checkpoint without optimizer state")
        };
        assert!(err.to_string().contains("no optimizer state"), "{err}");
    }

    #[test]
    fn corrupt_files_are_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        let config = Recipe::PytorchExample.config();
        run.save_config(&config).unwrap();
        let model = init_model::<NdArray>(&config, &Default::default());
        run.save_checkpoint(&model, None, &Progress::default()).unwrap();
        let state = run.load_state().unwrap();
        fs::write(run.file(&state.model_file), b"\x93garbage").unwrap();
        let err = run
            .load_model::<NdArray>(&config, &Default::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&state.model_file) && err.contains("corrupt"),
            "{err}"
        );
        fs::write(run.file(STATE_FILE), b"{\"epoch\": -1}").unwrap();
        let err = run
            .load_model::<NdArray>(&config, &Default::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("state.json") && err.contains("invalid checkpoint state"),
            "{err}"
        );
        fs::write(run.file(CONFIG_FILE), b"{\"recipe\": 3}").unwrap();
        let err = run.load_config().unwrap_err().to_string();
        assert!(err.contains("config.json"), "{err}");
        let err = RunDir::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a checkpoint"), "{err}");
    }

    /// config.json of one model and a record of another (a config edited, a record copied in):
    /// burn's load_record panicked on the mismatch.
    #[test]
    fn a_record_of_another_model_is_an_error_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        let device = Default::default();
        let tch = Recipe::Tch.config();
        run.save_checkpoint(&init_model::<NdArray>(&tch, &device), None, &Progress::default())
            .unwrap();
        let flashlight = Recipe::Flashlight.config();
        let err = run
            .load_model::<NdArray>(&flashlight, &device)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("holds a tch-net model, but config.json says flashlight-cnn"),
            "{err}"
        );
    }

    /// state.json names its record files; a name that leads elsewhere is refused, not followed.
    #[test]
    fn record_names_stay_inside_the_run_directory() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        let config = Recipe::Tch.config();
        let device = Default::default();
        run.save_checkpoint(
            &init_model::<NdArray>(&config, &device),
            None,
            &Progress::default(),
        )
        .unwrap();
        let state = fs::read_to_string(run.path.join(STATE_FILE)).unwrap();
        let good: TrainState = serde_json::from_str(&state).unwrap();
        for bad in [
            "../../../../etc/passwd",
            "/etc/passwd",
            "model-x.mpk/../../secret.mpk",
            "config.json",
        ] {
            let edited = state.replace(&good.model_file, bad);
            fs::write(run.path.join(STATE_FILE), edited).unwrap();
            let err = run
                .load_model::<NdArray>(&config, &device)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("not a record file of this run directory") && err.contains(bad),
                "{err}"
            );
        }
    }

    #[test]
    fn one_process_at_a_time_trains_in_a_run_directory() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        let held = run.lock().unwrap();
        let err = run.lock().unwrap_err().to_string();
        assert!(
            err.contains("another ember process is training in this run directory"),
            "{err}"
        );
        drop(held);
        run.lock().unwrap().remove();
        assert!(!run.path.join(LOCK_FILE).exists());
    }

    /// A checkpoint that cannot be committed (the disk is full when state.json is written)
    /// leaves the previous one loadable and none of its own files behind.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_failed_checkpoint_leaves_the_previous_one_and_no_orphans() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        let config = Recipe::Tch.config();
        let device = Default::default();
        let model = init_model::<NdArray>(&config, &device);
        run.save_checkpoint(&model, Some(vec![1, 2, 3]), &Progress::default())
            .unwrap();
        let names = || {
            let mut names: Vec<_> = fs::read_dir(&run.path)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            names
        };
        let before = names();
        // write_atomic's temporary file for state.json, made to fail as on a full disk.
        let tmp = run.file(&format!("state.json.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink("/dev/full", &tmp).unwrap();
        let err = run
            .save_checkpoint(&model, Some(vec![4, 5, 6]), &Progress::at_epoch(1, 10))
            .unwrap_err()
            .to_string();
        assert!(err.contains("No space left on device"), "{err}");
        assert_eq!(names(), before);
        assert_eq!(run.load_state().unwrap().progress, Progress::default());
        run.load_model::<NdArray>(&config, &device).unwrap();
    }

    #[test]
    fn a_truncated_record_is_one_line_without_burns_upgrade_advice() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        let config = Recipe::Tch.config();
        let device = Default::default();
        run.save_checkpoint(
            &init_model::<NdArray>(&config, &device),
            None,
            &Progress::default(),
        )
        .unwrap();
        // A checkpoint from before state.json recorded checksums: the decoder meets the damage.
        let mut state = run.load_state().unwrap();
        state.model_sha256 = None;
        fs::write(run.file(STATE_FILE), serde_json::to_vec(&state).unwrap()).unwrap();
        let file = run.file(&state.model_file);
        let bytes = fs::read(&file).unwrap();
        fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
        let err = run
            .load_model::<NdArray>(&config, &device)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot decode the record (the file ends early: it is truncated)"),
            "{err}"
        );
        assert!(
            !err.contains("record-backward-compat") && err.lines().count() == 1,
            "{err}"
        );
    }

    /// 64 garbled bytes inside a record: eval printed a loss of 1.7e30 and resume went on from
    /// garbage. Both records carry their SHA-256 in state.json.
    #[test]
    fn garbled_records_fail_their_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        let config = Recipe::Tch.config();
        let device = Default::default();
        let model = init_model::<burn::backend::Autodiff<NdArray>>(&config, &device);
        let optim = config
            .optimizer
            .init::<burn::backend::Autodiff<NdArray>, crate::model::Model<burn::backend::Autodiff<NdArray>>>(
            );
        run.save_checkpoint(&model, Some(optimizer_bytes(&optim)), &Progress::default())
            .unwrap();
        let state = run.load_state().unwrap();
        for name in [state.model_file.clone(), state.optimizer_file.clone().unwrap()] {
            let file = run.file(&name);
            let good = fs::read(&file).unwrap();
            let mut bad = good.clone();
            let middle = bad.len() / 2;
            bad[middle..middle + 64].iter_mut().for_each(|b| *b ^= 0x5a);
            fs::write(&file, &bad).unwrap();
            let err = run
                .load_training::<burn::backend::Autodiff<NdArray>>(&config, &device)
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&name) && err.contains("the file is corrupt"),
                "{err}"
            );
            fs::write(&file, &good).unwrap();
        }
        run.load_training::<burn::backend::Autodiff<NdArray>>(&config, &device)
            .unwrap();
    }

    fn sorted_names(run: &RunDir) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&run.path)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        names
    }

    /// A run killed before it wrote config.json leaves only `.lock` (and perhaps config.json's
    /// temporary file): the same `--run-dir` is accepted again, while a directory with anything
    /// else in it is not.
    #[test]
    fn a_lone_lock_file_counts_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        drop(run.lock().unwrap());
        assert!(run.file(LOCK_FILE).exists());
        let again = RunDir::create(run.path.clone()).unwrap();
        // Killed while writing config.json (found by tests/kill9.rs): also a start that left
        // nothing, and the lock's cleanup removes the temporary file.
        fs::write(again.file("config.json.4242.tmp"), b"{\"rec").unwrap();
        let again = RunDir::create(run.path.clone()).unwrap();
        drop(again.lock().unwrap());
        assert_eq!(sorted_names(&again), [LOCK_FILE]);
        for theirs in ["notes.tmp", "config.json.tmp", "config.json.x1.tmp"] {
            fs::write(again.file(theirs), b"mine").unwrap();
            let err = RunDir::create(run.path.clone()).unwrap_err().to_string();
            assert!(err.contains("already exists and is not empty"), "{theirs}: {err}");
            fs::remove_file(again.file(theirs)).unwrap();
        }
        fs::write(again.file("notes.txt"), b"mine").unwrap();
        let err = RunDir::create(run.path.clone()).unwrap_err().to_string();
        assert!(err.contains("already exists and is not empty"), "{err}");
    }

    /// Killed in its first checkpoint, a run has records and no state.json: none is committed.
    #[test]
    fn without_state_json_every_record_is_a_leftover() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        run.save_config(&Recipe::Tch.config()).unwrap();
        for leftover in ["model-e0000-s0000000.mpk", "optimizer-e0000-s0000000.mpk.77.tmp"] {
            fs::write(run.file(leftover), b"x").unwrap();
        }
        let _lock = run.lock().unwrap();
        let names = sorted_names(&run);
        assert_eq!(names, [LOCK_FILE, CONFIG_FILE]);
    }

    /// A process killed in the middle of a checkpoint leaves temporary files and records no
    /// state.json names; the next process to take the run directory removes them.
    #[test]
    fn the_next_lock_removes_what_a_killed_checkpoint_left() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        let config = Recipe::Tch.config();
        let device = Default::default();
        run.save_checkpoint(
            &init_model::<NdArray>(&config, &device),
            Some(vec![1, 2]),
            &Progress::default(),
        )
        .unwrap();
        let state = run.load_state().unwrap();
        for leftover in [
            "state.json.4242.tmp",
            "model-e0001-s0000010.mpk.4242.tmp",
            "model-e0001-s0000010.mpk",
            "optimizer-e0001-s0000010.mpk",
        ] {
            fs::write(run.file(leftover), b"x").unwrap();
        }
        fs::write(run.file("notes.txt"), b"mine").unwrap();
        let _lock = run.lock().unwrap();
        let names = sorted_names(&run);
        let mut want = vec![
            LOCK_FILE.to_string(),
            state.model_file.clone(),
            "notes.txt".to_string(),
            state.optimizer_file.clone().unwrap(),
            STATE_FILE.to_string(),
        ];
        want.sort();
        assert_eq!(names, want);
        run.load_model::<NdArray>(&config, &device).unwrap();
    }
}
