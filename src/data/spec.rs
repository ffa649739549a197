//! Which dataset a run reads (`--dataset`'s values, saved in `config.json`) and how it is read.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::cifar::Cifar;
use super::{cifar, folder, Data, DataError, Dataset, ImageShape, Source, Split};

/// A dataset: one of the MNIST-format ones, CIFAR-10/100, or a folder of images.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DatasetSpec {
    /// MNIST or Fashion-MNIST (IDX files).
    Idx(Dataset),
    /// CIFAR-10 or CIFAR-100: the binary release, or burn-dataset's `CifarDataset` layout
    /// (`train/` and `test/` folders of PNGs).
    Cifar(Cifar),
    /// One sub-folder per class, as torchvision's `ImageFolder` (or `train/` and `val/`/`test/`
    /// folders of them). Saved as an absolute path, so that `--resume` and `eval` find it again.
    Folder(PathBuf),
}

impl DatasetSpec {
    pub const MNIST: Self = Self::Idx(Dataset::Mnist);
    pub const FASHION_MNIST: Self = Self::Idx(Dataset::FashionMnist);

    /// The accepted spellings, for help and errors.
    pub const VALUES: &'static str = "mnist, fashion-mnist, cifar10, cifar100 or folder:PATH";

    /// The MNIST-format dataset, if it is one.
    pub fn idx(&self) -> Option<Dataset> {
        match self {
            Self::Idx(d) => Some(*d),
            _ => None,
        }
    }

    /// Where its files live unless `--data-dir` says otherwise: `data/<name>`; a folder is its
    /// own path.
    pub fn default_dir(&self) -> PathBuf {
        match self {
            Self::Idx(d) => d.default_dir(),
            Self::Cifar(c) => super::default_data_dir(c.name(), |dir| dir.join(c.folder()).is_dir()),
            Self::Folder(p) => p.clone(),
        }
    }

    /// Whether `--data-dir` means anything for it.
    pub fn uses_data_dir(&self) -> bool {
        !matches!(self, Self::Folder(_))
    }

    /// A folder path made absolute (without resolving links), so that the saved config still
    /// finds it from another working directory.
    pub fn absolute(self) -> Self {
        match self {
            Self::Folder(p) if p.is_relative() => {
                let abs = std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p);
                Self::Folder(abs)
            }
            other => other,
        }
    }
}

impl fmt::Display for DatasetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Idx(d) => f.write_str(d.name()),
            Self::Cifar(c) => f.write_str(c.name()),
            Self::Folder(p) => write!(f, "folder:{}", p.display()),
        }
    }
}

impl FromStr for DatasetSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("folder:") {
            if path.is_empty() {
                return Err("folder: needs a path, e.g. folder:photos".into());
            }
            return Ok(Self::Folder(PathBuf::from(path)));
        }
        match s {
            "mnist" => Ok(Self::MNIST),
            "fashion-mnist" => Ok(Self::FASHION_MNIST),
            "cifar10" => Ok(Self::Cifar(Cifar::Ten)),
            "cifar100" => Ok(Self::Cifar(Cifar::Hundred)),
            _ => Err(format!("unknown dataset '{s}': expected {}", Self::VALUES)),
        }
    }
}

impl TryFrom<String> for DatasetSpec {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<DatasetSpec> for String {
    fn from(d: DatasetSpec) -> String {
        d.to_string()
    }
}

/// How to read a dataset. The shape settings apply to every dataset (MNIST can be read as
/// 3x32x32 for a ResNet); the folder settings to folders only.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// `--data-dir`: the folder with an MNIST-format or CIFAR dataset's files.
    pub dir: Option<PathBuf>,
    /// Download missing files (MNIST, CIFAR); off: a missing file is an error naming it.
    pub download: bool,
    /// `--image-size`, as `[height, width]`. `None`: the images' own size when they all share
    /// one, else `fallback_size`.
    pub image_size: Option<[usize; 2]>,
    /// The recipe's size, for images of mixed sizes.
    pub fallback_size: [usize; 2],
    /// `--channels`: 1 (grey) or 3 (RGB). `None`: 3 when any image has colour, else 1.
    pub channels: Option<usize>,
    /// Fraction of a folder without `test/` or `val/` held out (per class) as its test set.
    pub val_fraction: f64,
    /// Skip unreadable images and count them, instead of stopping at the first.
    pub skip_bad_images: bool,
    /// The most pixels one image may have, checked from its header before decoding.
    pub max_image_pixels: u64,
    /// The most device memory the whole dataset may take, as f32.
    pub max_memory: u64,
    /// Where `max_memory` came from, for its error message.
    pub memory_source: String,
    /// Draw a progress bar while decoding.
    pub progress: bool,
    /// Set (by a Ctrl-C or SIGTERM handler) to stop decoding: the load ends with
    /// [`DataError::Interrupted`](super::DataError::Interrupted).
    pub stop: Option<&'static std::sync::atomic::AtomicBool>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            dir: None,
            download: true,
            image_size: None,
            fallback_size: [super::IMAGE_SIDE, super::IMAGE_SIDE],
            channels: None,
            val_fraction: 0.1,
            skip_bad_images: false,
            max_image_pixels: DEFAULT_MAX_IMAGE_PIXELS,
            max_memory: u64::MAX,
            memory_source: "unlimited".into(),
            progress: false,
            stop: None,
        }
    }
}

/// PIL's default `Image.MAX_IMAGE_PIXELS` (its decompression-bomb guard): a 9,000 x 9,000
/// photo passes.
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 89_478_485;

/// What reading a dataset found, printed before training.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    /// Image files decoded (folders only).
    pub decoded: usize,
    /// Seconds from the start to the decoded images in memory: listing the folders, reading
    /// every header, decoding.
    pub decode_seconds: f64,
    /// Files that could not be read and were skipped (`--skip-bad-images`), with why.
    pub skipped: Vec<(PathBuf, String)>,
    /// Files without an image extension, not read.
    pub ignored: usize,
    /// Images whose size differed from the shape they were resized to.
    pub resized: usize,
    /// The first few of them, with their sizes (width, height).
    pub resized_examples: Vec<(PathBuf, [u32; 2])>,
    /// The size they were resized to (width, height).
    pub resized_to: [usize; 2],
    /// Where the test set came from, e.g. "test/" or "10% of each class".
    pub test_from: String,
}

impl LoadReport {
    /// One line about decoding, or `None` when nothing was decoded.
    pub fn summary(&self) -> Option<String> {
        if self.decoded == 0 {
            return None;
        }
        let mut line = format!(
            "read {} images in {:.2} s ({:.0} images/s, {} threads)",
            self.decoded,
            self.decode_seconds,
            self.decoded as f64 / self.decode_seconds.max(1e-9),
            rayon::current_num_threads()
        );
        if self.resized > 0 {
            let [w, h] = self.resized_to;
            line += &format!(", {} resized to {w}x{h}", self.resized);
            let shown: Vec<String> = self
                .resized_examples
                .iter()
                .map(|(path, [w, h])| format!("{} {w}x{h}", crate::files::shown(path)))
                .collect();
            if !shown.is_empty() {
                let more = if self.resized > shown.len() { ", ..." } else { "" };
                line += &format!(" ({}{more})", shown.join(", "));
            }
        }
        if self.ignored > 0 {
            line += &format!(", {} files without a .png/.jpg/.jpeg name not read", self.ignored);
        }
        if !self.test_from.is_empty() {
            line += &format!("; test set: {}", self.test_from);
        }
        Some(line)
    }

    /// The skipped files, one line, or `None` when there were none.
    pub fn skipped_line(&self) -> Option<String> {
        let (first, why) = self.skipped.first()?;
        Some(format!(
            "skipped {} unreadable image{} (--skip-bad-images), the first: {}: {}",
            self.skipped.len(),
            if self.skipped.len() == 1 { "" } else { "s" },
            crate::files::shown(first),
            crate::files::printable(why)
        ))
    }
}

/// Reads `spec` as `options` say.
pub fn load(spec: &DatasetSpec, options: &LoadOptions) -> Result<Data, DataError> {
    let dir = || options.dir.clone().unwrap_or_else(|| spec.default_dir());
    let data = match spec {
        DatasetSpec::Idx(dataset) => {
            let source = Source {
                dataset: *dataset,
                dir: dir(),
                download: options.download,
            };
            check_memory(
                &spec.to_string(),
                70_000,
                shape_for(super::ImageShape::MNIST, options),
                options,
            )?;
            Data::load(&source)?
        }
        DatasetSpec::Cifar(kind) => match cifar::locate(*kind, &dir(), options.download)? {
            cifar::Found::Binary(paths) => {
                check_memory(
                    &spec.to_string(),
                    60_000,
                    shape_for(kind.shape(), options),
                    options,
                )?;
                cifar::load(*kind, &paths, true)?
            }
            // Its class folders are CIFAR's names, which sort in label order: all of them, or
            // the labels would not be CIFAR's.
            cifar::Found::Folders(root) => {
                cifar::check_class_folders(*kind, &root)?;
                folder::load(&root, &spec.to_string(), options)?
            }
        },
        DatasetSpec::Folder(root) => return folder::load(root, &spec.to_string(), options),
    };
    Ok(reshape(data, options))
}

/// The shape `options` ask of a dataset whose images are `native`.
fn shape_for(native: ImageShape, options: &LoadOptions) -> ImageShape {
    let [height, width] = options.image_size.unwrap_or([native.height, native.width]);
    ImageShape {
        channels: options.channels.unwrap_or(native.channels),
        height,
        width,
    }
}

/// Fails when `images` of `shape` would take more than the budget on the device.
pub(super) fn check_memory(
    dataset: &str,
    images: usize,
    shape: ImageShape,
    options: &LoadOptions,
) -> Result<(), DataError> {
    // f32 pixels plus an int label each (8 bytes on the CPU backends).
    let need = images as u64 * (shape.len() as u64 * 4 + 8);
    if need > options.max_memory {
        return Err(DataError::TooLarge {
            dataset: dataset.to_string(),
            images,
            shape,
            need,
            budget: options.max_memory,
            budget_source: options.memory_source.clone(),
        });
    }
    Ok(())
}

/// Converts both splits to the shape `options` ask for, when it differs.
fn reshape(mut data: Data, options: &LoadOptions) -> Data {
    let target = shape_for(data.train.shape, options);
    if target != data.train.shape {
        data.report.resized = data.train.len() + data.test.len();
        data.report.resized_to = [target.width, target.height];
        data.train = convert(&data.train, target);
        data.test = convert(&data.test, target);
    }
    data
}

/// `split` with every image converted to `target`: grey to RGB by repeating the channel, RGB
/// to grey as luma, resized with a triangle (bilinear) filter.
pub fn convert(split: &Split, target: ImageShape) -> Split {
    use rayon::prelude::*;
    let mut images = vec![0u8; split.len() * target.len()];
    images
        .par_chunks_mut(target.len())
        .enumerate()
        .for_each(|(i, out)| {
            let img = folder::from_chw(split.image(i), split.shape);
            folder::to_chw(&img, target, out);
        });
    Split {
        images,
        labels: split.labels.clone(),
        shape: target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_through_text() {
        for text in [
            "mnist",
            "fashion-mnist",
            "cifar10",
            "cifar100",
            "folder:/data/photos",
        ] {
            let spec: DatasetSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
            let json = serde_json::to_string(&spec).unwrap();
            assert_eq!(serde_json::from_str::<DatasetSpec>(&json).unwrap(), spec);
        }
        let err = "cifar".parse::<DatasetSpec>().unwrap_err();
        assert!(err.contains("folder:PATH"), "{err}");
        assert!("folder:".parse::<DatasetSpec>().is_err());
    }

    /// burn-dataset's layout reads as a folder with CIFAR's own numbering; until issue 25 a
    /// layout with only some classes read as those classes renumbered 0..k (airplane, cat as
    /// 0, 1), which is not CIFAR: it is now refused, naming the missing folders.
    #[test]
    fn burn_datasets_cifar_layout_reads_as_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        let write = |split: &str, class: &str| {
            let path = dir.path().join(split).join(class).join("0.png");
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            image::RgbImage::from_pixel(32, 32, image::Rgb([1, 2, 3]))
                .save(&path)
                .unwrap();
        };
        for split in ["train", "test"] {
            for class in ["cat", "airplane"] {
                write(split, class);
            }
        }
        let options = LoadOptions {
            dir: Some(dir.path().to_owned()),
            download: false,
            ..LoadOptions::default()
        };
        let err = load(&DatasetSpec::Cifar(Cifar::Ten), &options)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2 of cifar10's 10 class folders, without automobile"),
            "{err}"
        );
        for split in ["train", "test"] {
            for class in Cifar::Ten.classes() {
                write(split, &class);
            }
        }
        let data = load(&DatasetSpec::Cifar(Cifar::Ten), &options).unwrap();
        assert_eq!(data.classes, Cifar::Ten.classes());
        assert_eq!(data.train.shape, Cifar::Ten.shape());
        assert_eq!((data.train.len(), data.test.len()), (10, 10));
        assert_eq!(data.train.labels, (0..10).collect::<Vec<u16>>());
    }

    #[test]
    fn mnist_converts_to_other_shapes() {
        let split = Split {
            images: (0..2 * 784).map(|i| (i % 251) as u8).collect(),
            labels: vec![3, 4],
            shape: ImageShape::MNIST,
        };
        let rgb = ImageShape {
            channels: 3,
            height: 28,
            width: 28,
        };
        let out = convert(&split, rgb);
        assert_eq!((out.images.len(), out.labels.clone()), (2 * 3 * 784, vec![3, 4]));
        // Grey to RGB repeats the channel, unresized.
        assert_eq!(&out.image(1)[..784], split.image(1));
        assert_eq!(&out.image(1)[2 * 784..], split.image(1));
        let small = convert(
            &split,
            ImageShape {
                channels: 1,
                height: 14,
                width: 14,
            },
        );
        assert_eq!(small.images.len(), 2 * 196);
    }
}
