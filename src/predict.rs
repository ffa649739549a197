//! `ember predict`: classify image files (PNG, JPEG; any size or colour) with a checkpoint.
//!
//! A run on CIFAR or a folder of images: each image is converted to the run's channels (grey as
//! luma, or RGB) and resized to its size, as its training images were.
//!
//! A run on an MNIST-format dataset: each image becomes what the model saw in training: grey, MNIST's polarity (light strokes on
//! a dark background; an image whose border is light on average is inverted), padded to a
//! square with its background and resized to 28x28, then normalised as the checkpoint's recipe.
//! A 28x28 grey image with a dark background, such as an MNIST digit saved as PNG, passes
//! through unchanged. Transparent pixels take the background that contrasts with the drawing
//! (a dark digit on a transparent canvas reads as ink on paper).
//!
//! A file's header decides how much memory decoding takes, so the size is checked from the
//! header first: at most [`MAX_SIDE`] pixels a side, which bounds both the decoded image and
//! the square it is padded to.

use std::path::{Path, PathBuf};

use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use ember_models::{Classifier, Output};
use image::imageops::FilterType;
use image::{GrayImage, Luma};
use serde::Serialize;

use crate::config::TrainConfig;
use crate::data::{DeviceSplit, ImageShape, Normalization, Split, IMAGE_PIXELS, IMAGE_SIDE};

/// A file that could not be classified.
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot read as an image ({reason})", path.display())]
pub struct PredictError {
    pub path: PathBuf,
    pub reason: String,
}

/// One class and its probability.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Guess {
    pub class: usize,
    /// The class's name (the folder's, CIFAR's, Fashion-MNIST's; MNIST's digit).
    pub name: String,
    pub probability: f64,
}

/// The model's answer for one file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    pub file: String,
    pub prediction: usize,
    pub top3: Vec<Guess>,
}

impl Prediction {
    /// `FILE: CLASS  (CLASS: P%, CLASS: P%, CLASS: P%)`, the line `ember predict` prints.
    pub fn text(&self, config: &TrainConfig) -> String {
        let guesses: Vec<String> = self
            .top3
            .iter()
            .map(|g| format!("{}: {:.2}%", config.class_text(g.class), 100.0 * g.probability))
            .collect();
        // File and class names come from the file system: escaped, one line each.
        crate::files::printable(&format!(
            "{}: {}  ({})",
            self.file,
            config.class_text(self.prediction),
            guesses.join(", ")
        ))
    }
}

/// How a file becomes what a run's model saw in training.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Prepare {
    /// MNIST's layout (see the module documentation).
    Mnist,
    /// Converted to the run's channels and resized to its size.
    Plain(ImageShape),
}

impl Prepare {
    /// How `config`'s run saw its images.
    pub fn of(config: &TrainConfig) -> Self {
        if config.dataset.idx().is_some() && config.input == ImageShape::MNIST {
            Self::Mnist
        } else {
            Self::Plain(config.input)
        }
    }

    pub fn shape(self) -> ImageShape {
        match self {
            Self::Mnist => ImageShape::MNIST,
            Self::Plain(shape) => shape,
        }
    }
}

/// The longest side `ember predict` decodes: a 48-megapixel photo fits, and the decoded image
/// (at most 8192² RGBA, 256 MiB) and its padded grey square (64 MiB) stay bounded whatever a
/// file's header claims.
pub const MAX_SIDE: u32 = 8192;

/// Reads `path` and turns it into the pixels the model expects, channel-major.
pub fn load_as(path: &Path, prepare: Prepare) -> Result<Vec<u8>, PredictError> {
    let img = decode(path)?;
    Ok(match prepare {
        Prepare::Mnist => to_mnist(&grey(&img)).to_vec(),
        Prepare::Plain(shape) => {
            let mut out = vec![0; shape.len()];
            crate::data::pixels::to_chw(&img, shape, &mut out);
            out
        }
    })
}

/// Reads `path` and turns it into the 784 pixels an MNIST model expects.
pub fn load(path: &Path) -> Result<[u8; IMAGE_PIXELS], PredictError> {
    Ok(to_mnist(&grey(&decode(path)?)))
}

/// Decodes `path`, its size checked from the header first.
fn decode(path: &Path) -> Result<image::DynamicImage, PredictError> {
    let fail = |reason: String| PredictError {
        path: path.to_owned(),
        reason,
    };
    let open = || {
        image::ImageReader::open(path)
            .and_then(|r| r.with_guessed_format())
            .map_err(|e| fail(e.to_string()))
    };
    // The header alone, before anything is allocated for the pixels.
    let (w, h) = open()?.into_dimensions().map_err(|e| fail(e.to_string()))?;
    if w.max(h) > MAX_SIDE {
        return Err(fail(format!(
            "{w}x{h} pixels, more than the {MAX_SIDE} a side that ember predict reads; scale it down"
        )));
    }
    let mut reader = open()?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    match reader.format() {
        // As folders decode (a cut-off JPEG is refused there and here).
        Some(format) => crate::data::folder::decode_file(path, format, limits).map_err(fail),
        // No format guessed: image's own error says so.
        None => {
            reader.limits(limits);
            reader.decode().map_err(|e| fail(e.to_string()))
        }
    }
}

/// The image in grey levels. Transparency is composited onto the background that contrasts
/// with what is drawn: white under dark strokes, black under light ones.
pub fn grey(img: &image::DynamicImage) -> GrayImage {
    if !img.color().has_alpha() {
        return img.to_luma8();
    }
    let la = img.to_luma_alpha8();
    let (mut ink, mut weight) = (0.0f64, 0.0f64);
    for p in la.pixels() {
        let [v, a] = p.0;
        ink += f64::from(v) * f64::from(a);
        weight += f64::from(a);
    }
    let dark_strokes = weight == 0.0 || ink / weight < 127.5;
    let paper: u32 = if dark_strokes { 255 } else { 0 };
    GrayImage::from_fn(la.width(), la.height(), |x, y| {
        let [v, a] = la.get_pixel(x, y).0;
        let (v, a) = (u32::from(v), u32::from(a));
        Luma([((v * a + paper * (255 - a) + 127) / 255) as u8])
    })
}

/// Grey image to MNIST's 28x28 light-on-dark layout (see the module documentation).
pub fn to_mnist(gray: &GrayImage) -> [u8; IMAGE_PIXELS] {
    let (w, h) = gray.dimensions();
    let border: Vec<u8> = gray
        .enumerate_pixels()
        .filter(|(x, y, _)| *x == 0 || *y == 0 || *x + 1 == w || *y + 1 == h)
        .map(|(_, _, p)| p.0[0])
        .collect();
    let background = border.iter().map(|&v| f64::from(v)).sum::<f64>() / border.len().max(1) as f64;
    let mut img = gray.clone();
    if background > 127.5 {
        image::imageops::invert(&mut img);
    }
    if (w, h) != (IMAGE_SIDE as u32, IMAGE_SIDE as u32) {
        // Pad to a square with the (now dark) background so that the digit keeps its shape.
        let side = w.max(h);
        let fill = if background > 127.5 {
            255 - background as u8
        } else {
            background as u8
        };
        let mut square = GrayImage::from_pixel(side, side, Luma([fill]));
        image::imageops::overlay(
            &mut square,
            &img,
            i64::from((side - w) / 2),
            i64::from((side - h) / 2),
        );
        img = image::imageops::resize(
            &square,
            IMAGE_SIDE as u32,
            IMAGE_SIDE as u32,
            FilterType::Triangle,
        );
    }
    let mut out = [0u8; IMAGE_PIXELS];
    out.copy_from_slice(img.as_raw());
    out
}

/// Class probabilities for each image, `[n][classes]`.
pub fn probabilities<B: Backend, M: Classifier<B>>(
    model: &M,
    images: &[Vec<u8>],
    shape: ImageShape,
    norm: &Normalization,
    device: &B::Device,
) -> Vec<Vec<f64>> {
    if images.is_empty() {
        return Vec::new();
    }
    let split = Split {
        images: images.iter().flatten().copied().collect(),
        labels: vec![0; images.len()],
        shape,
    };
    let on_device = DeviceSplit::<B>::upload(&split, norm, device);
    let out = model.forward(on_device.images);
    let probs = match model.output() {
        Output::LogProbs => out.exp(),
        Output::Logits => softmax(out, 1),
    };
    let classes = probs.dims()[1];
    let values: Vec<f64> = probs.into_data().convert::<f64>().to_vec().expect("f64 data");
    values.chunks(classes).map(<[f64]>::to_vec).collect()
}

/// The most likely class and the three most likely, for one image's probabilities; `name`
/// gives a class's name.
pub fn top3(file: &str, probs: &[f64], name: impl Fn(usize) -> String) -> Prediction {
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    Prediction {
        file: file.to_string(),
        prediction: order[0],
        top3: order
            .iter()
            .take(3)
            .map(|&c| Guess {
                class: c,
                name: name(c),
                probability: probs[c],
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mnist_sized_dark_images_pass_unchanged() {
        let mut img = GrayImage::new(28, 28);
        img.put_pixel(14, 10, Luma([200]));
        img.put_pixel(3, 27, Luma([17]));
        let out = to_mnist(&img);
        assert_eq!(&out[..], img.as_raw().as_slice());
    }

    #[test]
    fn light_backgrounds_are_inverted_and_sizes_normalised() {
        // A black bar on white paper, 56 wide and 28 high.
        let mut img = GrayImage::from_pixel(56, 28, Luma([255]));
        for y in 4..24 {
            for x in 26..30 {
                img.put_pixel(x, y, Luma([0]));
            }
        }
        let out = to_mnist(&img);
        // Background dark, the bar light, in the middle column.
        assert_eq!(out[0], 0);
        assert!(
            out[14 * 28 + 14] > 200 || out[14 * 28 + 13] > 200,
            "{:?}",
            &out[14 * 28..15 * 28]
        );
        // Padded to a square first: the top rows (padding) stay dark.
        assert!(out[..28 * 6].iter().all(|&p| p < 10));
    }

    /// A digit drawn in black on a transparent canvas (a typical export): the strokes are
    /// opaque, the background fully transparent. It must read as the digit, not as a blank.
    #[test]
    fn transparent_canvases_keep_their_drawing() {
        let digit: Vec<u8> = (0..IMAGE_PIXELS as u32)
            .map(|i| {
                if (i % 28).abs_diff(14) < 2 && (4..24).contains(&(i / 28)) {
                    255
                } else {
                    0
                }
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        for (name, stroke) in [("black-on-clear.png", 0u8), ("white-on-clear.png", 255)] {
            let canvas = image::RgbaImage::from_fn(28, 28, |x, y| {
                image::Rgba([stroke, stroke, stroke, digit[(y * 28 + x) as usize]])
            });
            let path = dir.path().join(name);
            canvas.save(&path).unwrap();
            assert_eq!(&load(&path).unwrap()[..], &digit[..], "{name}");
        }
    }

    #[test]
    fn sizes_are_checked_from_the_header_before_decoding() {
        let dir = tempfile::tempdir().unwrap();
        let wide = dir.path().join("wide.png");
        GrayImage::new(MAX_SIDE + 1, 1).save(&wide).unwrap();
        let err = load(&wide).unwrap_err().to_string();
        assert!(err.contains("wide.png") && err.contains("8193x1 pixels"), "{err}");
        let fits = dir.path().join("fits.png");
        GrayImage::new(MAX_SIDE, 2).save(&fits).unwrap();
        assert!(load(&fits).is_ok());
    }

    #[test]
    fn top3_orders_by_probability() {
        let p = top3("x.png", &[0.1, 0.6, 0.05, 0.25], |c| format!("c{c}"));
        assert_eq!(p.prediction, 1);
        assert_eq!(p.top3.iter().map(|g| g.class).collect::<Vec<_>>(), vec![1, 3, 0]);
        assert_eq!(p.top3[1].name, "c3");
    }
}
