//! `torch.nn.BatchNorm2d`, with PyTorch's semantics where burn's `BatchNorm` differs.
//!
//! burn 0.21's `BatchNorm` updates the running variance with the biased batch variance and has
//! no `num_batches_tracked`; PyTorch uses the unbiased variance (`n / (n - 1)`) for the running
//! estimate, the biased one to normalise, and counts the batches. A model trained here must
//! evaluate like its PyTorch twin and import its `state_dict`, so ember carries its own layer.
//! The parameter and buffer names are PyTorch's.

use burn::config::Config;
use burn::module::{Module, Param, RunningState};
use burn::nn::conv::Conv2d;
use burn::tensor::{backend::Backend, Tensor};
use ember_kernels::{nn, BnInput};

#[derive(Config, Debug)]
pub struct BatchNorm2dConfig {
    pub num_features: usize,
    /// Added to the variance before its square root.
    #[config(default = 1e-5)]
    pub eps: f64,
    /// Weight of the new batch in the running estimates, as PyTorch defines it:
    /// `running = (1 - momentum) * running + momentum * batch`.
    #[config(default = 0.1)]
    pub momentum: f64,
}

/// Batch normalisation of `[batch, channels, height, width]` per channel, with a learned scale
/// (`weight`, initially 1) and shift (`bias`, initially 0).
///
/// Training (an autodiff backend) normalises with the batch's own mean and biased variance and
/// updates the running estimates; inference (the inner backend, as `ember eval` runs) normalises
/// with the running estimates.
#[derive(Module, Debug)]
pub struct BatchNorm2d<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub bias: Param<Tensor<B, 1>>,
    pub running_mean: RunningState<Tensor<B, 1>>,
    pub running_var: RunningState<Tensor<B, 1>>,
    /// Training batches seen; PyTorch's is an `int64` scalar, kept here as a one-element `f32`
    /// (exact to 2^24 batches). Only counted: with a fixed momentum PyTorch does not read it.
    pub num_batches_tracked: RunningState<Tensor<B, 1>>,
    pub eps: f64,
    pub momentum: f64,
}

impl BatchNorm2dConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> BatchNorm2d<B> {
        let n = self.num_features;
        BatchNorm2d {
            weight: Param::from_tensor(Tensor::ones([n], device)),
            bias: Param::from_tensor(Tensor::zeros([n], device)),
            running_mean: RunningState::new(Tensor::zeros([n], device)),
            running_var: RunningState::new(Tensor::ones([n], device)),
            num_batches_tracked: RunningState::new(Tensor::zeros([1], device)),
            eps: self.eps,
            momentum: self.momentum,
        }
    }
}

impl<B: Backend> BatchNorm2d<B> {
    /// Elements of the running statistics (not trained, but counted by burn's `num_params`).
    pub fn buffer_len(&self) -> usize {
        2 * self.running_mean.value().dims()[0] + 1
    }

    /// # Shapes
    /// - `x`: `[batch, channels, height, width]`
    /// - output: the same
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.forward_maybe_relu(x, false)
    }

    /// `relu(self.forward(x))`, fused on ember's CPU kernels.
    pub fn forward_relu(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.forward_maybe_relu(x, true)
    }

    /// `relu(self.forward(x) + residual)`, a residual block's end: fused on ember's CPU kernels
    /// (one pass each way in training, one in inference), with the same values as the three ops.
    ///
    /// # Shapes
    /// - `x`, `residual`: `[batch, channels, height, width]`
    /// - output: the same
    pub fn forward_add_relu(&self, x: Tensor<B, 4>, residual: Tensor<B, 4>) -> Tensor<B, 4> {
        self.add_relu(x.into(), residual)
    }

    /// `self.forward_add_relu(nn::conv2d(conv, x), residual)`; in training the convolution takes
    /// the moments of its output for the batch norm's statistics ([`nn::conv2d_moments`]).
    ///
    /// # Shapes
    /// - `x`: `conv`'s input, `[batch, in_channels, h, w]`
    /// - `residual`, output: `[batch, channels, h_out, w_out]`
    pub fn forward_conv_add_relu(
        &self,
        conv: &Conv2d<B>,
        x: Tensor<B, 4>,
        residual: Tensor<B, 4>,
    ) -> Tensor<B, 4> {
        if B::ad_enabled(&x.device()) {
            return self.conv_train(conv, x, true, Some(residual));
        }
        self.forward_add_relu(nn::conv2d(conv, x), residual)
    }

    fn add_relu(&self, x: BnInput<B>, residual: Tensor<B, 4>) -> Tensor<B, 4> {
        let (weight, bias) = (self.weight.val(), self.bias.val());
        if !B::ad_enabled(&x.tensor().device()) {
            let (mean, var) = (self.running_mean.value(), self.running_var.value());
            return ember_kernels::batch_norm2d_add_relu_eval(
                x.into_tensor(),
                mean,
                var,
                weight,
                bias,
                residual,
                self.eps,
            );
        }
        let count = Self::count(x.tensor());
        let (y, mean, var) = ember_kernels::batch_norm2d_add_relu_train(x, weight, bias, residual, self.eps);
        self.update_running(count, mean, var);
        y
    }

    /// `max_pool2d(relu(self.forward(x)), 2)` (2x2 windows, stride 2): one fused pass on
    /// ember's CPU kernels.
    ///
    /// # Shapes
    /// - `x`: `[batch, channels, height, width]`
    /// - output: `[batch, channels, height / 2, width / 2]`
    pub fn forward_relu_pool2(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let (weight, bias) = (self.weight.val(), self.bias.val());
        if !B::ad_enabled(&x.device()) {
            let (mean, var) = (self.running_mean.value(), self.running_var.value());
            return ember_kernels::batch_norm2d_relu_pool2_eval(x, mean, var, weight, bias, self.eps);
        }
        let count = Self::count(&x);
        let (y, mean, var) = ember_kernels::batch_norm2d_relu_pool2_train(x, weight, bias, self.eps);
        self.update_running(count, mean, var);
        y
    }

    /// `self.forward_relu_pool2(nn::conv2d(conv, x))`; in training one node on the kernels
    /// ([`nn::conv2d_batch_norm2d_relu_pool2_train`]: the statistics from the convolution's
    /// moments, and a backward that never stores the convolution's output gradient).
    ///
    /// # Shapes
    /// - `x`: `conv`'s input, `[batch, in_channels, h, w]`
    /// - output: `[batch, channels, h_out / 2, w_out / 2]`
    pub fn forward_conv_relu_pool2(&self, conv: &Conv2d<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
        if !B::ad_enabled(&x.device()) {
            return self.forward_relu_pool2(nn::conv2d(conv, x));
        }
        let (weight, bias) = (self.weight.val(), self.bias.val());
        let (y, stats) = nn::conv2d_batch_norm2d_relu_pool2_train(conv, x, weight, bias, self.eps);
        self.update_running(stats.count as f64, stats.mean, stats.var);
        y
    }

    /// `self.forward(nn::conv2d(conv, x))`. In training the convolution takes the moments of
    /// its output maps for this batch norm's statistics ([`nn::conv2d_moments`]: the same
    /// bits, without a pass over the output for them); in inference one convolution with this
    /// batch norm folded into its weights and bias ([`nn::conv2d_affine`]): no pass of its own
    /// over the output, values equal to the two ops' up to rounding.
    ///
    /// # Shapes
    /// - `x`: `conv`'s input, `[batch, in_channels, h, w]`
    /// - output: `[batch, channels, h_out, w_out]`
    pub fn forward_conv(&self, conv: &Conv2d<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.forward_conv_maybe_relu(conv, x, false)
    }

    /// `relu(self.forward_conv(conv, x))`, the ReLU fused into the convolution in inference.
    pub fn forward_conv_relu(&self, conv: &Conv2d<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.forward_conv_maybe_relu(conv, x, true)
    }

    fn forward_conv_maybe_relu(&self, conv: &Conv2d<B>, x: Tensor<B, 4>, relu: bool) -> Tensor<B, 4> {
        if B::ad_enabled(&x.device()) {
            return self.conv_train(conv, x, relu, None);
        }
        let scale = self
            .weight
            .val()
            .div(self.running_var.value().add_scalar(self.eps).sqrt());
        let shift = self.bias.val().sub(self.running_mean.value().mul(scale.clone()));
        nn::conv2d_affine(conv, x, scale, shift, relu)
    }

    /// Training: `conv`, then this batch norm (then `relu`, or `residual` added and a ReLU) as
    /// [`nn::conv2d_batch_norm2d_train`] runs them, the running statistics updated.
    fn conv_train(
        &self,
        conv: &Conv2d<B>,
        x: Tensor<B, 4>,
        relu: bool,
        residual: Option<Tensor<B, 4>>,
    ) -> Tensor<B, 4> {
        let (weight, bias) = (self.weight.val(), self.bias.val());
        let (y, mean, var) = nn::conv2d_batch_norm2d_train(conv, x, weight, bias, self.eps, relu, residual);
        self.update_running(Self::count(&y), mean, var);
        y
    }

    /// Elements per channel of `x`.
    fn count(x: &Tensor<B, 4>) -> f64 {
        let [batch, _, height, width] = x.dims();
        (batch * height * width) as f64
    }

    fn forward_maybe_relu(&self, x: impl Into<BnInput<B>>, relu: bool) -> Tensor<B, 4> {
        let x = x.into();
        let (weight, bias) = (self.weight.val(), self.bias.val());
        if !B::ad_enabled(&x.tensor().device()) {
            let (mean, var) = (self.running_mean.value(), self.running_var.value());
            return ember_kernels::batch_norm2d_eval(
                x.into_tensor(),
                mean,
                var,
                weight,
                bias,
                self.eps,
                relu,
            );
        }
        let count = Self::count(x.tensor());
        let (y, mean, var) = ember_kernels::batch_norm2d_train(x, weight, bias, self.eps, relu);
        self.update_running(count, mean, var);
        y
    }

    /// Folds a training batch's statistics (`n` elements per channel) into the running ones.
    fn update_running(&self, n: f64, mean: Tensor<B, 1>, var: Tensor<B, 1>) {
        let m = self.momentum;
        // PyTorch's running variance is the unbiased estimate (n / (n - 1)); a single value
        // per channel (PyTorch refuses to train on one) keeps the biased one.
        let unbiased = var.mul_scalar(n / (n - 1.0).max(1.0));
        let running_mean = self.running_mean.value_sync();
        let running_var = self.running_var.value_sync();
        self.running_mean
            .update(running_mean.mul_scalar(1.0 - m).add(mean.mul_scalar(m)).detach());
        self.running_var.update(
            running_var
                .mul_scalar(1.0 - m)
                .add(unbiased.mul_scalar(m))
                .detach(),
        );
        self.num_batches_tracked
            .update(self.num_batches_tracked.value_sync().add_scalar(1.0).detach());
        // burn's RunningState keeps an update pending per thread until the next read; module
        // visitors (export by name, parameter counts) read without folding it in, so fold it in
        // now: every reader sees the statistics of the last batch.
        for state in [&self.running_mean, &self.running_var, &self.num_batches_tracked] {
            let _ = state.value_sync();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::test_util::{TestAutodiff, TestBackend};
    use burn::module::AutodiffModule;
    use burn::tensor::TensorData;

    /// `values` of benches/pytorch/layer_reference.py.
    fn values<B: Backend>(shape: [usize; 4], salt: usize) -> Tensor<B, 4> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| (((i * 37 + salt * 11) % 23) as f64 - 11.0) / 7.0 + 0.25 * salt as f64)
            .map(|v| v as f32)
            .collect();
        Tensor::from_data(TensorData::new(v, shape), &Default::default())
    }

    fn assert_close<B: Backend, const D: usize>(got: Tensor<B, D>, want: &[f64], what: &str) {
        let got: Vec<f32> = got.into_data().convert::<f32>().to_vec().unwrap();
        assert_eq!(got.len(), want.len(), "{what}: length");
        let scale = want.iter().fold(1.0f64, |m, w| m.max(w.abs()));
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let err = (f64::from(*g) - w).abs() / scale;
            assert!(
                err <= 1e-5,
                "{what}[{i}] = {g}, torch has {w} (relative error {err:e})"
            );
        }
    }

    #[test]
    fn trains_and_evaluates_like_torch() {
        let shape = [3, 2, 2, 3];
        let device = Default::default();
        let mut bn = BatchNorm2dConfig::new(2).init::<TestAutodiff>(&device);
        bn.weight = Param::from_tensor(Tensor::from_floats([1.5, -0.5], &device));
        bn.bias = Param::from_tensor(Tensor::from_floats([0.1, 0.2], &device));

        let x1 = values::<TestAutodiff>(shape, 1).require_grad();
        let y1 = bn.forward(x1.clone());
        assert_close(y1.clone(), &reference::BN_Y1, "y1");
        let grads = y1.mul(values(shape, 3)).sum().backward();
        assert_close(x1.grad(&grads).unwrap(), &reference::BN_DX1, "dx1");
        assert_close(bn.weight.grad(&grads).unwrap(), &reference::BN_DWEIGHT, "dweight");
        assert_close(bn.bias.grad(&grads).unwrap(), &reference::BN_DBIAS, "dbias");

        assert_close(bn.forward(values(shape, 2)), &reference::BN_Y2, "y2");
        let eval = bn.valid();
        assert_close(
            eval.running_mean.value(),
            &reference::BN_RUNNING_MEAN,
            "running_mean",
        );
        assert_close(
            eval.running_var.value(),
            &reference::BN_RUNNING_VAR,
            "running_var",
        );
        assert_close(
            eval.num_batches_tracked.value(),
            &[reference::BN_NUM_BATCHES_TRACKED as f64],
            "num_batches_tracked",
        );
        assert_close(
            eval.forward(values::<TestBackend>(shape, 1)),
            &reference::BN_EVAL,
            "eval",
        );
    }

    /// In inference the batch norm folds into the convolution before it: the same values as
    /// the convolution then the batch norm (then the ReLU), up to rounding; in training
    /// `forward_conv` is the two ops.
    #[test]
    fn forward_conv_folds_in_inference_only() {
        use burn::nn::conv::Conv2dConfig;
        use burn::nn::PaddingConfig2d;
        let device = Default::default();
        let mut bn = BatchNorm2dConfig::new(2).init::<TestAutodiff>(&device);
        bn.weight = Param::from_tensor(Tensor::from_floats([1.5, -0.5], &device));
        bn.bias = Param::from_tensor(Tensor::from_floats([0.1, 0.2], &device));
        let conv = Conv2dConfig::new([2, 2], [3, 3])
            .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
            .init::<TestAutodiff>(&device);
        let x = values::<TestAutodiff>([3, 2, 4, 5], 1);
        let trained = bn.forward_conv_relu(&conv, x.clone());
        let unfused = bn.forward_relu(nn::conv2d(&conv, x.clone()));
        trained.into_data().assert_eq(&unfused.into_data(), true);

        let (bn, conv, x) = (bn.valid(), conv.valid(), x.inner());
        for relu in [false, true] {
            let folded = bn.forward_conv_maybe_relu(&conv, x.clone(), relu);
            let two_ops = bn.forward_maybe_relu(nn::conv2d(&conv, x.clone()), relu);
            let want: Vec<f64> = two_ops.into_data().convert::<f64>().to_vec().unwrap();
            assert_close(folded, &want, &format!("folded, relu {relu}"));
        }
    }

    /// `forward_conv_relu_pool2` and `forward_conv_add_relu` are the convolution then
    /// `forward_relu_pool2` / `forward_add_relu`, in training (output and running statistics)
    /// and in inference.
    #[test]
    fn conv_entry_points_are_the_two_ops() {
        use burn::nn::conv::Conv2dConfig;
        use burn::nn::PaddingConfig2d;
        let device = Default::default();
        let conv = Conv2dConfig::new([2, 3], [3, 3])
            .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
            .init::<TestAutodiff>(&device);
        let x = values::<TestAutodiff>([3, 2, 4, 6], 1);
        let residual = values::<TestAutodiff>([3, 3, 4, 6], 2);
        let bn = || BatchNorm2dConfig::new(3).init::<TestAutodiff>(&device);
        let same = |a: Tensor<TestAutodiff, 4>,
                    b: Tensor<TestAutodiff, 4>,
                    x: &BatchNorm2d<TestAutodiff>,
                    y: &BatchNorm2d<TestAutodiff>| {
            a.into_data().assert_eq(&b.into_data(), true);
            x.running_var
                .value()
                .into_data()
                .assert_eq(&y.running_var.value().into_data(), true);
            x.running_mean
                .value()
                .into_data()
                .assert_eq(&y.running_mean.value().into_data(), true);
        };
        let (a, b) = (bn(), bn());
        let fused = a.forward_conv_relu_pool2(&conv, x.clone());
        let two_ops = b.forward_relu_pool2(nn::conv2d(&conv, x.clone()));
        same(fused, two_ops, &a, &b);
        let (a, b) = (bn(), bn());
        let fused = a.forward_conv_add_relu(&conv, x.clone(), residual.clone());
        let two_ops = b.forward_add_relu(nn::conv2d(&conv, x.clone()), residual.clone());
        same(fused, two_ops, &a, &b);
        let (a, conv, x, residual) = (a.valid(), conv.valid(), x.inner(), residual.inner());
        a.forward_conv_relu_pool2(&conv, x.clone()).into_data().assert_eq(
            &a.forward_relu_pool2(nn::conv2d(&conv, x.clone())).into_data(),
            true,
        );
        a.forward_conv_add_relu(&conv, x.clone(), residual.clone())
            .into_data()
            .assert_eq(
                &a.forward_add_relu(nn::conv2d(&conv, x), residual).into_data(),
                true,
            );
    }

    /// The running statistics are state a checkpoint must keep.
    #[test]
    fn running_statistics_are_in_the_record() {
        let device = Default::default();
        let bn = BatchNorm2dConfig::new(2).init::<TestAutodiff>(&device);
        let _ = bn.forward(values([4, 2, 3, 3], 1));
        let trained = bn.valid();
        let fresh = BatchNorm2dConfig::new(2)
            .init::<TestBackend>(&device)
            .load_record(trained.clone().into_record());
        for (a, b) in [
            (&trained.running_mean, &fresh.running_mean),
            (&trained.running_var, &fresh.running_var),
            (&trained.num_batches_tracked, &fresh.num_batches_tracked),
        ] {
            a.value().into_data().assert_eq(&b.value().into_data(), true);
        }
        assert_ne!(
            fresh.running_var.value().into_data().to_vec::<f32>().unwrap(),
            vec![1.0, 1.0]
        );
    }
}
