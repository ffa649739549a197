//! What the integration tests share: the `ember` binary as a test runs it, and the repository's
//! own MNIST (`data/mnist`, committed), so that no test needs a network or `../shared`. Each
//! test file is its own crate and uses only some of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ember::data::{Data, Dataset, Source};

/// The release `ember` binary, offline, with no data folder from the user's environment.
pub fn ember() -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("ember").unwrap();
    // Tests never reach the network; a user's own setting must not leak in either.
    cmd.env("EMBER_OFFLINE", "true").env_remove("EMBER_DATA_DIR");
    cmd
}

/// The repository's MNIST folder.
pub fn repo_mnist() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist")
}

/// The PyTorch parity fixture's initial `state_dict` for the example net, saved by `torch.save`.
pub fn pytorch_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch-example-net.pt")
}

/// `ember import` of [`pytorch_fixture`] into the run directory `out`, which must succeed: a
/// checkpoint for tests that resume, evaluate or spoil one.
pub fn import_fixture(out: &Path) {
    ember()
        .args([
            "import",
            "--from",
            "pytorch",
            "--model",
            "pytorch-example",
            "--out",
        ])
        .arg(out)
        .arg(pytorch_fixture())
        .assert()
        .success();
}

/// The repository's MNIST, loaded offline.
pub fn load_mnist() -> Data {
    Data::load(&Source {
        dataset: Dataset::Mnist,
        dir: repo_mnist(),
        download: false,
    })
    .unwrap()
}

/// A PNG chunk: length, type, data, CRC of type and data.
pub fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut crc = flate2::Crc::new();
    crc.update(kind);
    crc.update(data);
    let mut v = (data.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(kind);
    v.extend_from_slice(data);
    v.extend_from_slice(&crc.sum().to_be_bytes());
    v
}

/// A well-formed 8-bit grey PNG of `width` x `height` black pixels: complete (it decodes) up to
/// 64 megapixels, beyond that only its first 64 rows: a few kilobytes either way, since zeros
/// compress well, that claim as much memory as they like.
pub fn claiming_png(width: u32, height: u32) -> Vec<u8> {
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 0, 0, 0, 0]); // depth 8, grey, deflate, no filter, no interlace
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(
        &mut z,
        &vec![
            0u8;
            {
                let row = width as usize + 1;
                let rows = if row * height as usize <= 1 << 26 {
                    height as usize
                } else {
                    (height as usize).min(64)
                };
                row * rows
            }
        ],
    )
    .unwrap();
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(chunk(b"IHDR", &ihdr));
    png.extend(chunk(b"IDAT", &z.finish().unwrap()));
    png.extend(chunk(b"IEND", &[]));
    png
}
