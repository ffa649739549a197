//! Image files whose headers claim huge sizes: `ember predict`'s loader refuses them from the
//! header, naming the file, before allocating anything for their pixels. A counting global
//! allocator records the largest single allocation while each file is loaded.

mod common;

use common::claiming_png;
use ember::predict;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

// One test so that the allocation counter sees no other test's allocations.
#[test]
fn oversized_images_are_refused_from_the_header() {
    let dir = tempfile::tempdir().unwrap();
    // 1 x 1,000,000: padding it to a square would take 10^12 bytes. 20000 x 20000: 400 MB
    // grey, 1.6 GB decoded as RGBA. 1 x 30000: a 900 MB square.
    for (w, h) in [(1_000_000, 1), (1, 1_000_000), (20_000, 20_000), (1, 30_000)] {
        let path = dir.path().join(format!("claims-{w}x{h}.png"));
        let bytes = claiming_png(w, h);
        assert!(bytes.len() < 8 << 10, "{} bytes", bytes.len());
        std::fs::write(&path, &bytes).unwrap();
        counting_alloc::reset_largest();
        let err = predict::load(&path).unwrap_err().to_string();
        let largest = counting_alloc::largest();
        assert!(
            err.contains(&format!("claims-{w}x{h}.png")) && err.contains(&format!("{w}x{h} pixels")),
            "{err}"
        );
        assert!(largest < 1 << 20, "{w}x{h}: allocated {largest} bytes at once");
    }

    // A real digit-sized image still loads, within a small budget.
    let path = dir.path().join("digit.png");
    std::fs::write(&path, claiming_png(28, 28)).unwrap();
    counting_alloc::reset_largest();
    predict::load(&path).unwrap();
    assert!(counting_alloc::largest() < 1 << 20);
}
