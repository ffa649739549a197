//! Image files whose headers claim huge sizes: `ember predict`'s loader refuses them from the
//! header, naming the file, before allocating anything for their pixels. A counting global
//! allocator records the largest single allocation while each file is loaded.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::claiming_png;
use ember::predict;

struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

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
        LARGEST.store(0, Ordering::Relaxed);
        let err = predict::load(&path).unwrap_err().to_string();
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            err.contains(&format!("claims-{w}x{h}.png")) && err.contains(&format!("{w}x{h} pixels")),
            "{err}"
        );
        assert!(largest < 1 << 20, "{w}x{h}: allocated {largest} bytes at once");
    }

    // A real digit-sized image still loads, within a small budget.
    let path = dir.path().join("digit.png");
    std::fs::write(&path, claiming_png(28, 28)).unwrap();
    LARGEST.store(0, Ordering::Relaxed);
    predict::load(&path).unwrap();
    assert!(LARGEST.load(Ordering::Relaxed) < 1 << 20);
}
