//! Folders of images, one sub-folder per class, as torchvision's `ImageFolder` and
//! burn-dataset's `ImageFolderDataset` read them: classes are the sub-folders' names in sorted
//! order (label = position), files are found recursively below each and taken in path order.
//! `ROOT/train/` with `ROOT/test/` (or `ROOT/val/`) gives the test set; otherwise a fraction of
//! each class is held out.
//!
//! burn-dataset's loader is not used for the decoding: it panics on an unreadable file
//! (`image::open(..).unwrap()`), has no size limit, and stores each pixel as an enum (24 bytes
//! for a grey byte). Here every file's header is read first (size, colour), each image is
//! checked against a pixel budget before any pixel is decoded, the whole set's device memory is
//! estimated before decoding, and the images are decoded in parallel straight into one `u8`
//! buffer.

use std::path::{Path, PathBuf};
use std::time::Instant;

use image::{DynamicImage, ImageDecoder};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rayon::prelude::*;

use super::options::{check_memory, LoadOptions, LoadReport};
use super::pixels::to_chw;
use super::{Data, DataError, ImageShape, Split};

/// The file names read as images (case-insensitive); others are counted and left alone.
pub const EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

/// The longest side decoded: JPEG's format limit, and far past any camera.
pub const MAX_SIDE: u32 = 65_535;

/// The seed of the held-out split: fixed, so that a run's test set does not move with `--seed`.
const HOLDOUT_SEED: u64 = 0x5EED_7E57;

/// One image file and its label.
#[derive(Clone, Debug)]
struct Entry {
    path: PathBuf,
    label: u16,
}

/// What a file's header says.
#[derive(Clone, Copy, Debug)]
struct Header {
    width: u32,
    height: u32,
    colour: bool,
    /// Bytes a pixel takes as decoded (8 for 16-bit RGBA).
    bytes_per_pixel: u8,
    /// PNG or JPEG, from the file's first bytes.
    format: image::ImageFormat,
}

impl Header {
    /// Bytes decoding this file into `shape` holds at its peak: the decoded image, its
    /// conversion to grey or RGB bytes, the resizer's intermediate (output width x input
    /// height) and its output, and [`METADATA_BYTES`] for the decoder's own state and metadata.
    fn decode_bytes(&self, shape: ImageShape) -> u64 {
        let (w, h) = (u64::from(self.width), u64::from(self.height));
        let c = shape.channels as u64;
        let resized = (w, h) != (shape.width as u64, shape.height as u64);
        let resizing = if resized {
            (shape.width as u64 * h + shape.len() as u64 / c) * c
        } else {
            0
        };
        w * h * (u64::from(self.bytes_per_pixel) + c) + resizing + METADATA_BYTES
    }
}

/// The bytes that decoding may hold at once, shared by the decoding threads: each decode takes
/// its [`Header::decode_bytes`] before it starts and gives them back when it ends, waiting while
/// the others hold too much. Without it every thread decoded its largest image at once (four
/// 9000x9000 16-bit PNGs held 3.4 GiB whatever the budget said).
struct DecodeBudget {
    total: u64,
    state: std::sync::Mutex<(u64, u64)>, // (held, the most held at once)
    freed: std::sync::Condvar,
}

impl DecodeBudget {
    fn new(total: u64) -> Self {
        Self {
            total,
            state: std::sync::Mutex::new((0, 0)),
            freed: std::sync::Condvar::new(),
        }
    }

    /// Takes `bytes` (once the others leave room), runs `decode`, gives them back.
    fn with<T>(&self, bytes: u64, decode: impl FnOnce() -> T) -> T {
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            // Nothing else held: a decode larger than the budget was refused before this.
            while state.0 > 0 && state.0 + bytes > self.total {
                state = self.freed.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            state.0 += bytes;
            state.1 = state.1.max(state.0);
        }
        let out = decode();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= bytes;
        self.freed.notify_all();
        out
    }

    fn peak(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1
    }
}

/// Reads the folder at `root` (`name` is how errors and the report call it).
pub fn load(root: &Path, name: &str, options: &LoadOptions) -> Result<Data, DataError> {
    // Timed from the start: listing and reading headers are part of reading a folder.
    let started = Instant::now();
    let invalid = |path: &Path, reason: String| DataError::Invalid {
        path: path.to_owned(),
        reason,
    };
    if !root.is_dir() {
        return Err(invalid(
            root,
            "not a folder; --dataset folder:PATH takes a folder with one sub-folder of images per class \
             (or train/ and test/ or val/ folders of them)"
                .into(),
        ));
    }
    let (train_dir, test_dir) = match root.join("train") {
        t if t.is_dir() => {
            let test = ["test", "val"].iter().map(|n| root.join(n)).find(|p| p.is_dir());
            (t, test)
        }
        _ => (root.to_owned(), None),
    };
    let classes = class_names(&train_dir)?;
    if classes.len() > usize::from(u16::MAX) + 1 {
        return Err(invalid(
            &train_dir,
            format!("{} class folders, more than 65,536", classes.len()),
        ));
    }
    let mut report = LoadReport::default();
    let (mut train, ignored) = list(&train_dir, &classes, &train_dir)?;
    report.ignored += ignored;
    let mut test = match &test_dir {
        Some(dir) => {
            let test_classes = class_names(dir)?;
            if let Some(extra) = test_classes.iter().find(|c| !classes.contains(c)) {
                return Err(invalid(
                    &dir.join(extra),
                    format!(
                        "class folder not in {}: the test set can only use the training set's classes",
                        train_dir.display()
                    ),
                ));
            }
            let (entries, ignored) = list(dir, &classes, dir)?;
            report.ignored += ignored;
            report.test_from = format!("{}/", dir.file_name().unwrap_or_default().to_string_lossy());
            entries
        }
        None => Vec::new(),
    };

    // Headers first: sizes and colour, each checked against the budget before decoding.
    let headers_of = |entries: &mut Vec<Entry>, report: &mut LoadReport| -> Result<Vec<Header>, DataError> {
        let read: Vec<Result<Header, DataError>> = entries
            .par_iter()
            .map(|e| header(&e.path, options.max_image_pixels))
            .collect();
        keep_good(entries, read, options.skip_bad_images, report)
    };
    let mut train_headers = headers_of(&mut train, &mut report)?;
    let mut test_headers = headers_of(&mut test, &mut report)?;
    if test_dir.is_none() {
        if !(options.val_fraction > 0.0 && options.val_fraction < 1.0) {
            return Err(invalid(
                root,
                format!(
                    "no test set: put one in {} or {} next to train/, or hold out part of each class with --val-fraction (between 0 and 1, got {})",
                    root.join("test").display(),
                    root.join("val").display(),
                    options.val_fraction
                ),
            ));
        }
        let held = hold_out(&train, classes.len(), options.val_fraction);
        let (mut kept, mut kept_h, mut out, mut out_h) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, (e, h)) in train.into_iter().zip(train_headers).enumerate() {
            if held[i] {
                out.push(e);
                out_h.push(h);
            } else {
                kept.push(e);
                kept_h.push(h);
            }
        }
        (train, train_headers, test, test_headers) = (kept, kept_h, out, out_h);
        report.test_from = held_out_line(test.len(), train.len() + test.len(), options.val_fraction);
    }
    for (label, class) in classes.iter().enumerate() {
        if !train.iter().any(|e| usize::from(e.label) == label) {
            return Err(invalid(
                &train_dir.join(class),
                "no readable training image in this class folder".into(),
            ));
        }
    }
    if test.is_empty() {
        return Err(invalid(
            test_dir.as_deref().unwrap_or(root),
            "the test set is empty: no readable image".into(),
        ));
    }

    let all = || train_headers.iter().chain(&test_headers);
    let first = train_headers[0];
    let uniform = all().all(|h| (h.width, h.height) == (first.width, first.height));
    let [height, width] = options.image_size.unwrap_or(if uniform {
        [first.height as usize, first.width as usize]
    } else {
        options.fallback_size
    });
    let shape = ImageShape {
        channels: options
            .channels
            .unwrap_or(if all().any(|h| h.colour) { 3 } else { 1 }),
        height,
        width,
    };
    let dataset = check_memory(name, train.len() + test.len(), shape, options)?;
    // Decoding shares what the budget leaves beside the dataset; a file that alone needs more
    // is refused (or skipped) before anything is decoded.
    let budget = DecodeBudget::new(options.max_memory.saturating_sub(dataset));
    let too_big = |e: &Entry, h: &Header| -> Result<(), DataError> {
        let need = h.decode_bytes(shape);
        if need > budget.total {
            return Err(bad(
                &e.path,
                format!(
                    "{}x{} pixels at {} bytes each: decoding takes {}, more than the {} the memory budget leaves beside the dataset ({}; --max-dataset-memory)",
                    h.width,
                    h.height,
                    h.bytes_per_pixel,
                    crate::memory::bytes(need),
                    crate::memory::bytes(budget.total),
                    options.memory_source
                ),
            ));
        }
        Ok(())
    };
    for (entries, headers) in [(&mut train, &mut train_headers), (&mut test, &mut test_headers)] {
        let checked = entries
            .iter()
            .zip(headers.iter())
            .map(|(e, h)| too_big(e, h).map(|()| *h))
            .collect();
        *headers = keep_good(entries, checked, options.skip_bad_images, &mut report)?;
    }
    let odd = |h: &&Header| (h.height as usize, h.width as usize) != (height, width);
    report.resized = train_headers.iter().chain(&test_headers).filter(odd).count();
    report.resized_to = [width, height];
    report.resized_examples = train
        .iter()
        .zip(&train_headers)
        .chain(test.iter().zip(&test_headers))
        .filter(|(_, h)| odd(h))
        .take(3)
        .map(|(e, h)| (e.path.clone(), [h.width, h.height]))
        .collect();

    let bar = options.progress.then(|| progress_bar(train.len() + test.len()));
    let decode =
        |entries: &mut Vec<Entry>, headers: &[Header], report: &mut LoadReport| -> Result<Split, DataError> {
            let mut images = vec![0u8; entries.len() * shape.len()];
            let stopped = || {
                options
                    .stop
                    .is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed))
            };
            let results: Vec<Result<(), DataError>> = images
                .par_chunks_mut(shape.len())
                .zip(entries.par_iter().zip(headers.par_iter()))
                .map(|(out, (e, h))| {
                    crate::faults::term_point("decode:image", stopped);
                    if stopped() {
                        return Err(DataError::Interrupted);
                    }
                    let r = budget.with(h.decode_bytes(shape), || {
                        decode_into(&e.path, h, shape, options.max_image_pixels, out)
                    });
                    if let Some(bar) = &bar {
                        bar.inc(1);
                    }
                    r
                })
                .collect();
            if stopped() {
                return Err(DataError::Interrupted);
            }
            // Compacts the buffer over the images that failed (skipped) or stops at the first.
            let mut good = 0;
            let mut kept = Vec::with_capacity(entries.len());
            let mut failures = Vec::new();
            for (i, (r, e)) in results.into_iter().zip(entries.drain(..)).enumerate() {
                match r {
                    Ok(()) => {
                        if good != i {
                            images.copy_within(i * shape.len()..(i + 1) * shape.len(), good * shape.len());
                        }
                        good += 1;
                        kept.push(e);
                    }
                    Err(err) if options.skip_bad_images => failures.push((e.path, reason(&err))),
                    Err(err) => return Err(err),
                }
            }
            report.skipped.extend(failures);
            images.truncate(good * shape.len());
            report.decoded += good;
            let labels = kept.iter().map(|e| e.label).collect();
            *entries = kept;
            Ok(Split {
                images,
                labels,
                shape,
            })
        };
    let train_split = decode(&mut train, &train_headers, &mut report)?;
    let test_split = decode(&mut test, &test_headers, &mut report)?;
    report.decode_peak = budget.peak();
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    report.decode_seconds = started.elapsed().as_secs_f64();
    if train_split.is_empty() || test_split.is_empty() {
        return Err(invalid(
            root,
            "no readable image left in the training or test set".into(),
        ));
    }
    Ok(Data {
        train: train_split,
        test: test_split,
        classes,
        report,
    })
}

fn reason(e: &DataError) -> String {
    match e {
        DataError::BadImage { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

/// Drops the entries whose header could not be read (counting them) or stops at the first.
fn keep_good(
    entries: &mut Vec<Entry>,
    read: Vec<Result<Header, DataError>>,
    skip: bool,
    report: &mut LoadReport,
) -> Result<Vec<Header>, DataError> {
    let mut headers = Vec::with_capacity(read.len());
    let mut kept = Vec::with_capacity(read.len());
    for (r, e) in read.into_iter().zip(entries.drain(..)) {
        match r {
            Ok(h) => {
                headers.push(h);
                kept.push(e);
            }
            Err(err) if skip => report.skipped.push((e.path, reason(&err))),
            Err(err) => return Err(err),
        }
    }
    *entries = kept;
    Ok(headers)
}

/// The class folders in `dir`, sorted by name (hidden folders left out).
pub(super) fn class_names(dir: &Path) -> Result<Vec<String>, DataError> {
    let read = std::fs::read_dir(dir).map_err(|error| DataError::Io {
        path: dir.to_owned(),
        error,
    })?;
    let mut names = Vec::new();
    for entry in read {
        let entry = entry.map_err(|error| DataError::Io {
            path: dir.to_owned(),
            error,
        })?;
        let name = entry.file_name();
        if name.as_encoded_bytes().starts_with(b".") || !entry.path().is_dir() {
            continue;
        }
        // A class's name is recorded in config.json and printed by predict: it must be text.
        let Some(name) = name.to_str() else {
            return Err(DataError::Invalid {
                path: entry.path(),
                reason: "a class folder whose name is not UTF-8: rename it (the name is the class's name)"
                    .into(),
            });
        };
        names.push(name.to_owned());
    }
    names.sort();
    if names.is_empty() {
        return Err(DataError::Invalid {
            path: dir.to_owned(),
            reason: "no class folders: put each class's images in a sub-folder named after the class".into(),
        });
    }
    Ok(names)
}

/// Every image file below `dir/<class>` for each class present, with its label, in path order;
/// and how many other files there were.
fn list(dir: &Path, classes: &[String], shown: &Path) -> Result<(Vec<Entry>, usize), DataError> {
    let mut entries = Vec::new();
    let mut ignored = 0;
    for (label, class) in classes.iter().enumerate() {
        let class_dir = dir.join(class);
        if !class_dir.is_dir() {
            continue;
        }
        let walk = walkdir::WalkDir::new(&class_dir)
            .follow_links(true)
            .sort_by_file_name();
        for item in walk {
            let item = match item {
                Ok(item) => item,
                // A symbolic link to nothing: listed (as an image when it is named like one) so
                // that reading it fails by name, and --skip-bad-images skips it.
                Err(e) if e.path().is_some_and(dangling) => {
                    let path = e.path().expect("checked").to_owned();
                    if is_image_name(&path) {
                        entries.push(Entry {
                            path,
                            label: label as u16,
                        });
                    } else {
                        ignored += 1;
                    }
                    continue;
                }
                Err(e) => {
                    return Err(DataError::Invalid {
                        path: e.path().unwrap_or(shown).to_owned(),
                        reason: e.to_string(),
                    })
                }
            };
            if !item.file_type().is_file() {
                continue;
            }
            let name = item.file_name().to_string_lossy();
            if name.starts_with('.') {
                continue;
            }
            if is_image_name(item.path()) {
                entries.push(Entry {
                    path: item.into_path(),
                    label: label as u16,
                });
            } else {
                ignored += 1;
            }
        }
    }
    Ok((entries, ignored))
}

/// Where a held-out test set came from: the requested share, or what was held out when small
/// classes (one image held out of each with two or more, none of a single image) moved it.
fn held_out_line(held: usize, total: usize, fraction: f64) -> String {
    let share = held as f64 / total.max(1) as f64;
    let asked = format!("{}% of each class", fraction * 100.0);
    if (share - fraction).abs() <= 0.01 {
        format!("{asked}, held out")
    } else {
        format!(
            "{held} of {total} images held out ({:.0}%; {asked} was asked, with at least one per class of two or more images and none of a class of one)",
            share * 100.0
        )
    }
}

/// Whether `path` is named like an image (by extension, case-insensitive).
fn is_image_name(path: &Path) -> bool {
    path.extension()
        .map(|x| x.to_string_lossy().to_ascii_lowercase())
        .is_some_and(|x| EXTENSIONS.contains(&x.as_str()))
}

/// Whether `path` is a symbolic link whose target does not exist.
fn dangling(path: &Path) -> bool {
    path.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) && !path.exists()
}

/// Which entries to hold out: `fraction` of each class (rounded, at least one when the class
/// has two or more), drawn with a fixed seed.
fn hold_out(entries: &[Entry], classes: usize, fraction: f64) -> Vec<bool> {
    let mut held = vec![false; entries.len()];
    let mut rng = rand::rngs::StdRng::seed_from_u64(HOLDOUT_SEED);
    for class in 0..classes {
        let mut members: Vec<usize> = (0..entries.len())
            .filter(|&i| usize::from(entries[i].label) == class)
            .collect();
        let n = members.len();
        let take = ((n as f64 * fraction).round() as usize).clamp(usize::from(n >= 2), n.saturating_sub(1));
        members.shuffle(&mut rng);
        for &i in &members[..take] {
            held[i] = true;
        }
    }
    held
}

fn bad(path: &Path, reason: impl Into<String>) -> DataError {
    DataError::BadImage {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// A decoder for `path`, its format told by its first bytes (not its name): PNG's signature or
/// JPEG's start-of-image marker.
fn open(path: &Path) -> Result<image::ImageReader<std::io::BufReader<std::fs::File>>, DataError> {
    let mut start = [0u8; 8];
    let mut file = std::fs::File::open(path).map_err(|e| match dangling(path) {
        true => bad(path, "a symbolic link to a file that does not exist"),
        false => bad(path, e.to_string()),
    })?;
    let n = std::io::Read::read(&mut file, &mut start).map_err(|e| bad(path, e.to_string()))?;
    let format = match &start[..n] {
        [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A] => image::ImageFormat::Png,
        [0xFF, 0xD8, 0xFF, ..] => image::ImageFormat::Jpeg,
        _ => return Err(bad(path, "not a PNG or JPEG image (its first bytes are neither)")),
    };
    let mut reader = image::ImageReader::open(path).map_err(|e| bad(path, e.to_string()))?;
    reader.set_format(format);
    Ok(reader)
}

/// What a decoder may allocate beyond the pixels its header declares: metadata chunks (an ICC
/// profile is a few KiB, rarely 1 MiB; one that inflates to 1 GiB is refused).
const METADATA_BYTES: u64 = 4 << 20;

/// The file's size and colour from its header, checked against the per-image budget.
fn header(path: &Path, max_pixels: u64) -> Result<Header, DataError> {
    let mut reader = open(path)?;
    let format = reader.format().expect("open sets the format");
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(METADATA_BYTES);
    reader.limits(limits);
    let decoder = reader
        .into_decoder()
        .map_err(|e| bad(path, format!("unreadable header: {e}")))?;
    let (width, height) = decoder.dimensions();
    check_size(path, width, height, max_pixels)?;
    use image::ColorType::*;
    let colour = !matches!(decoder.color_type(), L8 | La8 | L16 | La16);
    Ok(Header {
        width,
        height,
        colour,
        bytes_per_pixel: decoder.color_type().bytes_per_pixel(),
        format,
    })
}

fn check_size(path: &Path, width: u32, height: u32, max_pixels: u64) -> Result<(), DataError> {
    if width == 0 || height == 0 {
        return Err(bad(path, format!("{width}x{height} pixels: empty")));
    }
    if width.max(height) > MAX_SIDE {
        return Err(bad(
            path,
            format!("{width}x{height} pixels: a side longer than {MAX_SIDE}, the most ember decodes"),
        ));
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > max_pixels {
        return Err(bad(
            path,
            format!("{width}x{height} = {pixels} pixels, above the per-image budget of {max_pixels} (--max-image-pixels)"),
        ));
    }
    Ok(())
}

/// Decodes `path` into `out` as `shape` (channel-major), within the pixel budget whatever the
/// file claims past its header: the decoder may allocate what its header said (`header`) and
/// [`METADATA_BYTES`] more (an iCCP profile that inflates to 1 GiB is refused).
fn decode_into(
    path: &Path,
    header: &Header,
    shape: ImageShape,
    max_pixels: u64,
    out: &mut [u8],
) -> Result<(), DataError> {
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(header.width);
    limits.max_image_height = Some(header.height);
    let decoded = u64::from(header.width) * u64::from(header.height) * u64::from(header.bytes_per_pixel);
    limits.max_alloc = Some(decoded + METADATA_BYTES);
    let img = decode_file(path, header.format, limits).map_err(|why| bad(path, why))?;
    check_size(path, img.width(), img.height(), max_pixels)?;
    to_chw(&img, shape, out);
    Ok(())
}

/// Decodes the `format` file at `path` within `limits` (folders and `ember predict`). A JPEG
/// must run to its end-of-image marker ([`jpeg_complete`]): the JPEG decoder fills a cut-off
/// scan with grey and reports success, where PIL refuses such a file ("image file is
/// truncated"). The JPEG decoder reads the whole file into memory anyway, so it is read once,
/// checked, and decoded from memory.
pub fn decode_file(
    path: &Path,
    format: image::ImageFormat,
    limits: image::Limits,
) -> Result<DynamicImage, String> {
    let decoded = if format == image::ImageFormat::Jpeg {
        let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
        jpeg_complete(&bytes)?;
        let mut reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), format);
        reader.limits(limits);
        reader.decode()
    } else {
        let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
        let mut reader = image::ImageReader::with_format(std::io::BufReader::new(file), format);
        reader.limits(limits);
        reader.decode()
    };
    decoded.map_err(|e| e.to_string())
}

/// Whether a JPEG file's segments run to its end-of-image marker: walks the markers (an Exif
/// thumbnail inside APP1 is skipped with its segment, so its own end marker does not count)
/// and each scan's entropy-coded data (where a 0xFF byte is followed by 0x00 or a restart
/// marker), and fails when the bytes end first.
pub fn jpeg_complete(bytes: &[u8]) -> Result<(), &'static str> {
    const CUT: &str = "truncated JPEG: the file ends before its end-of-image marker";
    let mut i = 2; // past the start-of-image marker, checked by `open`
    loop {
        // Bytes between segments (non-conforming but common) are skipped up to the next 0xFF.
        i = next_ff(bytes, i).ok_or(CUT)?;
        while bytes.get(i) == Some(&0xFF) {
            i += 1; // fill bytes
        }
        let Some(&marker) = bytes.get(i) else {
            return Err(CUT);
        };
        i += 1;
        match marker {
            0xD9 => return Ok(()),
            0x00 | 0x01 | 0xD0..=0xD8 => continue, // no length follows
            _ => {}
        }
        let Some(len) = bytes
            .get(i..i + 2)
            .map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])))
        else {
            return Err(CUT);
        };
        if len < 2 {
            return Err("corrupt JPEG: a segment shorter than its length field");
        }
        i += len;
        if i > bytes.len() {
            return Err(CUT);
        }
        if marker == 0xDA {
            // Entropy-coded data up to the next marker that is not a stuffed byte or a restart.
            loop {
                i = next_ff(bytes, i).ok_or(CUT)?;
                match bytes.get(i + 1) {
                    None => return Err(CUT),
                    Some(0x00 | 0xD0..=0xD7) => i += 2,
                    Some(_) => break,
                }
            }
        }
    }
}

/// The index of the first 0xFF byte at or after `from`.
fn next_ff(bytes: &[u8], from: usize) -> Option<usize> {
    Some(from + bytes.get(from..)?.iter().position(|&b| b == 0xFF)?)
}

fn progress_bar(len: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("decoding {bar:40} {pos}/{len} images {per_sec} {eta}")
            .expect("valid template"),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(path: &Path, w: u32, h: u32, colour: bool) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        if colour {
            image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 7) as u8, (y * 5) as u8, 200]))
                .save(path)
                .unwrap();
        } else {
            image::GrayImage::from_fn(w, h, |x, y| image::Luma([(x + y) as u8]))
                .save(path)
                .unwrap();
        }
    }

    fn jpeg(img: &DynamicImage) -> Vec<u8> {
        let mut bytes = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut bytes), image::ImageFormat::Jpeg)
            .unwrap();
        bytes
    }

    /// Every cut of a JPEG before its last byte is refused, whole files (with bytes after the
    /// end marker, or an Exif-like APP1 segment holding an end marker of its own) are not.
    #[test]
    fn a_jpeg_is_complete_only_up_to_its_end_marker() {
        let img = DynamicImage::ImageRgb8(image::RgbImage::from_fn(40, 24, |x, y| {
            image::Rgb([(x * 37 % 256) as u8, (y * 91 % 256) as u8, ((x ^ y) * 13) as u8])
        }));
        let whole = jpeg(&img);
        assert_eq!(jpeg_complete(&whole), Ok(()));
        for cut in 2..whole.len() - 1 {
            assert!(
                jpeg_complete(&whole[..cut]).is_err(),
                "cut at {cut} of {}",
                whole.len()
            );
        }
        let mut padded = whole.clone();
        padded.extend_from_slice(&[0; 100]);
        assert_eq!(jpeg_complete(&padded), Ok(()));
        // An APP1 segment right after the start marker, holding 0xFF 0xD9 (a thumbnail's end).
        let mut app1 = vec![
            0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x08, b'E', b'x', 0xFF, 0xD9, 0x00, 0x00,
        ];
        app1.extend_from_slice(&whole[2..]);
        assert_eq!(jpeg_complete(&app1), Ok(()));
        let cut = &app1[..app1.len() / 2];
        assert!(jpeg_complete(cut).is_err());
        // The image crate decodes the cut file without complaint: the check is what refuses it.
        assert!(image::load_from_memory_with_format(cut, image::ImageFormat::Jpeg).is_ok());
    }

    #[test]
    fn classes_are_sorted_folders_and_files_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (class, files) in [("b", 3), ("a", 2)] {
            for i in 0..files {
                png(
                    &root.join("train").join(class).join(format!("{i}.png")),
                    4,
                    4,
                    false,
                );
                png(
                    &root.join("test").join(class).join(format!("{i}.png")),
                    4,
                    4,
                    false,
                );
            }
        }
        std::fs::write(root.join("train/a/notes.txt"), "not an image").unwrap();
        let data = load(root, "folder", &LoadOptions::default()).unwrap();
        assert_eq!(data.classes, ["a", "b"]);
        assert_eq!(data.train.labels, [0, 0, 1, 1, 1]);
        assert_eq!(data.test.len(), 5);
        assert_eq!(
            data.train.shape,
            ImageShape {
                channels: 1,
                height: 4,
                width: 4
            }
        );
        assert_eq!(data.report.ignored, 1);
        assert_eq!(data.report.test_from, "test/");
    }

    #[test]
    fn one_colour_image_makes_the_set_rgb_and_sizes_fall_back_to_the_recipe() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for i in 0..10 {
            png(&root.join("x").join(format!("{i}.png")), 8, 8, i == 3);
            png(&root.join("y").join(format!("{i}.png")), 8 + i, 8, false);
        }
        let options = LoadOptions {
            val_fraction: 0.2,
            fallback_size: [6, 6],
            ..LoadOptions::default()
        };
        let data = load(root, "folder", &options).unwrap();
        assert_eq!(
            data.train.shape,
            ImageShape {
                channels: 3,
                height: 6,
                width: 6
            }
        );
        // 20% of each class of 10, held out with a fixed seed.
        assert_eq!((data.train.len(), data.test.len()), (16, 4));
        assert_eq!(data.test.labels.iter().filter(|&&l| l == 0).count(), 2);
        assert_eq!(data.report.resized, 20);
        let again = load(root, "folder", &options).unwrap();
        assert_eq!(again.test, data.test);
    }

    /// The stop flag (set by the Ctrl-C/SIGTERM handler) ends decoding with `Interrupted`,
    /// also under --skip-bad-images (where other errors are counted and skipped).
    #[test]
    fn a_stop_request_ends_decoding() {
        static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
        let dir = tempfile::tempdir().unwrap();
        for class in ["a", "b"] {
            for i in 0..3 {
                png(&dir.path().join(class).join(format!("{i}.png")), 4, 4, false);
            }
        }
        let options = LoadOptions {
            val_fraction: 0.34,
            skip_bad_images: true,
            stop: Some(&STOP),
            ..LoadOptions::default()
        };
        let err = load(dir.path(), "folder", &options).unwrap_err();
        assert!(matches!(err, DataError::Interrupted), "{err}");
        STOP.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(load(dir.path(), "folder", &options).unwrap().report.decoded, 6);
    }

    #[test]
    fn a_folder_needs_class_folders_and_a_test_set() {
        let dir = tempfile::tempdir().unwrap();
        let err = load(dir.path(), "folder", &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("no class folders"), "{err}");
        png(&dir.path().join("only/0.png"), 4, 4, false);
        let options = LoadOptions {
            val_fraction: 0.0,
            ..LoadOptions::default()
        };
        let err = load(dir.path(), "folder", &options).unwrap_err().to_string();
        assert!(err.contains("--val-fraction"), "{err}");
    }

    #[test]
    fn memory_is_checked_before_decoding() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..4 {
            png(
                &dir.path().join("train/a").join(format!("{i}.png")),
                10,
                10,
                false,
            );
            png(&dir.path().join("test/a").join(format!("{i}.png")), 10, 10, false);
        }
        let options = LoadOptions {
            max_memory: 1000,
            memory_source: "given".into(),
            ..LoadOptions::default()
        };
        let err = load(dir.path(), "folder:x", &options).unwrap_err().to_string();
        // 8 images x (100 x 4 + 8) bytes
        assert!(err.contains("8 images of 1x10x10 need 3.19 KiB"), "{err}");
        assert!(err.contains("--max-dataset-memory"), "{err}");
    }
}
