//! Trains on real MNIST (the committed `data/mnist`) with the default CPU backend and checks the
//! accuracy on the full 10,000-image test set, then that a checkpoint reloads to the same result.

mod common;

use burn::backend::Autodiff;
use ember::backend::Cpu;
use ember::checkpoint::RunDir;
use ember::config::Recipe;
use ember::progress::Progress;
use ember::train::{evaluate, evaluate_trained, init_model, train_whole_epoch, EpochEnd, Splits};

#[test]
fn one_epoch_reaches_98_percent_and_reloads_identically() {
    let data = common::load_mnist();
    let mut config = Recipe::PytorchExample.config();
    config.epochs = 1;
    // The whole training set: one epoch of the recipe must reach 98% (issue 9's bar). On 20k
    // images the recipe's 97% bar sat inside its seed-to-seed spread (96.8-97.5% for burn's
    // stock ops and ember's kernels alike), so rounding alone could cross it.
    let device = Default::default();
    let splits = Splits::<Cpu>::upload(&data, &config, &device).unwrap();
    assert_eq!((splits.train.len(), splits.test.len()), (60_000, 10_000));

    let model = init_model::<Autodiff<Cpu>>(&config, &device);
    let mut optim = config.optimizer.init();
    let (model, end) = train_whole_epoch(model, &mut optim, &splits.train, &config, 0);
    let EpochEnd::Done(stats) = end else {
        panic!("epoch ended with {end:?}")
    };
    assert_eq!(stats.steps, 938);
    let test = evaluate_trained(&model, &splits.test, config.test_batch_size);
    eprintln!(
        "60k images, 1 epoch: train loss {:.4}, test loss {:.4}, accuracy {:.2}%, {:.1} s ({:.0} img/s)",
        stats.loss,
        test.loss,
        100.0 * test.accuracy(),
        stats.seconds,
        stats.images_per_sec()
    );
    assert_eq!(test.total, 10_000);
    assert!(
        test.accuracy() >= 0.98,
        "test accuracy {:.2}% < 98%",
        100.0 * test.accuracy()
    );
    assert!(test.loss < 0.07, "test loss {}", test.loss);

    let dir = tempfile::tempdir().unwrap();
    let run = RunDir::create(dir.path().join("run")).unwrap();
    run.save_config(&config).unwrap();
    run.save_checkpoint(&model, None, &Progress::default()).unwrap();
    let reloaded = run
        .load_model::<Cpu>(&run.load_config().unwrap(), &device)
        .unwrap();
    let again = evaluate(&reloaded, &splits.test, config.test_batch_size);
    assert_eq!((again.correct, again.loss), (test.correct, test.loss));
}
