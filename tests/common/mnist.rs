//! The read-only MNIST copy beside the checkout (`../shared/data/mnist`), loaded offline.

use std::path::Path;

use ember::data::{Dataset, Mnist, Source};

pub fn load() -> Mnist {
    Mnist::load(&Source {
        dataset: Dataset::Mnist,
        dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/mnist"),
        download: false,
    })
    .unwrap()
}
