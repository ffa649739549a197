//! A counting global allocator for the tests that bound memory: the largest single allocation
//! and the peak of live bytes. Included with `#[path]` only by those tests, so that the other
//! test binaries keep the system allocator unobserved. A test binary that uses it should hold a
//! single test, so that no other test's allocations are counted.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

pub struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

/// An allocation of `size` bytes that changes the live total by `grow`.
fn note(size: usize, grow: isize) {
    LARGEST.fetch_max(size, Ordering::Relaxed);
    let now = LIVE.fetch_add(grow, Ordering::Relaxed) + grow;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size(), layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size(), layout.size() as isize);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size, new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Starts counting the largest single allocation afresh.
pub fn reset_largest() {
    LARGEST.store(0, Ordering::Relaxed);
}

/// The largest single allocation (or reallocation's new size) since [`reset_largest`].
pub fn largest() -> usize {
    LARGEST.load(Ordering::Relaxed)
}

/// Starts measuring the peak of live bytes from now; returns the bytes live now.
pub fn reset_peak() -> isize {
    let now = LIVE.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// The most bytes live at once since [`reset_peak`].
pub fn peak() -> isize {
    PEAK.load(Ordering::Relaxed)
}
