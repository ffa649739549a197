//! A dataset file whose header claims far more images than the real one holds, compressed
//! so that it is small on disk (1,000,000 images of zeros: 784 MB decompressed, about 8 MB
//! as `.gz`): loading it is refused from the header, before any payload is decompressed into
//! memory. A counting global allocator records the largest single allocation.

use std::io::Write;

use ember::data::{Data, Dataset, Source};

mod common;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

#[test]
fn an_idx_gz_claiming_a_million_images_is_refused_from_its_header() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ] {
        std::fs::copy(common::repo_mnist().join(name), dir.path().join(name)).unwrap();
    }
    let bomb = dir.path().join("train-images-idx3-ubyte.gz");
    let mut gz =
        flate2::write::GzEncoder::new(std::fs::File::create(&bomb).unwrap(), flate2::Compression::fast());
    gz.write_all(&0x0000_0803u32.to_be_bytes()).unwrap();
    for d in [1_000_000u32, 28, 28] {
        gz.write_all(&d.to_be_bytes()).unwrap();
    }
    // A complete payload: the header's claim is the file's only fault.
    let zeros = vec![0u8; 1 << 20];
    let mut left = 1_000_000 * 784;
    while left > 0 {
        let n = left.min(zeros.len());
        gz.write_all(&zeros[..n]).unwrap();
        left -= n;
    }
    gz.finish().unwrap();
    let size = std::fs::metadata(&bomb).unwrap().len();
    assert!(size < 16 << 20, "{size} bytes");

    counting_alloc::reset_largest();
    let err = Data::load(&Source {
        dataset: Dataset::Mnist,
        dir: dir.path().to_owned(),
        download: false,
    })
    .unwrap_err()
    .to_string();
    let largest = counting_alloc::largest();
    assert!(
        err.contains("train-images-idx3-ubyte.gz")
            && err.contains("dimensions [1000000, 28, 28], expected [60000, 28, 28]"),
        "{err}"
    );
    assert!(largest < 16 << 20, "allocated {largest} bytes at once");
}
