//! Trains a model defined outside ember (`net.rs`) through ember's library API: MNIST on the
//! device, the speedrun recipe's Nesterov SGD with a one-cycle schedule, checkpoints,
//! metrics.csv and curves.png in the run directory.
//!
//! ```sh
//! cargo run --release --example custom_model -- [EPOCHS] [RUN_DIR]
//! ```

mod net;

use ember::config::Recipe;
use ember::trainer::Trainer;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let epochs = args.next().map_or(Ok(2), |n| n.parse())?;
    let mut trainer = Trainer::new(Recipe::Speedrun).epochs(epochs);
    trainer.config_mut().target_accuracy = None; // train every epoch asked for
    if let Some(dir) = args.next() {
        trainer = trainer.run_dir(dir);
    }
    let fitted = trainer.fit(net::Residual)?;
    println!(
        "residual-net: test accuracy {} after {epochs} epochs; run in {}",
        fitted.test.accuracy_text(),
        fitted.run.path.display()
    );
    Ok(())
}
