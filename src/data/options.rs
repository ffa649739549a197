//! How a dataset is to be read (`LoadOptions`), what reading it found (`LoadReport`), and the
//! device-memory budget check every reader makes before decoding.

use std::path::PathBuf;

use super::{DataError, ImageShape};

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
    /// The most bytes decoding held at once (estimated from the headers, bounded by what the
    /// memory budget leaves beside the dataset).
    pub decode_peak: u64,
}

impl LoadReport {
    /// One line about decoding, or `None` when nothing was decoded.
    pub fn summary(&self) -> Option<String> {
        if self.decoded == 0 {
            return None;
        }
        let mut line = format!(
            "read {} images in {:.2} s ({:.0} images/s, {} threads, at most {} decoding at once)",
            self.decoded,
            self.decode_seconds,
            self.decoded as f64 / self.decode_seconds.max(1e-9),
            rayon::current_num_threads(),
            crate::memory::bytes(self.decode_peak)
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

/// Device memory of `images` of `shape`: f32 pixels plus an int label each (8 bytes on the CPU
/// backends).
pub fn dataset_bytes(images: usize, shape: ImageShape) -> u64 {
    images as u64 * (shape.len() as u64 * 4 + 8)
}

/// Fails when `images` of `shape` would take more than the budget on the device; returns the
/// bytes they take.
pub(super) fn check_memory(
    dataset: &str,
    images: usize,
    shape: ImageShape,
    options: &LoadOptions,
) -> Result<u64, DataError> {
    let need = dataset_bytes(images, shape);
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
    Ok(need)
}
