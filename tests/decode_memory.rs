//! Memory that decoding an image folder holds, counted by this binary's allocator (issue 25):
//! decodes share what the memory budget leaves beside the dataset, however many threads run,
//! and a PNG's metadata cannot inflate past what its header said.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ember::data::folder;
use ember::data::LoadOptions;

/// The system allocator, counting the bytes live now and the most live since [`reset_peak`].
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to `System` with the caller's arguments unchanged; the counters are
// plain atomics and allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `layout` is the caller's, as `GlobalAlloc::alloc` requires.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with this `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// One test at a time: the counters are the process's.
static SERIAL: Mutex<()> = Mutex::new(());

/// Bytes allocated at the peak of `f`, beyond those live before it.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - before)
}

const MIB: usize = 1 << 20;

/// A 16-bit RGBA PNG of `side` x `side`: 8 bytes a pixel once decoded, a small file.
fn rgba16_png(path: &Path, side: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let img = image::ImageBuffer::<image::Rgba<u16>, _>::from_fn(side, side, |x, y| {
        image::Rgba([(x % 256) as u16 * 200, (y % 256) as u16 * 200, 30_000, 65_535])
    });
    img.save(path).unwrap();
}

#[test]
fn decoding_holds_at_most_what_the_budget_leaves_beside_the_dataset() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    rgba16_png(&root.join("a/0.png"), 3000);
    std::fs::create_dir_all(root.join("b")).unwrap();
    for (class, i) in [
        ("a", 1),
        ("a", 2),
        ("a", 3),
        ("b", 0),
        ("b", 1),
        ("b", 2),
        ("b", 3),
    ] {
        std::fs::copy(root.join("a/0.png"), root.join(class).join(format!("{i}.png"))).unwrap();
    }
    // Each decode: 3000x3000 at 8 bytes (69 MiB), its RGB conversion (26 MiB), the resizer's
    // intermediate and 4 MiB: about 98 MiB. Four threads would hold four at once (the training
    // and test images are decoded one split after the other, four each).
    let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
    let load = |budget: u64| {
        let options = LoadOptions {
            image_size: Some([28, 28]),
            channels: Some(3),
            val_fraction: 0.5,
            max_memory: budget,
            ..LoadOptions::default()
        };
        peak_of(|| pool.install(|| folder::load(root, "folder", &options).unwrap()))
    };
    let (data, peak) = load(150 << 20);
    let held = data.report.decode_peak as usize;
    eprintln!(
        "budget 150 MiB: decoding held {} MiB (estimated), {} MiB allocated at the peak",
        held / MIB,
        peak / MIB
    );
    assert!((90 * MIB..=150 * MIB).contains(&held), "{held}");
    assert!(peak < 160 * MIB, "{} MiB at the peak", peak / MIB);
    assert_eq!(data.train.len() + data.test.len(), 8);

    // With room for all four, four threads decode four at once: what the bound holds back.
    let (data, peak) = load(1 << 30);
    let held = data.report.decode_peak as usize;
    eprintln!(
        "budget 1 GiB: decoding held {} MiB (estimated), {} MiB allocated at the peak",
        held / MIB,
        peak / MIB
    );
    assert!(held > 300 * MIB && peak > 300 * MIB, "{held} {peak}");

    // A budget below one decode: the file is named, nothing decoded.
    let options = LoadOptions {
        image_size: Some([28, 28]),
        val_fraction: 0.5,
        max_memory: 50 << 20,
        ..LoadOptions::default()
    };
    let err = folder::load(root, "folder", &options).unwrap_err().to_string();
    assert!(
        err.contains(
            ".png: 3000x3000 pixels at 8 bytes each: decoding takes 98.66 MiB, more than the 49.93 MiB"
        ),
        "{err}"
    );
}

/// A PNG chunk: length, type, data, CRC of type and data.
fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc = flate2::Crc::new();
    crc.update(kind);
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_be_bytes());
    out
}

/// The PNG decoder leaves out a profile past its limit and decodes the pixels (as PIL, which
/// does not apply profiles either); what matters is that the profile is not inflated. Before
/// the header was read with limits too, this folder peaked at 396 MiB.
#[test]
fn an_icc_profile_that_inflates_to_256_mib_costs_no_more_than_the_images_own_budget() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut png = Vec::new();
    image::GrayImage::from_fn(28, 28, |x, _| image::Luma([x as u8 * 9]))
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    // iCCP after IHDR (8-byte signature, 25-byte IHDR chunk): a name, compression method 0 and
    // a zlib stream of 256 MiB of zeros (about 256 KiB compressed).
    let mut zeros = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let block = vec![0u8; MIB];
    for _ in 0..256 {
        std::io::Write::write_all(&mut zeros, &block).unwrap();
    }
    let mut iccp = b"bomb\0\0".to_vec();
    iccp.extend(zeros.finish().unwrap());
    let mut bomb = png[..33].to_vec();
    bomb.extend(chunk(b"iCCP", &iccp));
    bomb.extend_from_slice(&png[33..]);
    for class in ["a", "b"] {
        for i in 0..2 {
            let path = root.join(class).join(format!("{i}.png"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, if (class, i) == ("a", 0) { &bomb } else { &png }).unwrap();
        }
    }
    let options = LoadOptions {
        val_fraction: 0.5,
        ..LoadOptions::default()
    };
    let (result, peak) = peak_of(|| folder::load(root, "folder", &options));
    eprintln!("{} MiB allocated at the peak", peak / MIB);
    assert!(peak < 16 * MIB, "{} MiB at the peak", peak / MIB);
    let data = result.unwrap();
    assert_eq!(data.train.len() + data.test.len(), 4);
    // The bomb's pixels are the plain file's.
    let plain = folder::load(&root.join("b"), "b", &LoadOptions::default());
    assert!(plain.is_err(), "b alone has no classes: {plain:?}");
    let first: Vec<u8> = (0..28 * 28).map(|i| (i % 28) as u8 * 9).collect();
    assert!(
        data.train
            .images
            .chunks(28 * 28)
            .chain(data.test.images.chunks(28 * 28))
            .all(|img| img == first),
        "an image differs from the plain one"
    );
}
