//! Training steps on the CPU backend give the same bits with 1 and with 2 threads: the kernels
//! partition work statically (per image, per fixed group of images, per plane), so the thread
//! count changes who computes a number, never how.

mod common;

use burn::backend::Autodiff;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{backend::Backend, Tensor};
use clap::ValueEnum;
use ember::backend::Cpu;
use ember::config::Recipe;
use ember::data::Data;
use ember::train::{init_model, train_whole_epoch, EpochEnd, Splits};

struct Bits(Vec<Vec<u32>>);

impl<B: Backend> ModuleVisitor<B> for Bits {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let values: Vec<f32> = param.val().into_data().convert::<f32>().to_vec().unwrap();
        self.0.push(values.iter().map(|v| v.to_bits()).collect());
    }
}

/// The parameters, bit for bit, after three steps of `recipe` (batch 64) on `threads` threads.
fn after_three_steps(data: &Data, recipe: Recipe, threads: usize) -> Vec<Vec<u32>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let mut config = recipe.config();
        config.batch_size = 64;
        config.valid_size = 0;
        config.limit_train = Some(3 * 64);
        config.limit_test = Some(10);
        let device = Default::default();
        let splits = Splits::<Cpu>::upload(data, &config, &device).unwrap();
        let model = init_model::<Autodiff<Cpu>>(&config, &device);
        let mut optim = config.optimizer.init();
        let (model, end) = train_whole_epoch(model, &mut optim, &splits.train, &config, 0);
        assert!(matches!(end, EpochEnd::Done(ref s) if s.steps == 3), "{end:?}");
        let mut bits = Bits(Vec::new());
        model.visit(&mut bits);
        bits.0
    })
}

#[test]
fn one_and_two_threads_train_bit_identically() {
    let data = common::load_mnist();
    // Every recipe: the seed models, and ResNet-20's and the speedrun net's fused batch norms
    // (statistics from the convolution's moments, the one-node convolution + batch norm + pool).
    for &recipe in Recipe::value_variants() {
        let (one, two) = (
            after_three_steps(&data, recipe, 1),
            after_three_steps(&data, recipe, 2),
        );
        assert_eq!(one.len(), two.len());
        for (i, (a, b)) in one.iter().zip(&two).enumerate() {
            assert!(
                a == b,
                "{recipe:?}: parameter {i} differs between 1 and 2 threads"
            );
        }
    }
}
