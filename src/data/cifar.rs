//! CIFAR-10 and CIFAR-100 in their standard binary release (Krizhevsky's `*-binary.tar.gz`):
//! records of a label byte (CIFAR-100: coarse then fine) and 3,072 pixel bytes, 1,024 per
//! channel R, G, B, each row-major 32x32, which is already the layout ember keeps images in.
//!
//! The folder may instead hold burn-dataset's `CifarDataset` layout (`train/` and `test/`
//! folders of PNGs, one sub-folder per class), read as an image folder.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{Data, DataError, ImageShape, LoadReport, Split};

/// The two CIFAR datasets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cifar {
    Ten,
    Hundred,
}

/// One file of the release and the SHA-256 of its bytes.
#[derive(Clone, Copy, Debug)]
pub struct BinFile {
    pub name: &'static str,
    pub sha256: &'static str,
    /// Whether it belongs to the training split.
    pub train: bool,
    pub records: usize,
}

/// The images of either CIFAR: 3x32x32.
const SHAPE: ImageShape = ImageShape {
    channels: 3,
    height: 32,
    width: 32,
};

impl Cifar {
    pub fn name(self) -> &'static str {
        match self {
            Self::Ten => "cifar10",
            Self::Hundred => "cifar100",
        }
    }

    pub fn shape(self) -> ImageShape {
        SHAPE
    }

    /// The folder the archive unpacks into.
    pub fn folder(self) -> &'static str {
        match self {
            Self::Ten => "cifar-10-batches-bin",
            Self::Hundred => "cifar-100-binary",
        }
    }

    pub fn url(self) -> &'static str {
        match self {
            Self::Ten => "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
            Self::Hundred => "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
        }
    }

    /// SHA-256 of the archive (170,052,171 bytes for CIFAR-10); the same sums are published by
    /// MLDatasets.jl and torchvision-ruby.
    fn archive_sha256(self) -> &'static str {
        match self {
            Self::Ten => "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd",
            Self::Hundred => "58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec",
        }
    }

    /// Bytes per record: label(s) then pixels.
    pub fn record_len(self) -> usize {
        self.label_bytes() + SHAPE.len()
    }

    fn label_bytes(self) -> usize {
        match self {
            Self::Ten => 1,
            Self::Hundred => 2,
        }
    }

    /// The release's files, with the SHA-256 of each as unpacked (as torchvision-ruby lists them).
    pub fn files(self) -> &'static [BinFile] {
        const fn f(name: &'static str, sha256: &'static str, train: bool, records: usize) -> BinFile {
            BinFile {
                name,
                sha256,
                train,
                records,
            }
        }
        const TEN: [BinFile; 6] = [
            f(
                "data_batch_1.bin",
                "cee916563c9f80d84e3cc88e17fdc0941787f1244f00a67874d45b261883ada5",
                true,
                10_000,
            ),
            f(
                "data_batch_2.bin",
                "a591ca11fa1708a91ee40f54b3da4784ccd871ecf2137de63f51ada8b3fa57ed",
                true,
                10_000,
            ),
            f(
                "data_batch_3.bin",
                "bbe8596564c0f86427f876058170b84dac6670ddf06d79402899d93ceea26f67",
                true,
                10_000,
            ),
            f(
                "data_batch_4.bin",
                "014e562d6e23c72197cc727519169a60359f5eccd8945ad5a09d710285ff4e48",
                true,
                10_000,
            ),
            f(
                "data_batch_5.bin",
                "755304fc0b379caeae8c14f0dac912fbc7d6cd469eb67a1029a08a39453a9add",
                true,
                10_000,
            ),
            f(
                "test_batch.bin",
                "8e2eb146ae340b09e24670f29cabc6326dba54da8789dab6768acf480273f65b",
                false,
                10_000,
            ),
        ];
        const HUNDRED: [BinFile; 2] = [
            f(
                "train.bin",
                "f31298fc616915fa142368359df1c4ca2ae984d6915ca468b998a5ec6aeebf29",
                true,
                50_000,
            ),
            f(
                "test.bin",
                "d8b1e6b7b3bee4020055f0699b111f60b1af1e262aeb93a0b659061746f8224a",
                false,
                10_000,
            ),
        ];
        match self {
            Self::Ten => &TEN,
            Self::Hundred => &HUNDRED,
        }
    }

    /// Class names in label order (CIFAR-100: the fine labels).
    pub fn classes(self) -> Vec<String> {
        let names: &[&str] = match self {
            Self::Ten => &[
                "airplane",
                "automobile",
                "bird",
                "cat",
                "deer",
                "dog",
                "frog",
                "horse",
                "ship",
                "truck",
            ],
            Self::Hundred => &[
                "apple",
                "aquarium_fish",
                "baby",
                "bear",
                "beaver",
                "bed",
                "bee",
                "beetle",
                "bicycle",
                "bottle",
                "bowl",
                "boy",
                "bridge",
                "bus",
                "butterfly",
                "camel",
                "can",
                "castle",
                "caterpillar",
                "cattle",
                "chair",
                "chimpanzee",
                "clock",
                "cloud",
                "cockroach",
                "couch",
                "crab",
                "crocodile",
                "cup",
                "dinosaur",
                "dolphin",
                "elephant",
                "flatfish",
                "forest",
                "fox",
                "girl",
                "hamster",
                "house",
                "kangaroo",
                "keyboard",
                "lamp",
                "lawn_mower",
                "leopard",
                "lion",
                "lizard",
                "lobster",
                "man",
                "maple_tree",
                "motorcycle",
                "mountain",
                "mouse",
                "mushroom",
                "oak_tree",
                "orange",
                "orchid",
                "otter",
                "palm_tree",
                "pear",
                "pickup_truck",
                "pine_tree",
                "plain",
                "plate",
                "poppy",
                "porcupine",
                "possum",
                "rabbit",
                "raccoon",
                "ray",
                "road",
                "rocket",
                "rose",
                "sea",
                "seal",
                "shark",
                "shrew",
                "skunk",
                "skyscraper",
                "snail",
                "snake",
                "spider",
                "squirrel",
                "streetcar",
                "sunflower",
                "sweet_pepper",
                "table",
                "tank",
                "telephone",
                "television",
                "tiger",
                "tractor",
                "train",
                "trout",
                "tulip",
                "turtle",
                "wardrobe",
                "whale",
                "willow_tree",
                "wolf",
                "woman",
                "worm",
            ],
        };
        names.iter().map(|s| s.to_string()).collect()
    }
}

/// Where a CIFAR dataset was found.
pub enum Found {
    /// The binary files, in [`Cifar::files`] order.
    Binary(Vec<PathBuf>),
    /// burn-dataset's layout: a folder with `train/` and `test/`.
    Folders(PathBuf),
}

/// Whether burn-dataset's layout at `root` has a class folder for each of CIFAR's classes in
/// `train/` and no other: read as an image folder, a missing class would renumber the labels
/// after it (CIFAR's numbering is fixed) and the model would have fewer outputs.
pub fn check_class_folders(kind: Cifar, root: &Path) -> Result<(), DataError> {
    let classes = kind.classes();
    let train = root.join("train");
    // The class folders as an image folder reads them.
    let found = super::folder::class_names(&train)?;
    let missing: Vec<&str> = classes
        .iter()
        .filter(|c| !found.contains(c))
        .map(String::as_str)
        .collect();
    let other: Vec<&str> = found
        .iter()
        .filter(|f| !classes.contains(f))
        .map(String::as_str)
        .collect();
    if missing.is_empty() && other.is_empty() {
        return Ok(());
    }
    let few = |names: &[&str]| {
        let more = if names.len() > 5 { ", ..." } else { "" };
        format!("{}{more}", names[..names.len().min(5)].join(", "))
    };
    let mut reason = format!(
        "{} of {}'s {} class folders",
        classes.len() - missing.len(),
        kind.name(),
        classes.len()
    );
    if !missing.is_empty() {
        reason += &format!(", without {}", few(&missing));
    }
    if !other.is_empty() {
        reason += &format!(", and {} that is not one of its classes", few(&other));
    }
    reason +=
        ": CIFAR's labels are fixed, so every class is needed (train on a subset with --dataset folder:PATH)";
    Err(DataError::Invalid { path: train, reason })
}

/// Finds the binary files in `dir` or `dir/<release folder>`, or burn-dataset's folders;
/// downloads the release when neither is there and `download` allows.
pub fn locate(kind: Cifar, dir: &Path, download: bool) -> Result<Found, DataError> {
    let find = |f: &BinFile| {
        [dir.join(kind.folder()).join(f.name), dir.join(f.name)]
            .into_iter()
            .find(|p| p.is_file())
    };
    let all = || kind.files().iter().map(find).collect::<Option<Vec<_>>>();
    if let Some(paths) = all() {
        return Ok(Found::Binary(paths));
    }
    if dir.join("train").is_dir() && dir.join("test").is_dir() {
        return Ok(Found::Folders(dir.to_owned()));
    }
    let failure = if download {
        match fetch(kind, dir) {
            Ok(()) => None,
            Err(reason) => Some(format!("download failed: {reason}")),
        }
    } else {
        Some("downloads are off (--offline)".to_string())
    };
    if let Some(failure) = failure {
        let missing = kind
            .files()
            .iter()
            .filter(|f| find(f).is_none())
            .map(|f| format!("{}/{}", kind.folder(), f.name))
            .collect();
        return Err(DataError::Missing {
            dataset: kind.name().into(),
            dir: dir.to_owned(),
            missing,
            hint: format!(
                "{failure}; unpack {} there (it makes {}/), or point --data-dir (or EMBER_DATA_DIR) at a folder that has them",
                kind.url(),
                kind.folder()
            ),
        });
    }
    all().map(Found::Binary).ok_or_else(|| DataError::Invalid {
        path: dir.join(kind.folder()),
        reason: "the downloaded archive did not hold every file of the release".into(),
    })
}

/// Reads the files at `paths` (in [`Cifar::files`] order); `verify` checks each file's SHA-256
/// against the release's.
pub fn load(kind: Cifar, paths: &[PathBuf], verify: bool) -> Result<Data, DataError> {
    let mut train = Split {
        images: Vec::new(),
        labels: Vec::new(),
        shape: SHAPE,
    };
    let mut test = train.clone();
    for (path, file) in paths.iter().zip(kind.files()) {
        let split = if file.train { &mut train } else { &mut test };
        read_file(kind, path, file, verify, split)?;
    }
    Ok(Data {
        train,
        test,
        classes: kind.classes(),
        report: LoadReport::default(),
    })
}

fn read_file(
    kind: Cifar,
    path: &Path,
    file: &BinFile,
    verify: bool,
    split: &mut Split,
) -> Result<(), DataError> {
    let io = |error| DataError::Io {
        path: path.to_owned(),
        error,
    };
    let expected = file.records * kind.record_len();
    // The size first: a file of another length is never read into memory.
    let actual = std::fs::metadata(path).map_err(io)?.len();
    if actual != expected as u64 {
        return Err(DataError::Invalid {
            path: path.to_owned(),
            reason: format!(
                "{actual} bytes, expected {expected} ({} records of {} bytes); truncated or not {}'s {}",
                file.records,
                kind.record_len(),
                kind.name(),
                file.name
            ),
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    if verify {
        let sum = super::hex(&Sha256::digest(&bytes));
        if sum != file.sha256 {
            return Err(DataError::Checksum {
                path: path.to_owned(),
                dataset: kind.name().into(),
                file: file.name,
                actual: sum,
                expected: file.sha256,
            });
        }
    }
    let classes = kind.classes().len();
    split.images.reserve(file.records * SHAPE.len());
    for (i, record) in bytes.chunks_exact(kind.record_len()).enumerate() {
        let label = record[kind.label_bytes() - 1];
        if usize::from(label) >= classes {
            return Err(DataError::Invalid {
                path: path.to_owned(),
                reason: format!("record {i} has label {label}, not a class 0..{classes}"),
            });
        }
        split.labels.push(u16::from(label));
        split.images.extend_from_slice(&record[kind.label_bytes()..]);
    }
    Ok(())
}

/// Downloads the release into `dir`, checks the archive's SHA-256, and unpacks its files into
/// `dir/<release folder>/`.
fn fetch(kind: Cifar, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let agent = super::download::agent(Duration::from_secs(1800));
    let url = kind.url();
    eprintln!("downloading {url}");
    let archive = dir.join(format!("{}.tar.gz.part", kind.name()));
    // Both archives are about 170 MB.
    const MAX_BYTES: u64 = 200_000_000;
    let result = (|| {
        super::download::get(&agent, url, &archive, MAX_BYTES).map_err(|e| format!("{url}: {e}"))?;
        let mut hasher = Sha256::new();
        let mut f = std::fs::File::open(&archive).map_err(|e| e.to_string())?;
        std::io::copy(&mut f, &mut hasher).map_err(|e| e.to_string())?;
        let sum = super::hex(&hasher.finalize());
        if sum != kind.archive_sha256() {
            return Err(format!(
                "{url}: SHA-256 {sum}, expected {}; the download is corrupt",
                kind.archive_sha256()
            ));
        }
        let target = dir.join(kind.folder());
        std::fs::create_dir_all(&target).map_err(|e| e.to_string())?;
        let gz = flate2::read::GzDecoder::new(std::fs::File::open(&archive).map_err(|e| e.to_string())?);
        let mut tar = tar::Archive::new(gz);
        for entry in tar.entries().map_err(|e| e.to_string())? {
            let mut entry = entry.map_err(|e| e.to_string())?;
            let path = entry.path().map_err(|e| e.to_string())?.into_owned();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if let Some(file) = kind.files().iter().find(|f| f.name == name) {
                // Only the release's own files, by name, never a path from the archive.
                entry
                    .unpack(target.join(file.name))
                    .map_err(|e| format!("unpacking {name}: {e}"))?;
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&archive);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A release-shaped folder: every file of the real layout and size, synthetic pixels
    /// (each image filled with its index), labels `i % classes`.
    fn synthetic(kind: Cifar, dir: &Path) -> Vec<PathBuf> {
        let folder = dir.join(kind.folder());
        std::fs::create_dir_all(&folder).unwrap();
        let classes = kind.classes().len();
        let mut paths = Vec::new();
        for file in kind.files() {
            let mut bytes = Vec::with_capacity(file.records * kind.record_len());
            for i in 0..file.records {
                if kind == Cifar::Hundred {
                    bytes.push((i % 20) as u8);
                }
                bytes.push((i % classes) as u8);
                bytes.extend(std::iter::repeat_n(i as u8, SHAPE.len()));
            }
            let path = folder.join(file.name);
            std::fs::write(&path, bytes).unwrap();
            paths.push(path);
        }
        paths
    }

    #[test]
    fn the_binary_layout_loads_with_shapes_and_labels() {
        for kind in [Cifar::Ten, Cifar::Hundred] {
            let dir = tempfile::tempdir().unwrap();
            synthetic(kind, dir.path());
            let Found::Binary(paths) = locate(kind, dir.path(), false).unwrap() else {
                panic!("binary files not found")
            };
            let data = load(kind, &paths, false).unwrap();
            let classes = kind.classes().len();
            assert_eq!(classes, if kind == Cifar::Ten { 10 } else { 100 });
            assert_eq!((data.train.len(), data.test.len()), (50_000, 10_000));
            assert_eq!(
                data.train.shape,
                ImageShape {
                    channels: 3,
                    height: 32,
                    width: 32
                }
            );
            assert_eq!(data.train.images.len(), 50_000 * 3072);
            assert_eq!(data.train.labels[..3], [0, 1, 2]);
            // CIFAR-10's second batch starts again at record 0.
            let second = if kind == Cifar::Ten { 10_000 } else { 10_001 };
            assert_eq!(usize::from(data.train.labels[second]), second % 10_000 % classes);
            assert!(data.train.image(7).iter().all(|&p| p == 7));
            assert_eq!(data.classes.len(), classes);
        }
    }

    #[test]
    fn synthetic_files_fail_the_release_checksum_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let paths = synthetic(Cifar::Ten, dir.path());
        let err = load(Cifar::Ten, &paths, true).unwrap_err();
        assert!(matches!(err, DataError::Checksum { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("data_batch_1.bin") && msg.contains("cee91656"),
            "{msg}"
        );
    }

    #[test]
    fn a_truncated_file_or_a_bad_label_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let paths = synthetic(Cifar::Ten, dir.path());
        let mut bytes = std::fs::read(&paths[5]).unwrap();
        bytes[3073] = 10;
        std::fs::write(&paths[5], &bytes).unwrap();
        let msg = load(Cifar::Ten, &paths, false).unwrap_err().to_string();
        assert!(msg.contains("test_batch.bin: record 1 has label 10"), "{msg}");
        bytes.truncate(1000);
        std::fs::write(&paths[5], &bytes).unwrap();
        let msg = load(Cifar::Ten, &paths, false).unwrap_err().to_string();
        assert!(msg.contains("1000 bytes, expected 30730000"), "{msg}");
    }

    #[test]
    fn offline_the_missing_files_and_the_archive_are_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("cifar-10-batches-bin")).unwrap();
        std::fs::write(dir.path().join("cifar-10-batches-bin/test_batch.bin"), b"").unwrap();
        let Err(err) = locate(Cifar::Ten, dir.path(), false) else {
            panic!("found")
        };
        let msg = err.to_string();
        assert!(msg.starts_with("cifar10 files missing in"), "{msg}");
        assert!(msg.contains("cifar-10-batches-bin/data_batch_1.bin"), "{msg}");
        assert!(!msg.contains("test_batch.bin"), "{msg}");
        assert!(
            msg.contains("--offline") && msg.contains("cifar-10-binary.tar.gz"),
            "{msg}"
        );
    }
}
