//! The ops applied to burn's own `Conv2d` and `MaxPool2d` modules, so that a model keeps those
//! modules (their parameters, records and PyTorch key names) and only changes the call.
//! Configurations the kernels do not cover (dilation, groups, `Same` or asymmetric padding,
//! ceil mode) run the module's own `forward`.

use burn::module::Param;
use burn::nn::conv::Conv2d;
use burn::nn::pool::MaxPool2d;
use burn::nn::PaddingConfig2d;
use burn::nn::{Dropout, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use crate::{BnInput, Conv2dOptions, PadMode};

/// Symmetric padding of `config`, if it is symmetric and does not depend on the input size.
fn symmetric(config: &PaddingConfig2d) -> Option<[usize; 2]> {
    match *config {
        PaddingConfig2d::Valid => Some([0, 0]),
        PaddingConfig2d::Explicit(top, left, bottom, right) if top == bottom && left == right => {
            Some([top, left])
        }
        _ => None,
    }
}

fn options<B: Backend>(conv: &Conv2d<B>) -> Option<Conv2dOptions> {
    if conv.groups != 1 || conv.dilation != [1, 1] {
        return None;
    }
    Some(Conv2dOptions::new(
        conv.stride,
        symmetric(&conv.padding)?,
        PadMode::Zeros,
    ))
}

/// `conv.forward(x)`, through [`crate::conv2d`].
///
/// # Shapes
/// - `x`: `[batch, in_channels, h, w]`
/// - output: `[batch, out_channels, h_out, w_out]`
pub fn conv2d<B: Backend>(conv: &Conv2d<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
    apply_own(conv, x, None, false)
}

/// `conv.forward(x)` for a batch norm in training mode to follow: on the kernels with the
/// moments of the output's maps ([`crate::conv2d_moments`]), so that the batch norm's statistics
/// need no pass of their own.
///
/// # Shapes
/// As [`conv2d`].
pub fn conv2d_moments<B: Backend>(conv: &Conv2d<B>, x: Tensor<B, 4>) -> BnInput<B> {
    match options(conv) {
        Some(options) => {
            crate::conv2d_moments(x, conv.weight.val(), conv.bias.as_ref().map(|b| b.val()), options)
        }
        None => conv2d(conv, x).into(),
    }
}

/// `batch_norm_train(conv.forward(x))` with the batch norm's `weight`, `bias` and `eps`, then
/// `relu` if asked, or with a `residual` added and a ReLU ([`crate::conv2d_batch_norm2d_train`]:
/// one node on the kernels where that pays). Returns the output and the batch's mean and biased
/// variance, detached.
///
/// # Shapes
/// - `x`: `[batch, in_channels, h, w]`; `weight`, `bias`: `[out_channels]`
/// - `residual`, output: `[batch, out_channels, h_out, w_out]`
pub fn conv2d_batch_norm2d_train<B: Backend>(
    conv: &Conv2d<B>,
    x: Tensor<B, 4>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
    relu: bool,
    residual: Option<Tensor<B, 4>>,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let Some(options) = options(conv) else {
        let y = conv2d(conv, x);
        return match residual {
            Some(r) => crate::batch_norm2d_add_relu_train(y, weight, bias, r, eps),
            None => crate::batch_norm2d_train(y, weight, bias, eps, relu),
        };
    };
    let conv_bias = conv.bias.as_ref().map(|b| b.val());
    crate::conv2d_batch_norm2d_train(
        x,
        conv.weight.val(),
        conv_bias,
        options,
        weight,
        bias,
        eps,
        relu,
        residual,
    )
}

/// `max_pool2d(relu(batch_norm_train(conv.forward(x))), 2)` with the batch norm's `weight`,
/// `bias` and `eps` ([`crate::conv2d_batch_norm2d_relu_pool2_train`]): one node on the kernels.
/// Returns the pooled output and the batch's statistics.
///
/// # Shapes
/// - `x`: `[batch, in_channels, h, w]`; `weight`, `bias`: `[out_channels]`
/// - output: `[batch, out_channels, h_out / 2, w_out / 2]`
pub fn conv2d_batch_norm2d_relu_pool2_train<B: Backend>(
    conv: &Conv2d<B>,
    x: Tensor<B, 4>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
) -> (Tensor<B, 4>, crate::BatchStats<B>) {
    match options(conv) {
        Some(options) => crate::conv2d_batch_norm2d_relu_pool2_train(
            x,
            conv.weight.val(),
            conv.bias.as_ref().map(|b| b.val()),
            options,
            weight,
            bias,
            eps,
        ),
        None => crate::batch_norm2d_relu_pool2_train_stats(conv2d(conv, x), weight, bias, eps),
    }
}

/// `relu(conv.forward(x))` with the ReLU fused into the convolution on the kernels.
///
/// # Shapes
/// - `x`: `[batch, in_channels, h, w]`
/// - output: `[batch, out_channels, h_out, w_out]`
pub fn conv2d_relu<B: Backend>(conv: &Conv2d<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
    apply_own(conv, x, None, true)
}

/// `conv.forward` on `x` padded by `pad` pixels on every side with copies of its border, like
/// PyTorch's `Conv2d(..., padding=pad, padding_mode="replicate")`. `conv` itself must be
/// configured without padding (burn's `Conv2d` only pads with zeros).
///
/// # Shapes
/// - `x`: `[batch, in_channels, h, w]`
/// - output: `[batch, out_channels, (h + 2 * pad - kh) / sh + 1, (w + 2 * pad - kw) / sw + 1]`
pub fn conv2d_replicate<B: Backend>(conv: &Conv2d<B>, x: Tensor<B, 4>, pad: usize) -> Tensor<B, 4> {
    apply_own(conv, x, Some(pad), false)
}

/// [`conv2d_replicate`] followed by a ReLU, fused on the kernels.
///
/// # Shapes
/// As [`conv2d_replicate`].
pub fn conv2d_replicate_relu<B: Backend>(conv: &Conv2d<B>, x: Tensor<B, 4>, pad: usize) -> Tensor<B, 4> {
    apply_own(conv, x, Some(pad), true)
}

/// `relu(conv.forward(x) * scale[c] + shift[c])` per output channel `c` (the ReLU when `relu`)
/// as one convolution: `scale` folded into the weights, `shift` into the bias. This is an
/// inference-mode batch norm after the convolution (`scale = weight / sqrt(running_var + eps)`,
/// `shift = bias - running_mean * scale`) without a pass of its own over the output; the values
/// differ from the two ops' by rounding only.
///
/// # Shapes
/// - `x`: `[batch, in_channels, h, w]`; `scale`, `shift`: `[out_channels]`
/// - output: `[batch, out_channels, h_out, w_out]`
pub fn conv2d_affine<B: Backend>(
    conv: &Conv2d<B>,
    x: Tensor<B, 4>,
    scale: Tensor<B, 1>,
    shift: Tensor<B, 1>,
    relu: bool,
) -> Tensor<B, 4> {
    let weight = conv.weight.val();
    let [out_channels, ..] = weight.dims();
    let weight = weight.mul(scale.clone().reshape([out_channels, 1, 1, 1]));
    let bias = match &conv.bias {
        Some(b) => b.val().mul(scale).add(shift),
        None => shift,
    };
    apply(conv, weight, Some(bias), x, None, relu)
}

/// `conv` on `x` with its own weights and bias.
fn apply_own<B: Backend>(
    conv: &Conv2d<B>,
    x: Tensor<B, 4>,
    replicate: Option<usize>,
    relu: bool,
) -> Tensor<B, 4> {
    let bias = conv.bias.as_ref().map(|b| b.val());
    apply(conv, conv.weight.val(), bias, x, replicate, relu)
}

/// `conv`'s convolution with `weight` and `bias` in place of its own on `x` (replicate-padded
/// by `replicate` pixels when given), then a ReLU when `relu`.
fn apply<B: Backend>(
    conv: &Conv2d<B>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    x: Tensor<B, 4>,
    replicate: Option<usize>,
    relu: bool,
) -> Tensor<B, 4> {
    if replicate.is_some() {
        assert_eq!(
            symmetric(&conv.padding),
            Some([0, 0]),
            "conv2d_replicate: the convolution must be configured with Valid padding"
        );
    }
    let Some(options) = options(conv) else {
        let x = match replicate {
            Some(pad) => x.pad([(pad, pad), (pad, pad)], burn::tensor::ops::PadMode::Edge),
            None => x,
        };
        let conv = Conv2d {
            weight: Param::from_tensor(weight),
            bias: bias.map(Param::from_tensor),
            padding: conv.padding.clone(),
            ..*conv
        };
        return crate::relu_if(conv.forward(x), relu);
    };
    let options = match replicate {
        Some(pad) => Conv2dOptions {
            padding: [pad, pad],
            mode: PadMode::Replicate,
            ..options
        },
        None => options,
    };
    let options = if relu { options.with_relu() } else { options };
    crate::conv2d(x, weight, bias, options)
}

/// `layer.forward(x)`, through [`crate::linear`].
///
/// # Shapes
/// - `x`: `[batch, inputs]`
/// - output: `[batch, outputs]`
pub fn linear<B: Backend>(layer: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    crate::linear(x, layer.weight.val(), layer.bias.as_ref().map(|b| b.val()), false)
}

/// `relu(layer.forward(x))` with the ReLU fused on the kernels.
///
/// # Shapes
/// As [`linear`].
pub fn linear_relu<B: Backend>(layer: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    crate::linear(x, layer.weight.val(), layer.bias.as_ref().map(|b| b.val()), true)
}

/// `pool.forward(x)`, through [`crate::max_pool2d`].
///
/// # Shapes
/// - `x`: `[batch, channels, h, w]`
/// - output: `[batch, channels, h_out, w_out]`
pub fn max_pool2d<B: Backend>(pool: &MaxPool2d, x: Tensor<B, 4>) -> Tensor<B, 4> {
    match symmetric(&pool.padding) {
        Some(padding) if pool.dilation == [1, 1] && !pool.ceil_mode => {
            crate::max_pool2d(x, pool.kernel_size, pool.stride, padding)
        }
        _ => pool.forward(x),
    }
}

/// `dropout.forward(x)` with its mask keyed by the training step ([`crate::begin_dropout_step`])
/// instead of the backend's generator: on `Autodiff<Flex>` with the kernels it comes from
/// [`crate::cpu::dropout`] (built in parallel, no global lock, not stored for the backward pass);
/// elsewhere from [`crate::keep_mask`], on the device. Without autodiff it is the identity, as
/// in burn.
///
/// # Shapes
/// - `x`: any
/// - output: the same
pub fn dropout<B: Backend, const D: usize>(dropout: &Dropout, x: Tensor<B, D>) -> Tensor<B, D> {
    #[cfg(feature = "flex")]
    if dropout.prob > 0.0
        && crate::flex::is_autodiff_flex::<B>()
        && crate::kernels_enabled()
        && x.dtype() == burn::tensor::DType::F32
    {
        return crate::flex::dropout(x, dropout.prob);
    }
    crate::keyed_dropout(x, dropout.prob)
}
