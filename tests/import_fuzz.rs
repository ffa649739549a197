//! Property test ("fuzzing" that runs in CI) of `ember import --from pytorch`'s reader: arbitrary
//! bytes, the PyTorch-written fixture with its zip headers lying, and archives whose pickle lies
//! about shapes, strides, offsets, storage sizes, types and keys, or whose storages are cut short,
//! missing or altered. Each gives a model whose every value is the file's, or a one-line error
//! that names the file; never a panic, and never more memory than the file and the model justify.
//! A counting global allocator records the peak of live bytes during each import.

use std::cell::Cell;
use std::path::{Path, PathBuf};

use burn::backend::NdArray;
use ember::import::{from_pytorch_file, to_pytorch_tensors};
use ember::model::ModelKind;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[path = "common/torch_save.rs"]
mod torch_save;

use torch_save::{archive, f32_bytes, pickle, Tensor};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

const KIND: ModelKind = ModelKind::PytorchExampleNet;

/// Imports `bytes` from a file and returns the result (the model's tensors in PyTorch's layout,
/// or the error as the CLI prints it) and the peak of bytes allocated beyond what was live before.
fn import_measured(bytes: &[u8], file: &Path) -> (Result<Vec<(String, Vec<f32>)>, String>, usize) {
    std::fs::write(file, bytes).unwrap();
    let before = counting_alloc::reset_peak();
    let result = from_pytorch_file::<NdArray>(KIND, file, &Default::default())
        .map(|model| {
            to_pytorch_tensors(&model)
                .into_iter()
                .map(|(n, d)| (n, d.to_vec::<f32>().unwrap()))
                .collect()
        })
        .map_err(|e| format!("{:#}", anyhow::Error::from(e)));
    let peak = (counting_alloc::peak() - before).max(0) as usize;
    (result, peak)
}

/// The model's parameters by PyTorch name, shape and (random) values: what the generated
/// archives hold.
fn parameters() -> Vec<(String, Vec<usize>, Vec<f32>)> {
    to_pytorch_tensors(&KIND.init::<NdArray>(&Default::default()))
        .into_iter()
        .map(|(name, data)| {
            let shape = data.shape.to_vec();
            (name, shape, data.to_vec::<f32>().unwrap())
        })
        .collect()
}

/// The values a view selects from a storage of little-endian f32s, or `None` where it reaches
/// outside it: an implementation independent of ember's.
fn view(t: &Tensor, storage: &[u8]) -> Option<Vec<f32>> {
    let elements: Vec<f32> = storage
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let shape: Vec<usize> = t
        .shape
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .collect::<Option<_>>()?;
    let mut out = Vec::new();
    let numel: usize = shape.iter().product();
    for flat in 0..numel {
        let mut rest = flat;
        let mut at = t.offset as i128;
        for d in (0..shape.len()).rev() {
            at += (rest % shape[d]) as i128 * t.stride[d] as i128;
            rest /= shape[d];
        }
        out.push(*elements.get(usize::try_from(at).ok()?)?);
    }
    Some(out)
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch-example-net.pt")
}

/// The offsets of each field that a zip reader trusts: sizes, offsets, counts and compression
/// methods in local headers, central directory entries and the end record.
fn zip_fields(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut fields = Vec::new();
    for i in 0..bytes.len().saturating_sub(4) {
        match &bytes[i..i + 4] {
            b"PK\x03\x04" => fields.extend([(i + 8, 2), (i + 18, 4), (i + 22, 4), (i + 26, 2), (i + 28, 2)]),
            b"PK\x01\x02" => fields.extend([
                (i + 10, 2),
                (i + 20, 4),
                (i + 24, 4),
                (i + 28, 2),
                (i + 30, 2),
                (i + 42, 4),
            ]),
            b"PK\x05\x06" => fields.extend([(i + 8, 2), (i + 10, 2), (i + 12, 4), (i + 16, 4)]),
            _ => {}
        }
    }
    fields.retain(|&(at, n)| at + n <= bytes.len());
    fields
}

/// How a generated archive departs from the model's true state_dict.
#[derive(Clone, Debug)]
enum Lie {
    Shape(usize, i64),
    Stride(usize, i64),
    Offset(i64),
    StorageLen(i64),
    Class(&'static str),
    Key(&'static str),
    /// The storage's bytes cut to this many (or grown by zeros to it).
    StorageBytes(usize),
    DropStorage,
    /// The tensor shares the previous tensor's storage.
    ShareStorage,
    Nan(usize),
    /// The pickle cut at this fraction of its length, or one byte of it overwritten.
    CutPickle(f64),
    PickleByte(f64, u8),
}

fn big() -> impl Strategy<Value = i64> {
    prop_oneof![
        -2i64..70000,
        any::<i64>(),
        Just(i64::MAX),
        Just(i64::MIN),
        Just(1 << 31),
        Just(1 << 40),
        Just(-1),
    ]
}

fn lie() -> impl Strategy<Value = Lie> {
    prop_oneof![
        (0usize..4, big()).prop_map(|(d, v)| Lie::Shape(d, v)),
        (0usize..4, big()).prop_map(|(d, v)| Lie::Stride(d, v)),
        big().prop_map(Lie::Offset),
        big().prop_map(Lie::StorageLen),
        prop::sample::select(vec![
            "DoubleStorage",
            "HalfStorage",
            "BFloat16Storage",
            "LongStorage",
            "BoolStorage",
            "ComplexDoubleStorage",
            "NoSuchStorage",
        ])
        .prop_map(Lie::Class),
        prop::sample::select(vec!["../../etc/passwd", "", "/abs", "7", "data.pkl", "..", "1"])
            .prop_map(Lie::Key),
        (0usize..5_000_000).prop_map(Lie::StorageBytes),
        Just(Lie::DropStorage),
        Just(Lie::ShareStorage),
        (0usize..100).prop_map(Lie::Nan),
        (0.0..1.0f64).prop_map(Lie::CutPickle),
        (0.0..1.0f64, any::<u8>()).prop_map(|(at, b)| Lie::PickleByte(at, b)),
    ]
}

// One test so that the allocation counter sees no other test's allocations.
#[test]
fn pytorch_import_survives_arbitrary_and_lying_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lying.pt");
    let name = file.display().to_string();
    let runner = |cases| {
        TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        })
    };
    let fixture = std::fs::read(fixture()).unwrap();

    // The unaltered fixture imports; what that takes is the yardstick for everything else.
    let (result, baseline) = import_measured(&fixture, &file);
    let true_values = result.unwrap();
    // A file may cost what the import of a true one does, plus a few times its own length; a
    // bomb asks for gigabytes.
    let budget = |len: usize| 2 * baseline + 4 * len + (1 << 20);
    let checked = |result: &Result<Vec<(String, Vec<f32>)>, String>, peak: usize, len: usize| {
        prop_assert!(
            peak <= budget(len),
            "{peak} bytes live for a {len}-byte file: {result:?}"
        );
        if let Err(e) = result {
            prop_assert!(
                e.starts_with(&format!("{name}: ")),
                "error does not name the file: {e}"
            );
            prop_assert!(!e.contains('\n'), "error of more than one line: {e}");
        }
        Ok(())
    };
    let (errors, tried) = (Cell::new(0usize), Cell::new(0usize));

    // 0. Known bombs, each a few hundred bytes: a pickle whose memo is fetched twice per level
    //    (2^40 elements if fetching copied), strings claiming 2^60 and 4 GiB, a storage claiming
    //    10^12 elements that the file does not hold.
    let mut doubling = vec![0x80, 2, b'}', b'(', b'X', 1, 0, 0, 0, b'a', b']', b'q', 0];
    for _ in 0..40 {
        doubling.extend_from_slice(&[b'(', b'h', 0, b'h', 0, b'l', b'q', 0]);
    }
    doubling.extend_from_slice(b"u.");
    let huge_string = [&[0x80, 2, b'}', 0x8d][..], &(1u64 << 60).to_le_bytes(), b"ab."].concat();
    let long_string = [&[0x80, 2, b'}', b'X'][..], &u32::MAX.to_le_bytes(), b"ab."].concat();
    let mut huge_storage = Tensor::contiguous("fc1.weight", "0", &[128, 9216]);
    huge_storage.storage_len = 1_000_000_000_000;
    huge_storage.shape = vec![1_000_000, 1_000_000];
    huge_storage.stride = vec![1_000_000, 1];
    for (what, bytes) in [
        ("memo doubling", archive(&doubling, &[])),
        ("2^60-byte string", archive(&huge_string, &[])),
        ("4 GiB string", archive(&long_string, &[])),
        (
            "10^12-element storage",
            archive(&pickle(&[huge_storage]), &[("0".into(), vec![0; 64])]),
        ),
    ] {
        let (result, peak) = import_measured(&bytes, &file);
        let e = result.expect_err(what);
        assert!(peak <= budget(bytes.len()), "{what}: {peak} bytes live");
        assert!(
            e.starts_with(&format!("{name}: ")) && !e.contains('\n'),
            "{what}: {e}"
        );
        tried.set(tried.get() + 1);
    }

    // 1. Arbitrary bytes, and arbitrary bytes behind a zip's signature.
    let arbitrary = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..4096),
        proptest::collection::vec(any::<u8>(), 0..4096).prop_map(|mut v| {
            v.splice(0..0, *b"PK\x03\x04");
            v
        }),
    ];
    runner(1000)
        .run(&arbitrary, |bytes| {
            tried.set(tried.get() + 1);
            let (result, peak) = import_measured(&bytes, &file);
            checked(&result, peak, bytes.len())?;
            prop_assert!(result.is_err());
            errors.set(errors.get() + 1);
            Ok(())
        })
        .unwrap();

    // 2. The PyTorch-written fixture with its zip's sizes, offsets, counts or methods lying, or
    //    cut short anywhere.
    let fields = zip_fields(&fixture);
    assert!(fields.len() > 60, "{} zip fields found", fields.len());
    let lying_zip = prop_oneof![
        (prop::sample::select(fields), any::<u32>(), 0..3usize).prop_map({
            let fixture = fixture.clone();
            move |((at, n), value, how)| {
                let mut v = fixture.clone();
                let value = match how {
                    0 => value,
                    1 => u32::MAX,
                    _ => value % 64,
                };
                v[at..at + n].copy_from_slice(&value.to_le_bytes()[..n]);
                v
            }
        }),
        (0..fixture.len()).prop_map({
            let fixture = fixture.clone();
            move |n| fixture[..n].to_vec()
        }),
    ];
    runner(300)
        .run(&lying_zip, |bytes| {
            tried.set(tried.get() + 1);
            let (result, peak) = import_measured(&bytes, &file);
            checked(&result, peak, bytes.len())?;
            if let Ok(tensors) = &result {
                // Only a field nobody reads changed: the values are the fixture's.
                prop_assert!(true_values == *tensors);
            } else {
                errors.set(errors.get() + 1);
            }
            Ok(())
        })
        .unwrap();

    // 3. Generated archives of the model's state_dict with one lie each.
    let params = parameters();
    let strategy = (0..params.len(), lie());
    let (imported, lies_caught) = (Cell::new(0usize), Cell::new(0usize));
    runner(600)
        .run(&strategy, |(which, lie)| {
            tried.set(tried.get() + 1);
            let mut tensors: Vec<Tensor> = params
                .iter()
                .enumerate()
                .map(|(i, (n, shape, _))| Tensor::contiguous(n, &i.to_string(), shape))
                .collect();
            let mut storages: Vec<(String, Vec<u8>)> = params
                .iter()
                .enumerate()
                .map(|(i, (_, _, v))| (i.to_string(), f32_bytes(v)))
                .collect();
            let t = &mut tensors[which];
            let mut pickle_edit: Option<Lie> = None;
            match &lie {
                Lie::Shape(d, v) => {
                    if let Some(x) = t.shape.get_mut(*d) {
                        *x = *v
                    }
                }
                Lie::Stride(d, v) => {
                    if let Some(x) = t.stride.get_mut(*d) {
                        *x = *v
                    }
                }
                Lie::Offset(v) => t.offset = *v,
                Lie::StorageLen(v) => t.storage_len = *v,
                Lie::Class(c) => t.class = c.to_string(),
                Lie::Key(k) => t.key = k.to_string(),
                Lie::StorageBytes(n) => storages[which].1.resize(*n, 0),
                Lie::DropStorage => drop(storages.remove(which)),
                Lie::ShareStorage if which > 0 => {
                    t.key = (which - 1).to_string();
                    storages.remove(which);
                }
                Lie::ShareStorage => {}
                Lie::Nan(i) => {
                    let at = i % (storages[which].1.len() / 4);
                    storages[which].1[4 * at..4 * at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
                }
                Lie::CutPickle(_) | Lie::PickleByte(..) => pickle_edit = Some(lie.clone()),
            }
            let mut p = pickle(&tensors);
            match pickle_edit {
                Some(Lie::CutPickle(f)) => p.truncate((p.len() as f64 * f) as usize),
                Some(Lie::PickleByte(f, b)) => {
                    let at = (p.len() as f64 * f) as usize;
                    p[at] = b;
                }
                _ => {}
            }
            let bytes = archive(&p, &storages);
            let (result, peak) = import_measured(&bytes, &file);
            checked(&result, peak, bytes.len())?;
            match result {
                Ok(got) => {
                    imported.set(imported.get() + 1);
                    // Whatever was accepted is exactly what the file says, tensor by tensor;
                    // a pickle edit that still parses may have changed any of them.
                    if pickle_edit.is_none() {
                        for ((name, data), t) in got.iter().zip(&tensors) {
                            prop_assert_eq!(name, &t.name);
                            let storage = &storages.iter().find(|(k, _)| *k == t.key).unwrap().1;
                            let want = view(t, storage).expect("accepted a view outside its storage");
                            prop_assert!(*data == want, "{} differs", name);
                        }
                    }
                }
                Err(e) => {
                    errors.set(errors.get() + 1);
                    lies_caught.set(lies_caught.get() + 1);
                    let _ = e;
                }
            }
            Ok(())
        })
        .unwrap();

    let (tried, errors) = (tried.get(), errors.get());
    assert!(tried >= 1900, "only {tried} files");
    // Most lies are caught; the rest (a stride over a dimension of 1, a byte in a name that
    // still reads) import the file's own values, which the loop above checked.
    assert!(
        lies_caught.get() > 400,
        "{} of 600 lies caught",
        lies_caught.get()
    );
    eprintln!(
        "import property test: {tried} files, {errors} refused, {} generated ones imported; \
         no panic, peak live bytes within 2 x a true import ({baseline} B) + 4 x the file + 1 MiB",
        imported.get()
    );
}
