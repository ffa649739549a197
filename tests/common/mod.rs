//! What the integration tests share: the `ember` binary as a test runs it, and the repository's
//! own MNIST (`data/mnist`, committed), so that no test needs a network or `../shared`. Each
//! test file is its own crate and uses only some of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ember::data::{Dataset, Mnist, Source};

/// The release `ember` binary, offline, with no data folder from the user's environment.
pub fn ember() -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("ember").unwrap();
    // Tests never reach the network; a user's own setting must not leak in either.
    cmd.env("EMBER_OFFLINE", "true").env_remove("EMBER_DATA_DIR");
    cmd
}

/// The repository's MNIST folder.
pub fn repo_mnist() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist")
}

/// The repository's MNIST, loaded offline.
pub fn load_mnist() -> Mnist {
    Mnist::load(&Source {
        dataset: Dataset::Mnist,
        dir: repo_mnist(),
        download: false,
    })
    .unwrap()
}
