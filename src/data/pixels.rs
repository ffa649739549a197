//! Pixel layouts: decoded images to ember's channel-major `u8` layout and back, resized as PIL
//! and torchvision resize.

use image::DynamicImage;

use super::ImageShape;

/// `img` as `shape`, channel-major, into `out`: grey as luma, colour as RGB (alpha dropped, as
/// PIL's `convert` does), resized when the size differs with the bilinear (triangle) filter
/// scaled to the reduction, as PIL's `resize(BILINEAR)` and torchvision's `Resize` do.
pub fn to_chw(img: &DynamicImage, shape: ImageShape, out: &mut [u8]) {
    let (w, h) = (shape.width as u32, shape.height as u32);
    let (channels, pixels) = match shape.channels {
        1 => (1, img.to_luma8().into_raw()),
        _ => (3, img.to_rgb8().into_raw()),
    };
    let pixels = if (img.width(), img.height()) == (w, h) {
        pixels
    } else {
        resize(pixels, [img.width(), img.height()], channels, [w, h])
    };
    let plane = shape.height * shape.width;
    if channels == 1 {
        out.copy_from_slice(&pixels);
        return;
    }
    for (i, px) in pixels.chunks_exact(3).enumerate() {
        for c in 0..3 {
            out[c * plane + i] = px[c];
        }
    }
}

/// Interleaved `u8` pixels of `from` (`[width, height]`) resized to `to` with
/// fast_image_resize (SIMD): `image`'s own resize took more than half of reading a folder of
/// 256x256 JPEGs down to 64x64.
fn resize(pixels: Vec<u8>, from: [u32; 2], channels: usize, to: [u32; 2]) -> Vec<u8> {
    use fast_image_resize as fr;
    let kind = if channels == 1 {
        fr::PixelType::U8
    } else {
        fr::PixelType::U8x3
    };
    let src =
        fr::images::Image::from_vec_u8(from[0], from[1], pixels, kind).expect("one buffer of that size");
    let mut dst = fr::images::Image::new(to[0], to[1], kind);
    let options = fr::ResizeOptions::new().resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Bilinear));
    fr::Resizer::new()
        .resize(&src, &mut dst, &options)
        .expect("same pixel type, sizes at least 1");
    dst.into_vec()
}

/// A channel-major image back into an `image` one (grey or RGB).
pub fn from_chw(pixels: &[u8], shape: ImageShape) -> DynamicImage {
    let (w, h) = (shape.width as u32, shape.height as u32);
    let plane = shape.height * shape.width;
    if shape.channels == 1 {
        let grey = image::GrayImage::from_raw(w, h, pixels.to_vec()).expect("one plane");
        return DynamicImage::ImageLuma8(grey);
    }
    let mut rgb = Vec::with_capacity(plane * 3);
    for i in 0..plane {
        for c in 0..3 {
            rgb.push(pixels[c * plane + i]);
        }
    }
    DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, rgb).expect("three planes"))
}
