//! Datasets: MNIST-format IDX files, CIFAR's binary release and folders of images (one
//! sub-folder per class); locating, downloading, verifying and decoding them, and putting a
//! split on the device once.

pub mod cifar;
mod device;
mod download;
pub mod folder;
pub mod idx;
mod options;
pub mod pixels;
mod spec;

pub use device::{indices, DeviceSplit, Normalization, PerChannel};
pub use options::{dataset_bytes, LoadOptions, LoadReport, DEFAULT_MAX_IMAGE_PIXELS};
pub use spec::{convert, load, DatasetSpec};

use std::fmt;
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Side of every image in the MNIST-format datasets.
pub const IMAGE_SIDE: usize = 28;
/// Pixels per MNIST image.
pub const IMAGE_PIXELS: usize = IMAGE_SIDE * IMAGE_SIDE;
/// Classes in the MNIST-format datasets.
pub const NUM_CLASSES: usize = 10;

/// The shape of one image as the models see it (declared beside the models, which take it).
pub use ember_models::ImageShape;

/// Errors from reading datasets; each names the file or directory at fault.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("{}: the IDX header gives dimensions {found:?}, expected {expected:?}; the file is corrupt or from another dataset", path.display())]
    Dims {
        path: PathBuf,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("{}: magic number {found} (0x{found:08x}), expected {expected} (0x{expected:08x}); not an IDX file of this kind", path.display())]
    BadMagic {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("{}: header {dims:?} needs {expected} bytes of data, the file holds {actual} bytes (truncated or corrupt)", path.display())]
    Length {
        path: PathBuf,
        dims: Vec<usize>,
        expected: usize,
        actual: String,
    },
    #[error("{}: SHA-256 of the decompressed data is {actual}, expected {expected}; the file is corrupt or not {dataset}'s {file}", path.display())]
    Checksum {
        path: PathBuf,
        dataset: String,
        file: &'static str,
        actual: String,
        expected: &'static str,
    },
    #[error("{dataset} files missing in {}: {}; {}", dir.display(), missing.join(", "), hint)]
    Missing {
        dataset: String,
        dir: PathBuf,
        missing: Vec<String>,
        hint: String,
    },
    #[error("{}: {reason} (--skip-bad-images skips such files and counts them)", path.display())]
    BadImage { path: PathBuf, reason: String },
    #[error("interrupted while reading the images; nothing was trained")]
    Interrupted,
    #[error(
        "{dataset}: {images} images of {shape} need {} on the device as f32, above the {} budget \
         (--max-dataset-memory, {budget_source}); lower --image-size, use --channels 1, or raise --max-dataset-memory",
        crate::memory::bytes(*.need), crate::memory::bytes(*.budget)
    )]
    TooLarge {
        dataset: String,
        images: usize,
        shape: ImageShape,
        need: u64,
        budget: u64,
        budget_source: String,
    },
}

/// Fashion-MNIST's class names, label order.
const FASHION: [&str; NUM_CLASSES] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// The MNIST-format datasets ember knows: same format, same sizes, different pictures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dataset {
    /// LeCun, Cortes and Burges' handwritten digits.
    Mnist,
    /// Zalando's clothing images in MNIST's format.
    FashionMnist,
}

impl fmt::Display for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One of the four files of a dataset.
#[derive(Clone, Copy, Debug)]
pub struct FileSpec {
    /// File name without `.gz`.
    pub name: &'static str,
    /// SHA-256 of the decompressed file.
    pub sha256: &'static str,
    pub magic: u32,
    /// The IDX dimensions: checked in the header, before any payload is read, so that a file
    /// claiming more never costs more memory than the real one.
    pub dims: &'static [usize],
}

impl FileSpec {
    /// Bytes of the decompressed file: header and payload.
    pub fn decompressed_len(&self) -> usize {
        4 + 4 * self.dims.len() + self.dims.iter().product::<usize>()
    }
}

impl Dataset {
    pub fn name(self) -> &'static str {
        match self {
            Dataset::Mnist => "mnist",
            Dataset::FashionMnist => "fashion-mnist",
        }
    }

    /// `[train images, train labels, test images, test labels]`, with the SHA-256 of each
    /// decompressed file (the sums in `../shared/data/*/SHA256SUMS`).
    pub fn files(self) -> [FileSpec; 4] {
        let sums = match self {
            Dataset::Mnist => [
                "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
                "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
                "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
                "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
            ],
            Dataset::FashionMnist => [
                "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
                "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
                "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
                "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
            ],
        };
        const SIDE: usize = IMAGE_SIDE;
        let names: [(&str, u32, &'static [usize]); 4] = [
            (
                "train-images-idx3-ubyte",
                idx::IMAGES_MAGIC,
                &[60_000, SIDE, SIDE],
            ),
            ("train-labels-idx1-ubyte", idx::LABELS_MAGIC, &[60_000]),
            ("t10k-images-idx3-ubyte", idx::IMAGES_MAGIC, &[10_000, SIDE, SIDE]),
            ("t10k-labels-idx1-ubyte", idx::LABELS_MAGIC, &[10_000]),
        ];
        std::array::from_fn(|i| FileSpec {
            name: names[i].0,
            magic: names[i].1,
            dims: names[i].2,
            sha256: sums[i],
        })
    }

    /// Mirrors tried in order for `<name>.gz`.
    pub fn mirrors(self) -> &'static [&'static str] {
        match self {
            // torchvision's list: its S3 copy first, LeCun's page second.
            Dataset::Mnist => &[
                "https://ossci-datasets.s3.amazonaws.com/mnist/",
                "http://yann.lecun.com/exdb/mnist/",
            ],
            Dataset::FashionMnist => &["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"],
        }
    }

    /// A class's plain name: the digit for MNIST, the garment for Fashion-MNIST.
    pub fn label(self, class: usize) -> String {
        match self {
            Dataset::Mnist => class.to_string(),
            Dataset::FashionMnist => FASHION.get(class).map_or(class.to_string(), |n| n.to_string()),
        }
    }

    /// A class's name as `ember predict` prints it: the digit for MNIST, "3 (Dress)" for
    /// Fashion-MNIST.
    pub fn class_name(self, class: usize) -> String {
        match self {
            Dataset::Mnist => class.to_string(),
            Dataset::FashionMnist => FASHION
                .get(class)
                .map_or(class.to_string(), |n| format!("{class} ({n})")),
        }
    }

    /// The default data directory: `data/<name>`.
    /// Where its files are looked for (and downloaded to) without `--data-dir`; see
    /// [`default_data_dir`].
    pub fn default_dir(self) -> PathBuf {
        default_data_dir(self.name(), |dir| {
            self.files()
                .iter()
                .all(|f| dir.join(f.name).is_file() || dir.join(format!("{}.gz", f.name)).is_file())
        })
    }
}

/// The folder of dataset `name` without `--data-dir`: `data/<name>` in the working folder when
/// it exists (a clone of ember); else the `data/<name>` of the source tree this binary was built
/// from when it holds the dataset (`complete`): an `ember` installed with `cargo install --path .`
/// finds the committed MNIST from any folder; else the user's data folder,
/// `$XDG_DATA_HOME/ember/<name>` or `~/.local/share/ember/<name>`, where downloads go (never an
/// empty `data/` in whatever folder ember was started from).
pub fn default_data_dir(name: &str, complete: impl Fn(&Path) -> bool) -> PathBuf {
    let local = Path::new("data").join(name);
    if local.is_dir() {
        return local;
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("data").join(name);
    if complete(&built) {
        return built;
    }
    let user = std::env::var_os("XDG_DATA_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")));
    user.map_or(local, |d| d.join("ember").join(name))
}

/// Images and labels of one split, on the host, as stored: `u8` pixels, each image
/// channel-major then row-major (`[channels, height, width]`, as a tensor wants them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub images: Vec<u8>,
    pub labels: Vec<u16>,
    pub shape: ImageShape,
}

impl Split {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Splits off the first `n` examples: `(first n, rest)`. flashlight's recipe validates on
    /// the first 5,000 training images.
    pub fn split_at(mut self, n: usize) -> (Split, Split) {
        let n = n.min(self.len());
        let rest = Split {
            images: self.images.split_off(n * self.shape.len()),
            labels: self.labels.split_off(n),
            shape: self.shape,
        };
        (self, rest)
    }

    /// A copy of the first `n` examples (all of them if fewer), in allocations of their own:
    /// unlike [`Self::truncate`], dropping `self` then gives the rest's memory back.
    pub fn first(&self, n: usize) -> Split {
        let n = n.min(self.len());
        Split {
            images: self.images[..n * self.shape.len()].to_vec(),
            labels: self.labels[..n].to_vec(),
            shape: self.shape,
        }
    }

    /// Keeps the first `n` examples.
    pub fn truncate(&mut self, n: usize) {
        self.images.truncate(n * self.shape.len());
        self.labels.truncate(n);
    }

    /// Image `i`'s pixels.
    pub fn image(&self, i: usize) -> &[u8] {
        let n = self.shape.len();
        &self.images[i * n..(i + 1) * n]
    }
}

/// A dataset's train and test splits and its class names (index = label).
#[derive(Clone, Debug)]
pub struct Data {
    pub train: Split,
    pub test: Split,
    pub classes: Vec<String>,
    /// How the data was read: decode time, skipped files, resizing.
    pub report: LoadReport,
}

/// How to find a dataset's files.
#[derive(Clone, Debug)]
pub struct Source {
    pub dataset: Dataset,
    pub dir: PathBuf,
    /// Download missing files from the mirrors; when false, a missing file is an error.
    pub download: bool,
}

/// In-memory data that cannot make a [`Data`].
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MemoryDataError {
    #[error("the {split} split has {images} bytes of images, which is not {labels} labels of {shape} images ({expected} bytes)")]
    Length {
        split: &'static str,
        images: usize,
        labels: usize,
        shape: ImageShape,
        expected: usize,
    },
    #[error("the {split} split's label {label} (image {index}) is not below the {classes} class names")]
    Label {
        split: &'static str,
        label: u16,
        index: usize,
        classes: usize,
    },
    #[error("the images' shape {0} has a zero side or channels other than 1 or 3")]
    Shape(ImageShape),
    #[error("the training split is empty")]
    Empty,
}

impl Data {
    /// A user's own images: `u8` pixels channel-major (`[n, channels, height, width]` in a flat
    /// vector, as MNIST's IDX files and PyTorch's `ToTensor` order them), one label per image,
    /// below `classes.len()`. ember normalises them per channel and keeps them on the device as
    /// it does MNIST.
    pub fn from_memory(
        train: (Vec<u8>, Vec<u16>),
        test: (Vec<u8>, Vec<u16>),
        shape: ImageShape,
        classes: Vec<String>,
    ) -> Result<Self, MemoryDataError> {
        if shape.is_empty() || !matches!(shape.channels, 1 | 3) {
            return Err(MemoryDataError::Shape(shape));
        }
        let mut splits = Vec::with_capacity(2);
        for (split, (images, labels)) in [("train", train), ("test", test)] {
            let expected = labels.len() * shape.len();
            if images.len() != expected {
                return Err(MemoryDataError::Length {
                    split,
                    images: images.len(),
                    labels: labels.len(),
                    shape,
                    expected,
                });
            }
            if let Some((index, &label)) = labels
                .iter()
                .enumerate()
                .find(|(_, &l)| l as usize >= classes.len())
            {
                return Err(MemoryDataError::Label {
                    split,
                    label,
                    index,
                    classes: classes.len(),
                });
            }
            splits.push(Split {
                images,
                labels,
                shape,
            });
        }
        let test = splits.pop().expect("two splits");
        let train = splits.pop().expect("two splits");
        if train.is_empty() {
            return Err(MemoryDataError::Empty);
        }
        Ok(Self {
            train,
            test,
            classes,
            report: LoadReport::default(),
        })
    }

    /// Loads an MNIST-format dataset's both splits from `source.dir`, downloading missing files first when allowed.
    /// Each file is `<name>.gz` or `<name>`; its decompressed bytes must match the known SHA-256.
    pub fn load(source: &Source) -> Result<Data, DataError> {
        let paths = locate(source)?;
        let files = source.dataset.files();
        let mut parts = Vec::with_capacity(4);
        for (path, spec) in paths.iter().zip(files) {
            let parsed = idx::read_expecting(path, spec.magic, spec.dims)?;
            verify(path, source.dataset, &spec, &parsed)?;
            parts.push((path, parsed));
        }
        let mut parts = parts.into_iter();
        let mut split = || -> Result<Split, DataError> {
            let (images_path, images) = parts.next().expect("four files");
            let (labels_path, labels) = parts.next().expect("four files");
            check_split(images_path, &images, labels_path, &labels)?;
            Ok(Split {
                images: images.data,
                labels: labels.data.iter().map(|&l| u16::from(l)).collect(),
                shape: ImageShape::MNIST,
            })
        };
        Ok(Data {
            train: split()?,
            test: split()?,
            classes: (0..NUM_CLASSES)
                .map(|c| source.dataset.label(c).to_string())
                .collect(),
            report: LoadReport::default(),
        })
    }
}

/// Paths of the four files in `source.dir`, downloading the missing ones when allowed.
fn locate(source: &Source) -> Result<[PathBuf; 4], DataError> {
    if source.dir.exists() && !source.dir.is_dir() {
        return Err(DataError::Invalid {
            path: source.dir.clone(),
            reason: format!(
                "a file, not a folder; point --data-dir (or EMBER_DATA_DIR) at the folder that holds {}'s files",
                source.dataset
            ),
        });
    }
    let files = source.dataset.files();
    let find = |spec: &FileSpec| {
        [format!("{}.gz", spec.name), spec.name.to_string()]
            .into_iter()
            .map(|n| source.dir.join(n))
            .find(|p| p.is_file())
    };
    let missing: Vec<&FileSpec> = files.iter().filter(|s| find(s).is_none()).collect();
    if !missing.is_empty() {
        let names = missing.iter().map(|s| format!("{}.gz", s.name)).collect();
        let failure = if source.download {
            match download::fetch(source.dataset, &source.dir, &missing) {
                Ok(()) => None,
                Err(reason) => Some(format!("download failed: {reason}")),
            }
        } else {
            Some("downloads are off (--offline)".to_string())
        };
        if let Some(failure) = failure {
            return Err(DataError::Missing {
                dataset: source.dataset.to_string(),
                dir: source.dir.clone(),
                missing: names,
                hint: format!(
                    "{failure}; put those files (from {}) there, or point --data-dir (or EMBER_DATA_DIR) at a folder that has them",
                    source.dataset.mirrors()[0],
                ),
            });
        }
    }
    Ok(std::array::from_fn(|i| {
        find(&files[i]).expect("present or just downloaded")
    }))
}

fn verify(path: &Path, dataset: Dataset, spec: &FileSpec, parsed: &idx::Idx) -> Result<(), DataError> {
    // The sums cover the whole decompressed file, header included.
    let magic = spec.magic;
    let mut hasher = Sha256::new();
    hasher.update(magic.to_be_bytes());
    for &d in &parsed.dims {
        hasher.update((d as u32).to_be_bytes());
    }
    hasher.update(&parsed.data);
    let actual = hex(&hasher.finalize());
    if actual != spec.sha256 {
        return Err(DataError::Checksum {
            path: path.to_owned(),
            dataset: dataset.to_string(),
            file: spec.name,
            actual,
            expected: spec.sha256,
        });
    }
    Ok(())
}

fn check_split(
    images_path: &Path,
    images: &idx::Idx,
    labels_path: &Path,
    labels: &idx::Idx,
) -> Result<(), DataError> {
    if images.dims[1..] != [IMAGE_SIDE, IMAGE_SIDE] {
        return Err(DataError::Invalid {
            path: images_path.to_owned(),
            reason: format!(
                "images are {}x{}, expected {IMAGE_SIDE}x{IMAGE_SIDE}",
                images.dims[1], images.dims[2]
            ),
        });
    }
    if images.dims[0] != labels.dims[0] {
        return Err(DataError::Invalid {
            path: labels_path.to_owned(),
            reason: format!(
                "{} labels for {} images in {}",
                labels.dims[0],
                images.dims[0],
                images_path.display()
            ),
        });
    }
    if let Some((i, &l)) = labels
        .data
        .iter()
        .enumerate()
        .find(|(_, &l)| l as usize >= NUM_CLASSES)
    {
        return Err(DataError::Invalid {
            path: labels_path.to_owned(),
            reason: format!("label {l} at index {i} is not a class 0..{NUM_CLASSES}"),
        });
    }
    Ok(())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn without_a_local_folder_data_is_found_in_the_source_tree_then_the_users_folder() {
        let built = default_data_dir("no-such-dataset", |_| true);
        assert_eq!(
            built,
            Path::new(env!("CARGO_MANIFEST_DIR")).join("data/no-such-dataset")
        );
        let user = default_data_dir("no-such-dataset", |_| false);
        assert!(
            user.ends_with("ember/no-such-dataset") || user == Path::new("data/no-such-dataset"),
            "{user:?}"
        );
        // A clone's own data/ folder comes first (cargo runs tests in the package's folder).
        assert_eq!(default_data_dir("mnist", |_| false), Path::new("data/mnist"));
    }

    /// The repository's own MNIST (`data/mnist`, committed), so a plain clone tests offline.
    pub fn repo_mnist() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist")
    }

    fn write_gz(path: &Path, bytes: &[u8]) {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(bytes).unwrap();
        std::fs::write(path, gz.finish().unwrap()).unwrap();
    }

    #[test]
    fn loads_real_mnist_with_known_sums() {
        let data = Data::load(&Source {
            dataset: Dataset::Mnist,
            dir: repo_mnist(),
            download: false,
        })
        .unwrap();
        assert_eq!((data.train.len(), data.test.len()), (60_000, 10_000));
        assert_eq!(data.train.images.len(), 60_000 * IMAGE_PIXELS);
        // First labels of the training set: 5 0 4 1 9 (LeCun's page, torchvision).
        assert_eq!(&data.train.labels[..5], &[5, 0, 4, 1, 9]);
        assert_eq!(&data.test.labels[..3], &[7, 2, 1]);
    }

    #[test]
    fn checksum_mismatch_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for spec in Dataset::Mnist.files() {
            std::fs::copy(
                repo_mnist().join(format!("{}.gz", spec.name)),
                dir.path().join(format!("{}.gz", spec.name)),
            )
            .unwrap();
        }
        // A well-formed file with one flipped label: parses, but is not MNIST.
        let labels = dir.path().join("t10k-labels-idx1-ubyte.gz");
        let mut parsed = idx::read(&labels, idx::LABELS_MAGIC).unwrap();
        parsed.data[0] = (parsed.data[0] + 1) % 10;
        write_gz(
            &labels,
            &idx::encode(idx::LABELS_MAGIC, &parsed.dims, &parsed.data),
        );
        let err = Data::load(&Source {
            dataset: Dataset::Mnist,
            dir: dir.path().to_owned(),
            download: false,
        })
        .unwrap_err();
        assert!(matches!(err, DataError::Checksum { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("t10k-labels-idx1-ubyte.gz") && msg.contains("ff7bcfd4"),
            "{msg}"
        );
    }

    #[test]
    fn missing_files_offline_are_listed_with_where_to_put_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            repo_mnist().join("t10k-labels-idx1-ubyte.gz"),
            dir.path().join("t10k-labels-idx1-ubyte.gz"),
        )
        .unwrap();
        let err = Data::load(&Source {
            dataset: Dataset::Mnist,
            dir: dir.path().to_owned(),
            download: false,
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz"),
            "{msg}"
        );
        assert!(!msg.contains("t10k-labels"), "{msg}");
        assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
        assert!(msg.contains("--data-dir"), "{msg}");
    }

    #[test]
    fn raw_files_are_found_too() {
        let dir = tempfile::tempdir().unwrap();
        let labels = repo_mnist().join("t10k-labels-idx1-ubyte.gz");
        let parsed = idx::read(&labels, idx::LABELS_MAGIC).unwrap();
        std::fs::write(
            dir.path().join("t10k-labels-idx1-ubyte"),
            idx::encode(idx::LABELS_MAGIC, &parsed.dims, &parsed.data),
        )
        .unwrap();
        let found = locate(&Source {
            dataset: Dataset::Mnist,
            dir: dir.path().to_owned(),
            download: false,
        });
        // The three others are missing, but the raw one was not reported.
        let msg = found.unwrap_err().to_string();
        assert!(!msg.contains("t10k-labels"), "{msg}");
    }

    #[test]
    fn split_at_keeps_order() {
        let s = Split {
            images: (0..3 * IMAGE_PIXELS).map(|i| (i / IMAGE_PIXELS) as u8).collect(),
            labels: vec![0, 1, 2],
            shape: ImageShape::MNIST,
        };
        let (a, b) = s.split_at(1);
        assert_eq!((a.labels, b.labels), (vec![0], vec![1, 2]));
        assert_eq!(b.images[0], 1);
    }
}
