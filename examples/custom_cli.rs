//! ember's whole command line (train, eval, predict, bench, import, data, plot, ...) with a
//! model defined outside ember next to the built-in ones:
//!
//! ```sh
//! cargo run --release --example custom_cli -- train --recipe speedrun --model residual-net --epochs 2
//! cargo run --release --example custom_cli -- eval --checkpoint runs/speedrun-...
//! ```

#[path = "custom_model/net.rs"]
mod net;

fn main() {
    ember::cli::main_with(ember::registry::Registry::builtin().with(net::Residual))
}
