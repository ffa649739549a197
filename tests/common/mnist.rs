//! The repository's own MNIST (`data/mnist`, committed), loaded offline.

use std::path::Path;

use ember::data::{Dataset, Mnist, Source};

pub fn load() -> Mnist {
    Mnist::load(&Source {
        dataset: Dataset::Mnist,
        dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist"),
        download: false,
    })
    .unwrap()
}
