//! Property test ("fuzzing" that runs in CI) of the IDX reader: any bytes, and headers that
//! lie, give a value or an error, never a panic, and never an allocation larger than the input
//! justifies. A counting global allocator records the largest single allocation.

use std::io::Write;
use std::path::Path;

use ember::data::idx::{self, IMAGES_MAGIC, LABELS_MAGIC};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

const CASES: u32 = 4000;

/// Parses `bytes` and returns the largest allocation made while doing it.
fn parse_measured(bytes: &[u8], magic: u32) -> (Result<idx::Idx, String>, usize) {
    counting_alloc::reset_largest();
    let result = idx::parse(bytes, Path::new("fuzz.idx"), magic).map_err(|e| e.to_string());
    (result, counting_alloc::largest())
}

/// What a parse of `len` input bytes may allocate: the payload buffer grows by doubling up to
/// the input's size, plus small bookkeeping (error strings, dimension vectors).
fn budget(len: usize) -> usize {
    2 * len + 4096
}

/// An IDX header with these fields, followed by `payload`.
fn idx_bytes(magic: u32, dims: &[u32], payload: &[u8]) -> Vec<u8> {
    let mut v = magic.to_be_bytes().to_vec();
    for d in dims {
        v.extend_from_slice(&d.to_be_bytes());
    }
    v.extend_from_slice(payload);
    v
}

// One test so that the allocation counter sees no other test's allocations.
#[test]
fn idx_reader_survives_arbitrary_and_lying_inputs() {
    // A fresh runner per property: a runner that has finished its cases runs no more.
    let runner = || {
        TestRunner::new(Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        })
    };
    let tried = std::cell::Cell::new(0usize);

    // 1. Arbitrary bytes, read as images and as labels.
    runner()
        .run(&proptest::collection::vec(any::<u8>(), 0..2048), |bytes| {
            tried.set(tried.get() + 1);
            for magic in [IMAGES_MAGIC, LABELS_MAGIC] {
                let (_, largest) = parse_measured(&bytes, magic);
                prop_assert!(
                    largest <= budget(bytes.len()),
                    "{largest} bytes allocated for a {}-byte input",
                    bytes.len()
                );
            }
            Ok(())
        })
        .unwrap();

    // 2. Well-formed headers whose dimensions may lie about the payload, huge ones included.
    let dim = prop_oneof![0u32..40, any::<u32>(), Just(u32::MAX), Just(1 << 31)];
    let strategy = (
        prop_oneof![Just(IMAGES_MAGIC), Just(LABELS_MAGIC), any::<u32>()],
        proptest::collection::vec(dim, 3),
        proptest::collection::vec(any::<u8>(), 0..4096),
    );
    let lying = std::cell::Cell::new(0usize);
    runner()
        .run(&strategy, |(magic, dims, payload)| {
            tried.set(tried.get() + 1);
            let rank = (magic & 0xff) as usize;
            let dims = &dims[..rank.min(3)];
            let bytes = idx_bytes(magic, dims, &payload);
            let (result, largest) = parse_measured(&bytes, magic);
            prop_assert!(
                largest <= budget(bytes.len()),
                "{largest} bytes allocated for a {}-byte input",
                bytes.len()
            );
            let expected: Option<usize> = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d as usize));
            if expected.is_some_and(|n| n > 1 << 20) {
                lying.set(lying.get() + 1);
            }
            match result {
                Ok(parsed) => {
                    prop_assert_eq!(rank, dims.len());
                    prop_assert_eq!(Some(payload.len()), expected);
                    prop_assert_eq!(parsed.data, payload);
                }
                Err(e) => {
                    prop_assert!(e.starts_with("fuzz.idx: "), "error does not name the file: {}", e);
                    prop_assert!(
                        rank != dims.len() || Some(payload.len()) != expected,
                        "valid input rejected: {}",
                        e
                    );
                }
            }
            Ok(())
        })
        .unwrap();

    // 3. Gzip streams: valid ones cut anywhere, and garbage, through the file reader.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t10k-labels-idx1-ubyte.gz");
    let labels = idx_bytes(LABELS_MAGIC, &[300], &[7; 300]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&labels).unwrap();
    let gz = gz.finish().unwrap();
    let gz_len = gz.len();
    let cut_or_garbage = prop_oneof![
        (0..gz_len).prop_map(move |n| gz[..n].to_vec()),
        proptest::collection::vec(any::<u8>(), 0..512),
    ];
    runner()
        .run(&cut_or_garbage, |bytes| {
            tried.set(tried.get() + 1);
            std::fs::write(&file, &bytes).unwrap();
            match idx::read(&file, LABELS_MAGIC) {
                Ok(parsed) => prop_assert_eq!(parsed.data.len(), 300),
                Err(e) => prop_assert!(e.to_string().contains("t10k-labels-idx1-ubyte.gz"), "{}", e),
            }
            Ok(())
        })
        .unwrap();
    let (tried, lying) = (tried.get(), lying.get());
    // The properties really ran, headers claiming over a MiB that is not there included.
    assert!(tried >= 3 * CASES as usize, "only {tried} inputs");
    assert!(lying > CASES as usize / 20, "only {lying} lying headers");
    eprintln!("idx property test: {tried} inputs ({lying} headers claiming > 1 MiB), no panic, no allocation beyond 2 x input + 4 KiB");
}
