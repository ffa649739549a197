//! `torch.save` archives written the way PyTorch writes them (a protocol-2 pickle of a dict of
//! `_rebuild_tensor_v2` calls over persistent storages, stored zip entries), with every field
//! the tests' to choose, so that they can lie. `tests/fixtures/pytorch-example-net.pt` is one that
//! PyTorch itself wrote; `pickletools.dis` on its `data.pkl` shows the same opcodes.

use std::io::{Cursor, Write};

use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

/// One tensor: a view (`shape`, `stride`, `offset`, in elements) of storage `key`, which the
/// pickle says holds `storage_len` elements of `class` (`FloatStorage`, ...).
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub class: String,
    pub key: String,
    pub storage_len: i64,
    pub offset: i64,
    pub shape: Vec<i64>,
    pub stride: Vec<i64>,
}

impl Tensor {
    /// A contiguous f32 tensor alone in storage `key`.
    pub fn contiguous(name: &str, key: &str, shape: &[usize]) -> Tensor {
        let mut stride = vec![1i64; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            stride[d] = stride[d + 1] * shape[d + 1] as i64;
        }
        Tensor {
            name: name.into(),
            class: "FloatStorage".into(),
            key: key.into(),
            storage_len: shape.iter().product::<usize>() as i64,
            offset: 0,
            shape: shape.iter().map(|&d| d as i64).collect(),
            stride,
        }
    }
}

fn int(p: &mut Vec<u8>, v: i64) {
    if let Ok(v) = i32::try_from(v) {
        p.push(b'J');
        p.extend_from_slice(&v.to_le_bytes());
    } else {
        p.extend_from_slice(&[0x8a, 8]);
        p.extend_from_slice(&v.to_le_bytes());
    }
}

fn unicode(p: &mut Vec<u8>, s: &str) {
    p.push(b'X');
    p.extend_from_slice(&(s.len() as u32).to_le_bytes());
    p.extend_from_slice(s.as_bytes());
}

fn ints(p: &mut Vec<u8>, v: &[i64]) {
    p.push(b'(');
    for &x in v {
        int(p, x);
    }
    p.push(b't');
}

/// `data.pkl` for a dict of these tensors.
pub fn pickle(tensors: &[Tensor]) -> Vec<u8> {
    let mut p = vec![0x80, 2, b'}', b'('];
    for t in tensors {
        unicode(&mut p, &t.name);
        p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n(");
        p.push(b'(');
        unicode(&mut p, "storage");
        p.extend_from_slice(format!("ctorch\n{}\n", t.class).as_bytes());
        unicode(&mut p, &t.key);
        unicode(&mut p, "cpu");
        int(&mut p, t.storage_len);
        p.extend_from_slice(b"tQ");
        int(&mut p, t.offset);
        ints(&mut p, &t.shape);
        ints(&mut p, &t.stride);
        p.extend_from_slice(b"\x89ccollections\nOrderedDict\n)Rt");
        p.push(b'R');
    }
    p.extend_from_slice(b"u.");
    p
}

/// A zip of stored entries under `archive/`: `data.pkl`, `byteorder`, and each `(key, bytes)`
/// as `data/<key>`.
pub fn archive(pickle: &[u8], storages: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    let stored = SimpleFileOptions::default().compression_method(CompressionMethod::Stored);
    let mut entry = |name: &str, bytes: &[u8]| {
        zip.start_file(format!("archive/{name}"), stored).unwrap();
        zip.write_all(bytes).unwrap();
    };
    entry("data.pkl", pickle);
    entry("byteorder", b"little");
    for (key, bytes) in storages {
        entry(&format!("data/{key}"), bytes);
    }
    entry("version", b"3\n");
    zip.finish().unwrap().into_inner()
}

/// Little-endian f32 bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}
