//! The IDX format of MNIST-style files: a big-endian magic number (0x00000801 for `u8`
//! labels, 0x00000803 for `u8` images), one big-endian `u32` per dimension, then the payload.

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;

use super::DataError;

/// Magic number of an IDX file of unsigned bytes with one dimension (labels).
pub const LABELS_MAGIC: u32 = 2049;
/// Magic number of an IDX file of unsigned bytes with three dimensions (images).
pub const IMAGES_MAGIC: u32 = 2051;

/// A parsed IDX file of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idx {
    /// Dimensions from the header: `[count]` for labels, `[count, rows, cols]` for images.
    pub dims: Vec<usize>,
    /// Payload, row-major, `dims.iter().product()` bytes.
    pub data: Vec<u8>,
}

/// Reads an IDX file, gzip-compressed when its name ends in `.gz`, and checks it against
/// `expected_magic`. See [`parse`] for the checks.
pub fn read(path: &Path, expected_magic: u32) -> Result<Idx, DataError> {
    let file = std::fs::File::open(path).map_err(|source| DataError::Io {
        path: path.to_owned(),
        error: source,
    })?;
    let gz = path.extension().is_some_and(|e| e == "gz");
    if gz {
        parse(GzDecoder::new(file), path, expected_magic)
    } else {
        parse(file, path, expected_magic)
    }
}

/// [`read`], with the dimensions the file must have: a header that gives others is a
/// [`DataError::Dims`] before any of the payload is read.
pub fn read_expecting(path: &Path, expected_magic: u32, dims: &[usize]) -> Result<Idx, DataError> {
    let file = std::fs::File::open(path).map_err(|source| DataError::Io {
        path: path.to_owned(),
        error: source,
    })?;
    if path.extension().is_some_and(|e| e == "gz") {
        parse_checked(GzDecoder::new(file), path, expected_magic, Some(dims))
    } else {
        parse_checked(file, path, expected_magic, Some(dims))
    }
}

/// Parses an IDX stream of unsigned bytes: magic number, dimensions and payload length must
/// agree, and nothing may follow the payload. `path` only names the source in errors.
///
/// Memory is bounded by what the stream really holds, not by what its header claims: a header
/// that promises 2^31 images in a 1 KB file is a [`DataError::Length`], not an allocation.
pub fn parse(reader: impl Read, path: &Path, expected_magic: u32) -> Result<Idx, DataError> {
    parse_checked(reader, path, expected_magic, None)
}

fn parse_checked(
    mut reader: impl Read,
    path: &Path,
    expected_magic: u32,
    expected_dims: Option<&[usize]>,
) -> Result<Idx, DataError> {
    let path_buf = || path.to_path_buf();
    let mut magic = [0u8; 4];
    read_header(&mut reader, &mut magic, path)?;
    let magic = u32::from_be_bytes(magic);
    if magic != expected_magic {
        return Err(DataError::BadMagic {
            path: path_buf(),
            found: magic,
            expected: expected_magic,
        });
    }
    let rank = (magic & 0xff) as usize;
    let mut dims = Vec::with_capacity(rank);
    for _ in 0..rank {
        let mut dim = [0u8; 4];
        read_header(&mut reader, &mut dim, path)?;
        dims.push(u32::from_be_bytes(dim) as usize);
    }
    if let Some(expected) = expected_dims.filter(|&e| e != dims.as_slice()) {
        return Err(DataError::Dims {
            path: path_buf(),
            found: dims,
            expected: expected.to_vec(),
        });
    }
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| DataError::Invalid {
            path: path_buf(),
            reason: format!("dimensions {dims:?} overflow"),
        })?;
    let mut data = Vec::new();
    // One byte past the payload tells a file with trailing bytes from an exact one.
    let limit = (expected as u64).saturating_add(1);
    reader
        .take(limit)
        .read_to_end(&mut data)
        .map_err(|source| read_error(path, source))?;
    if data.len() != expected {
        let actual = if data.len() > expected {
            format!("more than {expected}")
        } else {
            data.len().to_string()
        };
        return Err(DataError::Length {
            path: path_buf(),
            dims,
            expected,
            actual,
        });
    }
    Ok(Idx { dims, data })
}

fn read_header(reader: &mut impl Read, buf: &mut [u8], path: &Path) -> Result<(), DataError> {
    reader.read_exact(buf).map_err(|source| {
        if source.kind() == std::io::ErrorKind::UnexpectedEof {
            DataError::Invalid {
                path: path.to_owned(),
                reason: "file ends inside the IDX header".into(),
            }
        } else {
            read_error(path, source)
        }
    })
}

fn read_error(path: &Path, source: std::io::Error) -> DataError {
    // GzDecoder reports a truncated or corrupt stream as an I/O error of these kinds.
    match source.kind() {
        std::io::ErrorKind::InvalidInput
        | std::io::ErrorKind::InvalidData
        | std::io::ErrorKind::UnexpectedEof => DataError::Invalid {
            path: PathBuf::from(path),
            reason: format!("corrupt or truncated gzip stream ({source})"),
        },
        _ => DataError::Io {
            path: path.to_owned(),
            error: source,
        },
    }
}

/// Encodes `data` with `dims` as an IDX byte stream; the inverse of [`parse`].
pub fn encode(magic: u32, dims: &[usize], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 4 * dims.len() + data.len());
    out.extend_from_slice(&magic.to_be_bytes());
    for &d in dims {
        out.extend_from_slice(&(d as u32).to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn p() -> &'static Path {
        Path::new("t.idx")
    }

    #[test]
    fn parses_images_and_labels() {
        let bytes = encode(IMAGES_MAGIC, &[2, 2, 3], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        let idx = parse(&bytes[..], p(), IMAGES_MAGIC).unwrap();
        assert_eq!(idx.dims, vec![2, 2, 3]);
        assert_eq!(idx.data, (1..=12).collect::<Vec<u8>>());
        let bytes = encode(LABELS_MAGIC, &[3], &[7, 0, 9]);
        let idx = parse(&bytes[..], p(), LABELS_MAGIC).unwrap();
        assert_eq!((idx.dims, idx.data), (vec![3], vec![7, 0, 9]));
    }

    #[test]
    fn rejects_wrong_magic_naming_both() {
        let bytes = encode(LABELS_MAGIC, &[1], &[1]);
        let err = parse(&bytes[..], p(), IMAGES_MAGIC).unwrap_err().to_string();
        assert!(err.contains("t.idx"), "{err}");
        assert!(err.contains("2049") && err.contains("2051"), "{err}");
    }

    #[test]
    fn rejects_truncated_header_and_payload() {
        let bytes = encode(IMAGES_MAGIC, &[2, 2, 2], &[0; 8]);
        let err = parse(&bytes[..10], p(), IMAGES_MAGIC).unwrap_err();
        assert!(err.to_string().contains("header"), "{err}");
        let err = parse(&bytes[..bytes.len() - 1], p(), IMAGES_MAGIC).unwrap_err();
        assert!(matches!(err, DataError::Length { expected: 8, .. }), "{err}");
        assert!(err.to_string().contains("7 bytes"), "{err}");
    }

    #[test]
    fn rejects_trailing_bytes() {
        let mut bytes = encode(LABELS_MAGIC, &[2], &[1, 2]);
        bytes.push(3);
        let err = parse(&bytes[..], p(), LABELS_MAGIC).unwrap_err();
        assert!(err.to_string().contains("more than 2"), "{err}");
    }

    #[test]
    fn huge_header_claims_fail_without_allocating_them() {
        // 2^31 images of 28x28 claimed, 1 KB present.
        let mut bytes = encode(IMAGES_MAGIC, &[1 << 31, 28, 28], &[]);
        bytes.resize(1024, 0);
        let err = parse(&bytes[..], p(), IMAGES_MAGIC).unwrap_err();
        assert!(matches!(err, DataError::Length { .. }), "{err}");
        // u32::MAX in every dimension overflows usize products on 64-bit too.
        let bytes = encode(IMAGES_MAGIC, &[u32::MAX as usize; 3], &[]);
        let err = parse(&bytes[..], p(), IMAGES_MAGIC).unwrap_err();
        assert!(err.to_string().contains("overflow"), "{err}");
    }

    #[test]
    fn reads_gzip_and_reports_corrupt_gzip() {
        let dir = tempfile::tempdir().unwrap();
        let raw = encode(LABELS_MAGIC, &[4], &[1, 2, 3, 4]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&raw).unwrap();
        let gz = gz.finish().unwrap();
        let good = dir.path().join("labels.gz");
        std::fs::write(&good, &gz).unwrap();
        assert_eq!(read(&good, LABELS_MAGIC).unwrap().data, vec![1, 2, 3, 4]);

        let truncated = dir.path().join("truncated.gz");
        std::fs::write(&truncated, &gz[..gz.len() / 2]).unwrap();
        let err = read(&truncated, LABELS_MAGIC).unwrap_err().to_string();
        assert!(err.contains("truncated.gz"), "{err}");

        let garbage = dir.path().join("garbage.gz");
        std::fs::write(&garbage, b"this is not gzip at all").unwrap();
        let err = read(&garbage, LABELS_MAGIC).unwrap_err().to_string();
        assert!(err.contains("garbage.gz") && err.contains("gzip"), "{err}");
    }
}
