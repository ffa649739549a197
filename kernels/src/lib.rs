//! ember's CPU kernels for the hot operations of CNN training (convolution, max pooling and the
//! optimizer updates), and their wiring into burn.
//!
//! [`cpu`] holds the kernels on plain `f32` slices. The functions at the top level take burn
//! tensors of any backend: on burn's `flex` CPU backend (feature `flex`) they run the kernels,
//! under `Autodiff<Flex>` as custom autodiff ops with their own backward nodes (burn-autodiff's
//! `Backward`/`Ops`/`OpsKind`, the mechanism burn's own ops use); on every other backend (CUDA,
//! ndarray, flex with `f64` tensors) they run burn's stock ops, unchanged.
//!
//! Rust has no specialisation, so the choice is made per call by comparing the backend's
//! `TypeId` with flex's: a model stays generic over `B: Backend` and needs no extra trait bound.
//!
//! [`nn`] applies the ops to burn's `Conv2d` and `MaxPool2d` modules, so models keep those
//! modules (and so their records, checkpoints and PyTorch imports) and only change the call.

use std::any::{Any, TypeId};

use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, PadMode as BurnPadMode};
use burn::tensor::{activation, module};
use burn::tensor::{DType, Tensor};

pub mod cpu;
mod dropout;
#[cfg(feature = "flex")]
mod flex;
pub mod nn;
pub mod optim;

pub use cpu::batch_norm::{BnPoolShape, BnShape};
pub use cpu::conv::{ConvShape, PadMode};
pub use cpu::linear::LinearShape;
pub use cpu::pool::PoolShape;
pub use dropout::{begin_dropout_step, keep_mask, keyed_dropout, next_dropout_key, MAX_MASK_ELEMENTS};

/// Stride and symmetric padding of a 2-D convolution (dilation 1, one group), and whether a
/// ReLU follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    pub stride: [usize; 2],
    /// Pixels added before and after, per dimension.
    pub padding: [usize; 2],
    pub mode: PadMode,
    /// Apply a ReLU to the output. The kernels fuse it: no separate pass and tensor forward,
    /// and the mask is applied inside the convolution's backward.
    pub relu: bool,
}

impl Conv2dOptions {
    /// Without a ReLU.
    pub fn new(stride: [usize; 2], padding: [usize; 2], mode: PadMode) -> Self {
        Self {
            stride,
            padding,
            mode,
            relu: false,
        }
    }

    /// The same convolution followed by a ReLU.
    pub fn with_relu(self) -> Self {
        Self { relu: true, ..self }
    }
}

/// `EMBER_KERNELS`: `cpu` (the default) runs the kernels on flex, `stock` runs burn's stock
/// ops everywhere, for before/after measurements in one binary.
fn kernels_setting() -> Result<bool, String> {
    match std::env::var("EMBER_KERNELS") {
        Err(std::env::VarError::NotPresent) => Ok(true),
        Ok(v) if v == "cpu" => Ok(true),
        Ok(v) if v == "stock" => Ok(false),
        Ok(v) => Err(format!(
            "EMBER_KERNELS={v:?}: expected `cpu` (ember's kernels, the default) or `stock` (burn's ops)"
        )),
        Err(e) => Err(format!("EMBER_KERNELS: {e}")),
    }
}

/// Which vector instructions ember's CPU kernels use (`EMBER_SIMD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Simd {
    /// AVX-512F where the CPU has it (detected at run time), else AVX2 and FMA where it has
    /// those, else the portable loops (default, `EMBER_SIMD=auto`).
    Auto,
    /// The portable loops even on an AVX-512 or AVX2 CPU (`EMBER_SIMD=portable`): to test them
    /// there.
    Portable,
}

fn simd_from_env() -> Result<Simd, String> {
    match std::env::var("EMBER_SIMD") {
        Err(std::env::VarError::NotPresent) => Ok(Simd::Auto),
        Ok(v) if v == "auto" => Ok(Simd::Auto),
        Ok(v) if v == "portable" => Ok(Simd::Portable),
        Ok(v) => Err(format!(
            "EMBER_SIMD={v:?}: expected `auto` (AVX-512 or AVX2 where the CPU has it, the default) or `portable`"
        )),
        Err(e) => Err(format!("EMBER_SIMD: {e}")),
    }
}

/// The environment's kernel switches (`EMBER_KERNELS`, `EMBER_SIMD`), checked: a binary calls
/// this first and reports the error in one line, where the kernels themselves would panic.
pub fn check_env() -> Result<(), String> {
    kernels_setting()?;
    simd_from_env()?;
    Ok(())
}

/// `EMBER_SIMD`, read once.
///
/// # Panics
/// On a value other than `auto` or `portable` (see [`check_env`]): a misspelt switch must not
/// silently test or measure the wrong loops.
pub fn simd_setting() -> Simd {
    static SIMD: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
    *SIMD.get_or_init(|| simd_from_env().unwrap_or_else(|e| panic!("{e}")))
}

/// The vector instructions the CPU kernels run on this machine: `avx512f`, `avx2` or
/// `portable`.
pub fn simd_in_use() -> &'static str {
    cpu::simd_in_use()
}

/// Whether ember's kernels run (rather than burn's stock ops): `EMBER_KERNELS`, read once.
///
/// # Panics
/// On a value other than `cpu` or `stock` (see [`check_env`]): a misspelt switch must not
/// silently measure the wrong thing.
pub fn kernels_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| kernels_setting().unwrap_or_else(|e| panic!("{e}")))
}

/// Whether backend `B` runs ember's CPU kernels (rather than burn's stock ops) for `f32`
/// tensors: `Flex` and `Autodiff<Flex>` (burn's default, no checkpointing). Autodiff over flex
/// with another checkpointing strategy runs burn's ops, and says so once on stderr rather than
/// silently training several times slower.
pub fn uses_cpu_kernels<B: Backend>() -> bool {
    #[cfg(feature = "flex")]
    {
        let served = flex::is_flex::<B>() || flex::is_autodiff_flex::<B>();
        if !served && kernels_enabled() && other_autodiff_flex(std::any::type_name::<B>()) {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "ember: {} runs burn's stock ops: ember's CPU kernels serve Autodiff<Flex> without checkpointing",
                    std::any::type_name::<B>()
                )
            });
        }
        served && kernels_enabled()
    }
    #[cfg(not(feature = "flex"))]
    {
        false
    }
}

/// Whether a backend's type name is burn's autodiff over flex (any checkpointing strategy).
#[cfg(feature = "flex")]
fn other_autodiff_flex(name: &str) -> bool {
    name.starts_with("burn_autodiff::backend::Autodiff<burn_flex::")
}

/// Whether `B` is flex itself (not under autodiff).
pub(crate) fn is_flex<B: Backend>() -> bool {
    #[cfg(feature = "flex")]
    {
        flex::is_flex::<B>() && kernels_enabled()
    }
    #[cfg(not(feature = "flex"))]
    {
        false
    }
}

/// Moves `value` into a `T` when it is one: the safe downcast behind the backend choice.
pub(crate) fn cast<A: 'static, T: 'static>(value: A) -> Result<T, A> {
    let mut slot = Some(value);
    match (&mut slot as &mut dyn Any).downcast_mut::<Option<T>>() {
        Some(t) => Ok(t.take().expect("slot holds the value")),
        None => Err(slot.expect("slot holds the value")),
    }
}

pub(crate) fn same_type<A: 'static, T: 'static>() -> bool {
    TypeId::of::<A>() == TypeId::of::<T>()
}

/// The [`ConvShape`] of `x` convolved with `weight`, if ember's kernels take it.
fn conv_shape<B: Backend>(
    x: &Tensor<B, 4>,
    weight: &Tensor<B, 4>,
    options: Conv2dOptions,
) -> Option<ConvShape> {
    let [batch, in_channels, in_h, in_w] = x.dims();
    let [out_channels, weight_in, kh, kw] = weight.dims();
    let shape = ConvShape {
        batch,
        in_channels,
        in_h,
        in_w,
        out_channels,
        kernel: [kh, kw],
        stride: options.stride,
        padding: options.padding,
        mode: options.mode,
    };
    let f32s = x.dtype() == DType::F32 && weight.dtype() == DType::F32;
    (f32s && weight_in == in_channels && batch > 0 && shape.is_valid()).then_some(shape)
}

/// `conv2d(x, weight) + bias`, like `torch.nn.functional.conv2d` (with `padding_mode` folded
/// in), then `relu` if `options.relu`.
///
/// # Shapes
/// - `x`: `[batch, in_channels, h, w]`
/// - `weight`: `[out_channels, in_channels, kh, kw]`
/// - `bias`: `[out_channels]`
/// - output: `[batch, out_channels, (h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1]`
pub fn conv2d<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    options: Conv2dOptions,
) -> Tensor<B, 4> {
    #[cfg(feature = "flex")]
    if uses_cpu_kernels::<B>() {
        if let Some(shape) = conv_shape(&x, &weight, options) {
            return flex::conv2d(x, weight, bias, shape, options.relu);
        }
    }
    conv2d_stock(x, weight, bias, options)
}

/// [`conv2d`] through burn's own ops: replicate padding as an explicit `pad`, then burn's
/// convolution, then burn's ReLU when asked.
pub fn conv2d_stock<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    options: Conv2dOptions,
) -> Tensor<B, 4> {
    let [ph, pw] = options.padding;
    let (x, padding) = match options.mode {
        PadMode::Zeros => (x, options.padding),
        PadMode::Replicate => (x.pad([(ph, ph), (pw, pw)], BurnPadMode::Edge), [0, 0]),
    };
    let y = module::conv2d(
        x,
        weight,
        bias,
        ConvOptions::new(options.stride, padding, [1, 1], 1),
    );
    relu_if(y, options.relu)
}

/// A batch norm's input: a tensor and, when a convolution on the kernels has just written it
/// ([`conv2d_moments`]), the moments of its maps taken as it was written, from which the batch
/// norm's training statistics follow without a pass of their own over it. A plain tensor
/// converts into one without moments.
pub struct BnInput<B: Backend> {
    x: Tensor<B, 4>,
    /// `[batch, channels]` moments of exactly `x`'s maps (private: only the convolution that
    /// wrote `x` makes them).
    moments: Option<Vec<cpu::batch_norm::MapMoments>>,
}

impl<B: Backend> From<Tensor<B, 4>> for BnInput<B> {
    fn from(x: Tensor<B, 4>) -> Self {
        BnInput { x, moments: None }
    }
}

impl<B: Backend> BnInput<B> {
    /// The tensor.
    pub fn tensor(&self) -> &Tensor<B, 4> {
        &self.x
    }

    /// The tensor, without its moments.
    pub fn into_tensor(self) -> Tensor<B, 4> {
        self.x
    }

    /// Whether the moments of the tensor's maps came with it.
    pub fn has_moments(&self) -> bool {
        self.moments.is_some()
    }
}

/// [`conv2d`] for a batch norm in training mode to follow: on the kernels (autodiff flex) the
/// output comes with the moments of its maps, taken by the convolution while each image was in
/// cache ([`cpu::conv::conv2d_forward_moments`]); elsewhere (and in inference, where a batch
/// norm uses its running statistics) the plain output. The output's values are
/// [`conv2d`]'s.
///
/// # Shapes
/// As [`conv2d`].
pub fn conv2d_moments<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    options: Conv2dOptions,
) -> BnInput<B> {
    #[cfg(feature = "flex")]
    if uses_cpu_kernels::<B>() && flex::is_autodiff_flex::<B>() {
        if let Some(shape) = conv_shape(&x, &weight, options) {
            let (x, moments) = flex::conv2d_moments(x, weight, bias, shape, options.relu);
            return BnInput {
                x,
                moments: Some(moments),
            };
        }
    }
    conv2d(x, weight, bias, options).into()
}

/// `x . weight + bias` in burn's `Linear` layout (`weight` is `[inputs, outputs]`; PyTorch's is
/// its transpose), then a ReLU when `relu` (fused on the kernels).
///
/// # Shapes
/// - `x`: `[batch, inputs]`, `weight`: `[inputs, outputs]`, `bias`: `[outputs]`
/// - output: `[batch, outputs]`
pub fn linear<B: Backend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    relu: bool,
) -> Tensor<B, 2> {
    #[cfg(feature = "flex")]
    if uses_cpu_kernels::<B>() && x.dtype() == DType::F32 && weight.dtype() == DType::F32 {
        let ([batch, inputs], [weight_in, outputs]) = (x.dims(), weight.dims());
        let shape = LinearShape {
            batch,
            inputs,
            outputs,
        };
        if weight_in == inputs && shape.is_valid() {
            return flex::linear(x, weight, bias, shape, relu);
        }
    }
    linear_stock(x, weight, bias, relu)
}

/// [`linear`] through burn's own ops.
pub fn linear_stock<B: Backend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    relu: bool,
) -> Tensor<B, 2> {
    relu_if(module::linear(x, weight, bias), relu)
}

/// `relu(y)` through burn's op when `relu`, else `y`: the stock paths' half of the fused ReLU.
pub(crate) fn relu_if<B: Backend, const D: usize>(y: Tensor<B, D>, relu: bool) -> Tensor<B, D> {
    if relu {
        activation::relu(y)
    } else {
        y
    }
}

/// Max pooling (dilation 1, floor rounding, `-inf` padding), like
/// `torch.nn.functional.max_pool2d`.
///
/// # Shapes
/// - `x`: `[batch, channels, h, w]`
/// - output: `[batch, channels, (h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1]`
pub fn max_pool2d<B: Backend>(
    x: Tensor<B, 4>,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> Tensor<B, 4> {
    #[cfg(feature = "flex")]
    if uses_cpu_kernels::<B>() && x.dtype() == DType::F32 {
        let [batch, channels, in_h, in_w] = x.dims();
        let shape = PoolShape {
            batch,
            channels,
            in_h,
            in_w,
            kernel,
            stride,
            padding,
        };
        if shape.is_valid() {
            return flex::max_pool2d(x, shape);
        }
    }
    module::max_pool2d(x, kernel, stride, padding, [1, 1], false)
}

fn bn_shape<B: Backend>(x: &Tensor<B, 4>, channels: usize) -> Option<BnShape> {
    let [batch, c, h, w] = x.dims();
    let shape = BnShape {
        batch,
        channels: c,
        plane: h * w,
    };
    (x.dtype() == DType::F32 && c == channels && batch * h * w > 0).then_some(shape)
}

/// Batch normalisation in training mode, as `torch.nn.functional.batch_norm(training=True)`:
/// each channel normalised with the batch's mean and biased variance, scaled by `weight` and
/// shifted by `bias`, then `relu` if asked (fused on the kernels). Returns the output and the
/// batch's mean and biased variance, detached, for the running statistics.
///
/// # Shapes
/// - `x`: `[batch, channels, h, w]`; `weight`, `bias`: `[channels]`
/// - output: `x`'s; mean and variance: `[channels]`
pub fn batch_norm2d_train<B: Backend>(
    x: impl Into<BnInput<B>>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
    relu: bool,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let BnInput { x, moments } = x.into();
    #[cfg(feature = "flex")]
    if uses_cpu_kernels::<B>() && weight.dtype() == DType::F32 {
        if let Some(shape) = bn_shape(&x, weight.dims()[0]) {
            return flex::batch_norm_train(x, weight, bias, shape, eps, relu, moments);
        }
    }
    let _ = moments;
    batch_norm2d_train_stock(x, weight, bias, eps, relu)
}

/// `relu(batch_norm2d_train(x) + residual)`: the end of a residual block, with the batch
/// norm's training-mode statistics. On the kernels (autodiff flex) one pass forward and one
/// backward, with the same values as the three ops (each element rounded as by them);
/// elsewhere the three ops. Returns the output and the batch's mean and biased variance,
/// detached, as [`batch_norm2d_train`].
///
/// # Shapes
/// - `x`, `residual`: `[batch, channels, h, w]`; `weight`, `bias`: `[channels]`
/// - output: `x`'s; mean and variance: `[channels]`
pub fn batch_norm2d_add_relu_train<B: Backend>(
    x: impl Into<BnInput<B>>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    residual: Tensor<B, 4>,
    eps: f64,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let x = x.into();
    #[cfg(feature = "flex")]
    if uses_cpu_kernels::<B>() && !flex::is_flex::<B>() && weight.dtype() == DType::F32 {
        let dims = x.tensor().dims();
        if let Some(shape) = bn_shape(x.tensor(), weight.dims()[0]).filter(|_| residual.dims() == dims) {
            if residual.dtype() == DType::F32 {
                let BnInput { x, moments } = x;
                return flex::batch_norm_add_relu_train(x, weight, bias, residual, shape, eps, moments);
            }
        }
    }
    let (y, mean, var) = batch_norm2d_train(x, weight, bias, eps, false);
    (burn::tensor::activation::relu(y.add(residual)), mean, var)
}

/// [`batch_norm2d_train`] through burn's own ops.
pub fn batch_norm2d_train_stock<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
    relu: bool,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let [batch, channels, h, w] = x.dims();
    // [channels, batch * h * w]
    let per_channel = x.clone().swap_dims(0, 1).reshape([channels, batch * h * w]);
    let mean = per_channel.clone().mean_dim(1).reshape([channels]);
    let var = per_channel
        .sub(mean.clone().reshape([channels, 1]))
        .square()
        .mean_dim(1)
        .reshape([channels]);
    let y = batch_norm2d_stock(x, mean.clone(), var.clone(), weight, bias, eps, relu);
    (y, mean.detach(), var.detach())
}

/// The fused shape of a batch norm over `x` with `channels`, pooled 2x2 with stride 2.
fn bn_pool_shape<B: Backend>(x: &Tensor<B, 4>, channels: usize) -> Option<BnPoolShape> {
    let [batch, c, in_h, in_w] = x.dims();
    let shape = BnPoolShape {
        batch,
        channels: c,
        in_h,
        in_w,
    };
    (x.dtype() == DType::F32 && c == channels && shape.is_valid()).then_some(shape)
}

/// `max_pool2d(relu(batch_norm2d_train(x)), 2)` (a 2x2 window, stride 2, no padding): on the
/// kernels one pass from the batch norm's input to the pooled output, and a backward without
/// the full-size intermediates; elsewhere the three ops. Returns the pooled output and the
/// batch's mean and biased variance, detached, as [`batch_norm2d_train`].
///
/// # Shapes
/// - `x`: `[batch, channels, h, w]`; `weight`, `bias`: `[channels]`
/// - output: `[batch, channels, h / 2, w / 2]`; mean and variance: `[channels]`
pub fn batch_norm2d_relu_pool2_train<B: Backend>(
    x: impl Into<BnInput<B>>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let x = x.into();
    #[cfg(feature = "flex")]
    if uses_cpu_kernels::<B>() && weight.dtype() == DType::F32 {
        if let Some(shape) = bn_pool_shape(&x.x, weight.dims()[0]) {
            return flex::batch_norm_relu_pool_train(x.x, weight, bias, shape, eps, x.moments);
        }
    }
    let (y, mean, var) = batch_norm2d_train(x, weight, bias, eps, true);
    (max_pool2d(y, [2, 2], [2, 2], [0, 0]), mean, var)
}

/// `batch_norm2d_relu_pool2_train(conv2d(x, weight, bias, options), ...)`: a convolution, then
/// batch norm in training mode, ReLU and a 2x2 max pool. On the kernels (autodiff flex) one
/// autodiff node: the statistics come from the convolution's moments, and the backward never
/// stores the convolution's full-size output gradient (each few images of it are produced and
/// consumed in cache); a first layer cheap to compute again (`cpu::conv::ConvImages`) does not
/// store its output either. The same values as the two ops. Returns the pooled output and the
/// batch's statistics.
///
/// # Shapes
/// - `x`: `[batch, in_channels, h, w]`; `bn_weight`, `bn_bias`: `[out_channels]`
/// - output: `[batch, out_channels, h_out / 2, w_out / 2]`; mean and variance: `[out_channels]`
pub fn conv2d_batch_norm2d_relu_pool2_train<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    options: Conv2dOptions,
    bn_weight: Tensor<B, 1>,
    bn_bias: Tensor<B, 1>,
    eps: f64,
) -> (Tensor<B, 4>, BatchStats<B>) {
    #[cfg(feature = "flex")]
    if uses_cpu_kernels::<B>() && flex::is_autodiff_flex::<B>() && bn_weight.dtype() == DType::F32 {
        if let Some(s) = conv_shape(&x, &weight, options) {
            let shape = BnPoolShape::after(&s);
            if shape.is_valid() && bn_weight.dims() == [s.out_channels] && bn_bias.dims() == [s.out_channels]
            {
                let (z, mean, var) = flex::conv2d_batch_norm_relu_pool_train(
                    x,
                    weight,
                    bias,
                    s,
                    options.relu,
                    bn_weight,
                    bn_bias,
                    shape,
                    eps,
                );
                let count = shape.bn().count();
                return (z, BatchStats { mean, var, count });
            }
        }
    }
    batch_norm2d_relu_pool2_train_stats(conv2d_moments(x, weight, bias, options), bn_weight, bn_bias, eps)
}

/// `batch_norm2d_train(conv2d(x, weight, bias, options), bn_weight, bn_bias, eps, relu)`, or
/// with a `residual`, `batch_norm2d_add_relu_train(conv2d(..), bn_weight, bn_bias, residual,
/// eps)` (`relu` is then implied): a convolution and the training batch norm after it. On the
/// kernels (autodiff flex), where the convolution's backward reads its output gradient once
/// (`cpu::conv::reads_output_grad_once`), one autodiff node whose backward never stores that
/// gradient (each few images of it are produced and consumed in cache); elsewhere
/// [`conv2d_moments`] and the batch norm, two nodes. The same values either way. Returns the
/// output and the batch's mean and biased variance, detached.
///
/// # Shapes
/// - `x`: `[batch, in_channels, h, w]`; `bn_weight`, `bn_bias`: `[out_channels]`
/// - `residual`, output: `[batch, out_channels, h_out, w_out]`; mean and variance:
///   `[out_channels]`
#[allow(clippy::too_many_arguments)]
pub fn conv2d_batch_norm2d_train<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    options: Conv2dOptions,
    bn_weight: Tensor<B, 1>,
    bn_bias: Tensor<B, 1>,
    eps: f64,
    relu: bool,
    residual: Option<Tensor<B, 4>>,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    #[cfg(feature = "flex")]
    if uses_cpu_kernels::<B>() && flex::is_autodiff_flex::<B>() && bn_weight.dtype() == DType::F32 {
        if let Some(s) = conv_shape(&x, &weight, options).filter(cpu::conv::reads_output_grad_once) {
            let out = [s.batch, s.out_channels, s.out_h(), s.out_w()];
            let fits = bn_weight.dims() == [s.out_channels]
                && bn_bias.dims() == [s.out_channels]
                && bias.as_ref().is_none_or(|b| b.dims() == [s.out_channels])
                && residual
                    .as_ref()
                    .is_none_or(|r| r.dims() == out && r.dtype() == DType::F32);
            if fits {
                return flex::conv2d_batch_norm_train(
                    x,
                    weight,
                    bias,
                    s,
                    options.relu,
                    bn_weight,
                    bn_bias,
                    eps,
                    relu,
                    residual,
                );
            }
        }
    }
    let y = conv2d_moments(x, weight, bias, options);
    match residual {
        Some(r) => batch_norm2d_add_relu_train(y, bn_weight, bn_bias, r, eps),
        None => batch_norm2d_train(y, bn_weight, bn_bias, eps, relu),
    }
}

/// A training batch norm's batch statistics, detached: each channel's mean and biased variance
/// over its `count` elements.
pub struct BatchStats<B: Backend> {
    pub mean: Tensor<B, 1>,
    pub var: Tensor<B, 1>,
    pub count: usize,
}

/// [`batch_norm2d_relu_pool2_train`] with the statistics' element count.
pub fn batch_norm2d_relu_pool2_train_stats<B: Backend>(
    x: impl Into<BnInput<B>>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
) -> (Tensor<B, 4>, BatchStats<B>) {
    let x = x.into();
    let [batch, _, h, w] = x.tensor().dims();
    let (z, mean, var) = batch_norm2d_relu_pool2_train(x, weight, bias, eps);
    let count = batch * h * w;
    (z, BatchStats { mean, var, count })
}

/// [`batch_norm2d_relu_pool2_train`] with given statistics (inference).
///
/// # Shapes
/// - `x`: `[batch, channels, h, w]`; the others `[channels]`
/// - output: `[batch, channels, h / 2, w / 2]`
pub fn batch_norm2d_relu_pool2_eval<B: Backend>(
    x: Tensor<B, 4>,
    mean: Tensor<B, 1>,
    var: Tensor<B, 1>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, 4> {
    #[cfg(feature = "flex")]
    if is_flex::<B>() && weight.dtype() == DType::F32 {
        if let Some(shape) = bn_pool_shape(&x, weight.dims()[0]) {
            return flex::batch_norm_relu_pool_eval(x, mean, var, weight, bias, shape, eps);
        }
    }
    let y = batch_norm2d_eval(x, mean, var, weight, bias, eps, true);
    max_pool2d(y, [2, 2], [2, 2], [0, 0])
}

/// Batch normalisation with given statistics (inference), as
/// `torch.nn.functional.batch_norm(training=False)`, then `relu` if asked.
///
/// # Shapes
/// - `x`: `[batch, channels, h, w]`; the others `[channels]`
pub fn batch_norm2d_eval<B: Backend>(
    x: Tensor<B, 4>,
    mean: Tensor<B, 1>,
    var: Tensor<B, 1>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
    relu: bool,
) -> Tensor<B, 4> {
    #[cfg(feature = "flex")]
    if is_flex::<B>() && weight.dtype() == DType::F32 {
        if let Some(shape) = bn_shape(&x, weight.dims()[0]) {
            return flex::batch_norm_eval(x, mean, var, weight, bias, None, shape, eps, relu);
        }
    }
    batch_norm2d_stock(x, mean, var, weight, bias, eps, relu)
}

/// `relu(batch_norm2d_eval(x) + residual)`: the end of a residual block in inference. On the
/// kernels (flex) one pass with the same values as the three ops (each element rounded as by
/// them); elsewhere the three ops.
///
/// # Shapes
/// - `x`, `residual`: `[batch, channels, h, w]`; the others `[channels]`
/// - output: `x`'s
pub fn batch_norm2d_add_relu_eval<B: Backend>(
    x: Tensor<B, 4>,
    mean: Tensor<B, 1>,
    var: Tensor<B, 1>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    residual: Tensor<B, 4>,
    eps: f64,
) -> Tensor<B, 4> {
    #[cfg(feature = "flex")]
    if is_flex::<B>() && weight.dtype() == DType::F32 && residual.dtype() == DType::F32 {
        if let Some(shape) = bn_shape(&x, weight.dims()[0]).filter(|_| residual.dims() == x.dims()) {
            return flex::batch_norm_eval(x, mean, var, weight, bias, Some(residual), shape, eps, true);
        }
    }
    let y = batch_norm2d_eval(x, mean, var, weight, bias, eps, false);
    burn::tensor::activation::relu(y.add(residual))
}

/// `(x - mean) / sqrt(var + eps) * weight + bias` per channel with burn's ops, then `relu`.
fn batch_norm2d_stock<B: Backend>(
    x: Tensor<B, 4>,
    mean: Tensor<B, 1>,
    var: Tensor<B, 1>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
    relu: bool,
) -> Tensor<B, 4> {
    let shape = [1, mean.dims()[0], 1, 1];
    let inv_std = var.add_scalar(eps).sqrt().recip();
    let y = x
        .sub(mean.reshape(shape))
        .mul(inv_std.reshape(shape))
        .mul(weight.reshape(shape))
        .add(bias.reshape(shape));
    relu_if(y, relu)
}
