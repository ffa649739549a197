//! Micro-benchmark: one training step (forward, backward, optimizer) of each model at batch 64
//! on the default CPU backend, on random data. `cargo bench --bench train_step`.
//! Whole-scenario timings against PyTorch are `ember bench` / `benches/compare`.

use burn::backend::Autodiff;
use burn::tensor::{Distribution, Int, Tensor};
use ember::backend::Cpu;
use ember::model::ModelKind;
use ember::train::{init_model, train_step};

fn main() {
    divan::main();
}

#[divan::bench(args = [ModelKind::PytorchExampleNet, ModelKind::TchNet, ModelKind::FlashlightCnn], sample_count = 10, sample_size = 2)]
fn step(bencher: divan::Bencher, kind: ModelKind) {
    type B = Autodiff<Cpu>;
    let device = Default::default();
    let mut config = ember::config::Recipe::of_model(kind).config();
    config.model = kind.into();
    let images = Tensor::<Cpu, 4>::random([64, 1, 28, 28], Distribution::Default, &device);
    let targets = Tensor::<Cpu, 1, Int>::random([64], Distribution::Uniform(0.0, 10.0), &device);
    let mut optim = config.optimizer.init::<B, _>();
    let mut model = Some(init_model::<B>(&config, &device));
    bencher.bench_local(|| {
        let (next, loss) = train_step(
            model.take().unwrap(),
            &mut optim,
            images.clone(),
            targets.clone(),
            config.lr,
            config.label_smoothing,
        );
        model = Some(next);
        ember::train::scalar(loss)
    });
}
