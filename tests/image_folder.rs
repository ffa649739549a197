//! Training on a folder of images (`--dataset folder:PATH`), built here as PNG files from
//! Fashion-MNIST's test images (`data/fashion-mnist`, committed): the folder reads back as the
//! IDX images byte for byte and trains to the same model; a folder with colour and other sizes
//! trains well above chance and `ember predict` names its classes; bad files are one-line
//! errors, or skipped and counted, in bounded memory.

mod common;

use std::path::{Path, PathBuf};

use burn::backend::Autodiff;
use common::ember;
use ember::backend::Cpu;
use ember::checkpoint::RunDir;
use ember::data::{idx, Data, DatasetSpec, ImageShape, LoadOptions, Split};
use ember::train::{evaluate, init_model, train_whole_epoch, EpochEnd, Splits};
use image::{GrayImage, Luma, Rgb, RgbImage};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

/// Fashion-MNIST's class names as folder names that sort in label order.
const CLASSES: [&str; 10] = [
    "0-T-shirt",
    "1-Trouser",
    "2-Pullover",
    "3-Dress",
    "4-Coat",
    "5-Sandal",
    "6-Shirt",
    "7-Sneaker",
    "8-Bag",
    "9-Ankle-boot",
];

/// Fashion-MNIST's 10,000 test images and labels.
fn fashion_test() -> (Vec<u8>, Vec<u8>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/fashion-mnist");
    let images = idx::read(&dir.join("t10k-images-idx3-ubyte.gz"), idx::IMAGES_MAGIC).unwrap();
    let labels = idx::read(&dir.join("t10k-labels-idx1-ubyte.gz"), idx::LABELS_MAGIC).unwrap();
    assert_eq!(images.dims, [10_000, 28, 28]);
    (images.data, labels.data)
}

fn grey(pixels: &[u8]) -> GrayImage {
    GrayImage::from_raw(28, 28, pixels.to_vec()).unwrap()
}

/// `ROOT/<split>/<class>/<index>.png` for the images at `range`; `style(i, image)` may turn an
/// image into colour or another size. Returns the indices in the order an image folder reads
/// them: class by class, then by file name.
fn write_split(
    root: &Path,
    split: &str,
    range: std::ops::Range<usize>,
    (images, labels): &(Vec<u8>, Vec<u8>),
    style: &dyn Fn(usize, GrayImage) -> image::DynamicImage,
) -> Vec<usize> {
    for c in CLASSES {
        std::fs::create_dir_all(root.join(split).join(c)).unwrap();
    }
    for i in range.clone() {
        let img = style(i, grey(&images[i * 784..(i + 1) * 784]));
        img.save(
            root.join(split)
                .join(CLASSES[labels[i] as usize])
                .join(format!("{i:05}.png")),
        )
        .unwrap();
    }
    let mut order: Vec<usize> = range.collect();
    order.sort_by_key(|&i| labels[i]);
    order
}

/// The IDX images at `order`, as a split.
fn idx_split((images, labels): &(Vec<u8>, Vec<u8>), order: &[usize]) -> Split {
    Split {
        images: order
            .iter()
            .flat_map(|&i| images[i * 784..(i + 1) * 784].to_vec())
            .collect(),
        labels: order.iter().map(|&i| u16::from(labels[i])).collect(),
        shape: ImageShape::MNIST,
    }
}

/// The `(correct/total)` of `final: ... accuracy P% (correct/total)`.
fn final_correct(stdout: &str) -> (usize, usize) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("final:"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let inner = line.split_once("% (").unwrap().1.split_once(')').unwrap().0;
    let (a, b) = inner.split_once('/').unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

#[test]
fn a_grey_png_tree_reads_as_its_idx_images_and_trains_to_the_same_model() {
    let fashion = fashion_test();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("fashion");
    let plain = |_: usize, g: GrayImage| image::DynamicImage::ImageLuma8(g);
    let train_order = write_split(&root, "train", 0..2000, &fashion, &plain);
    let test_order = write_split(&root, "test", 2000..2500, &fashion, &plain);

    let data = ember::data::load(&DatasetSpec::Folder(root.clone()), &LoadOptions::default()).unwrap();
    assert_eq!(data.classes, CLASSES);
    assert_eq!(data.report.decoded, 2500);
    assert_eq!(data.report.test_from, "test/");
    let from_idx = Data {
        train: idx_split(&fashion, &train_order),
        test: idx_split(&fashion, &test_order),
        classes: data.classes.clone(),
        report: Default::default(),
    };
    assert!(
        data.train == from_idx.train,
        "the folder's training images differ from the IDX ones"
    );
    assert!(
        data.test == from_idx.test,
        "the folder's test images differ from the IDX ones"
    );

    // ember train on the folder, end to end, with the normalisation the IDX run uses.
    let run_dir = dir.path().join("run");
    let out = ember()
        .args([
            "train",
            "--recipe",
            "pytorch-example",
            "--epochs",
            "1",
            "--batch-size",
            "32",
        ])
        .args([
            "--mean",
            "0.286",
            "--std",
            "0.353",
            "--device",
            "cpu",
            "--run-dir",
        ])
        .arg(&run_dir)
        .arg("--dataset")
        .arg(format!("folder:{}", root.display()))
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(stdout.contains("read 2500 images"), "{stdout}");
    let (correct, total) = final_correct(&stdout);
    assert_eq!(total, 500);
    println!("grey folder, pytorch-example, 1 epoch on 2,000 images: {correct}/{total}");
    assert!(
        correct > 300,
        "{correct}/500 after one epoch on 2,000 images; chance is 50: {stdout}"
    );

    // The same run on the IDX images in the folder's order, through the library.
    let config = RunDir::open(&run_dir).unwrap().load_config().unwrap();
    assert_eq!(config.classes, CLASSES);
    assert_eq!(config.input, ImageShape::MNIST);
    let device = Default::default();
    let splits = Splits::<Cpu>::upload(&from_idx, &config, &device).unwrap();
    let model = init_model::<Autodiff<Cpu>>(&config, &device);
    let mut optim = config.optimizer.init();
    let (model, end) = train_whole_epoch(model, &mut optim, &splits.train, &config, 0);
    assert!(matches!(end, EpochEnd::Done(_)), "{end:?}");
    let stats = evaluate(
        &burn::module::AutodiffModule::valid(&model),
        &splits.test,
        config.test_batch_size,
    );
    assert_eq!(
        (stats.correct, stats.total),
        (correct, total),
        "the folder run and the IDX run differ"
    );
}

#[test]
fn colour_and_other_sizes_train_well_above_chance_and_predict_names_classes() {
    let fashion = fashion_test();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mixed");
    // Every 5th image tinted in colour, every 7th drawn at 2x or 1.5x x 1x.
    let mixed = |i: usize, g: GrayImage| {
        let img = if i % 5 == 0 {
            image::DynamicImage::ImageRgb8(RgbImage::from_fn(28, 28, |x, y| {
                let v = g.get_pixel(x, y).0[0];
                Rgb([v, v / 2, 255 - v])
            }))
        } else {
            image::DynamicImage::ImageLuma8(g)
        };
        match i % 7 {
            0 => img.resize_exact(56, 56, image::imageops::FilterType::Triangle),
            3 => img.resize_exact(42, 28, image::imageops::FilterType::Triangle),
            _ => img,
        }
    };
    write_split(&root, "train", 0..3000, &fashion, &mixed);
    write_split(&root, "val", 3000..3500, &fashion, &mixed);
    let spec = format!("folder:{}", root.display());

    // The seed CNNs take 1x28x28 only: a colour folder is a clear error, and no run is left.
    let refused = dir.path().join("refused");
    let out = ember()
        .args([
            "train",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--dataset",
            &spec,
            "--run-dir",
        ])
        .arg(&refused)
        .assert()
        .failure()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("pytorch-example-net takes 1x28x28 images and this dataset's are 3x28x28")
            && stderr.contains("--channels 1"),
        "{stderr}"
    );
    assert!(!refused.exists());

    // speedrun-net adapts: 3 channels, the recipe's 28x28 for the mixed sizes. Batch 64: the
    // recipe's 256 leaves one-cycle 24 steps on 3,000 images, too few even on MNIST.
    let run_dir = dir.path().join("run");
    let out = ember()
        .args([
            "train",
            "--recipe",
            "speedrun",
            "--epochs",
            "2",
            "--batch-size",
            "64",
            "--device",
            "cpu",
            "--dataset",
            &spec,
        ])
        .arg("--run-dir")
        .arg(&run_dir)
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(stdout.contains("(3x28x28 images, 10 classes)"), "{stdout}");
    assert!(stdout.contains("test set: val/"), "{stdout}");
    // 3500 images: 1/7 + 1/7 of them resized.
    assert!(
        stdout.contains("read 3500 images") && stdout.contains("1000 resized"),
        "{stdout}"
    );
    let (correct, total) = final_correct(&stdout);
    assert_eq!(total, 500);
    println!("colour and mixed sizes, speedrun-net, 2 epochs on 3,000 images: {correct}/{total}");
    assert!(correct > 300, "{correct}/500 (chance: 50): {stdout}");
    let config = RunDir::open(&run_dir).unwrap().load_config().unwrap();
    // Per-channel statistics of the training images, saved.
    assert_eq!(config.normalization.mean.values().len(), 3);
    // ember eval reads the folder again as the run did and gets the run's result.
    let out = ember()
        .args(["eval", "--device", "cpu", "--checkpoint"])
        .arg(&run_dir)
        .assert()
        .success();
    let eval = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(eval.contains(&format!("({correct}/{total})")), "{eval}");

    // ember predict converts files as the run saw them and prints the folder's class names.
    let trouser = root
        .join("val/1-Trouser")
        .read_dir()
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bag = root
        .join("val/8-Bag")
        .read_dir()
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let out = ember()
        .args(["predict", "--checkpoint"])
        .arg(&run_dir)
        .args([&trouser, &bag])
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].contains(": 1-Trouser  ("), "{stdout}");
    assert!(lines[1].contains(": 8-Bag  ("), "{stdout}");
}

/// Three bad files among good ones, each alone a one-line error naming it; all three skipped
/// and counted with `--skip-bad-images`.
#[test]
fn bad_files_are_one_line_errors_or_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("bad");
    for class in ["a", "b"] {
        for i in 0..6 {
            let path = root.join(class).join(format!("{i}.png"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            GrayImage::from_fn(28, 28, |x, y| Luma([(x * y + i) as u8]))
                .save(&path)
                .unwrap();
        }
    }
    let mut full = Vec::new();
    image::GrayImage::from_fn(64, 64, |x, y| Luma([(x ^ y) as u8]))
        .write_to(&mut std::io::Cursor::new(&mut full), image::ImageFormat::Png)
        .unwrap();
    let bad: [(PathBuf, Vec<u8>, &str); 3] = [
        (
            root.join("a/truncated.png"),
            full[..full.len() / 2].to_vec(),
            "truncated.png: ",
        ),
        (
            root.join("b/notes.jpg"),
            b"this is a text file\n".to_vec(),
            "notes.jpg: not a PNG or JPEG image",
        ),
        (
            root.join("b/long.png"),
            common::claiming_png(1_000_000, 1),
            "long.png: 1000000x1 pixels: a side longer than 65535",
        ),
    ];
    let data_cmd = |extra: &[&str]| {
        let mut cmd = ember();
        cmd.args([
            "data",
            "--dataset",
            &format!("folder:{}", root.display()),
            "--val-fraction",
            "0.34",
        ]);
        cmd.args(extra);
        cmd
    };
    for (path, bytes, expected) in &bad {
        std::fs::write(path, bytes).unwrap();
        let out = data_cmd(&[]).assert().failure().code(1);
        let stderr = String::from_utf8_lossy(&out.get_output().stderr).to_string();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("Error: ") && stderr.contains(expected),
            "{stderr}"
        );
        assert!(
            stderr.contains("--skip-bad-images") && !stderr.contains("panicked"),
            "{stderr}"
        );
        std::fs::remove_file(path).unwrap();
    }
    for (path, bytes, _) in &bad {
        std::fs::write(path, bytes).unwrap();
    }
    let out = data_cmd(&["--skip-bad-images"]).assert().success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(
        stdout.contains("skipped 3 unreadable images (--skip-bad-images)"),
        "{stdout}"
    );
    assert!(stdout.contains("read 12 images"), "{stdout}");

    // A training run counts them at the end and lists them in the run directory.
    let run_dir = dir.path().join("run");
    let out = ember()
        .args([
            "train",
            "--recipe",
            "speedrun",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--skip-bad-images",
        ])
        .args([
            "--val-fraction",
            "0.34",
            "--dataset",
            &format!("folder:{}", root.display()),
            "--run-dir",
        ])
        .arg(&run_dir)
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    let last = stdout.lines().last().unwrap();
    assert!(
        last.starts_with("skipped 3 unreadable images") && last.contains("skipped.txt"),
        "{stdout}"
    );
    let listed = std::fs::read_to_string(run_dir.join("skipped.txt")).unwrap();
    assert_eq!(listed.lines().count(), 3, "{listed}");
}

/// A file whose header claims 900 million pixels is refused from the header: nothing near its
/// size is ever allocated, and neither is a full image for the truncated one.
#[test]
fn reading_a_folder_allocates_within_the_pixel_budget() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for class in ["a", "b"] {
        for i in 0..3 {
            let path = root.join(class).join(format!("{i}.png"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            GrayImage::from_pixel(28, 28, Luma([i as u8]))
                .save(&path)
                .unwrap();
        }
    }
    std::fs::write(root.join("a/huge.png"), common::claiming_png(30_000, 30_000)).unwrap();
    let options = LoadOptions {
        val_fraction: 0.34,
        ..LoadOptions::default()
    };
    counting_alloc::reset_largest();
    let err = ember::data::load(&DatasetSpec::Folder(root.to_owned()), &options)
        .unwrap_err()
        .to_string();
    let largest = counting_alloc::largest();
    assert!(
        err.contains("huge.png: 30000x30000 = 900000000 pixels, above the per-image budget of 89478485"),
        "{err}"
    );
    assert!(largest < 16 << 20, "allocated {largest} bytes at once");
    let skipping = LoadOptions {
        skip_bad_images: true,
        ..options
    };
    counting_alloc::reset_largest();
    let data = ember::data::load(&DatasetSpec::Folder(root.to_owned()), &skipping).unwrap();
    assert_eq!(data.report.skipped.len(), 1);
    assert!(counting_alloc::largest() < 16 << 20);
}

#[test]
fn cifar_offline_names_the_missing_files_and_where_they_go() {
    let dir = tempfile::tempdir().unwrap();
    let out = ember()
        .args(["train", "--dataset", "cifar10", "--device", "cpu", "--data-dir"])
        .arg(dir.path())
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .assert()
        .failure()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("Error: cifar10 files missing in")
            && stderr.contains("cifar-10-batches-bin/data_batch_1.bin")
            && stderr.contains("cifar-10-batches-bin/test_batch.bin")
            && stderr.contains("downloads are off (--offline)")
            && stderr.contains("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"),
        "{stderr}"
    );
    assert!(!dir.path().join("run").exists());
}
