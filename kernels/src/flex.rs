//! The kernels on burn's flex backend: forward ops on `Flex`, and custom autodiff ops with
//! their own backward nodes on `Autodiff<Flex>`.

use std::fmt;
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::NodeId;
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};

use crate::cpu;
use crate::cpu::batch_norm::{
    batch_norm_backward, batch_stats, batch_stats_from, bn_input_grad, bn_pool_input_grad, combine_moments,
    inv_std, normalise, normalise_add_relu, normalise_relu_pool_from, to_f32, BnPoolInputGrad, BnPoolShape,
    BnShape, MapMoments,
};
use crate::cpu::conv::{conv2d_backward_from, conv2d_forward, conv2d_forward_moments, ConvImages, ConvShape};
use crate::cpu::dropout::{dropout_backward, dropout_forward, DropoutMask};
use crate::cpu::linear::LinearShape;
use crate::cpu::pool::{max_pool2d_backward, max_pool2d_forward, PoolShape};
use crate::cpu::Images;
use crate::{cast, same_type};

/// The autodiff backend the kernels serve: `Autodiff<Flex>` with burn's default (no)
/// checkpointing, which is what `burn::backend::Autodiff<Flex>` names.
type Ad = Autodiff<Flex>;
type AdTensor = FloatTensor<Ad>;

pub(crate) fn is_flex<B: Backend>() -> bool {
    same_type::<B, Flex>()
}

pub(crate) fn is_autodiff_flex<B: Backend>() -> bool {
    same_type::<B, Ad>()
}

fn primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

fn tensor<B: Backend, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// `t` with its elements contiguous from offset 0, sharing its buffer when they already are.
pub(crate) fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        return t;
    }
    t.to_contiguous()
}

pub(crate) fn f32s(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("a contiguous f32 flex tensor")
}

pub(crate) fn from_vec<const D: usize>(values: Vec<f32>, shape: [usize; D]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

/// `Some` output of `len` values written by `kernel` ([`cpu::fresh`]) when `want`, else `kernel`
/// run without that output (`None`).
fn fresh_if(want: bool, len: usize, kernel: impl FnOnce(Option<cpu::Out<'_>>)) -> Option<Vec<f32>> {
    if !want {
        kernel(None);
        return None;
    }
    Some(cpu::fresh(len, |out| kernel(Some(out))))
}

fn conv_out_shape(s: &ConvShape) -> [usize; 4] {
    [s.batch, s.out_channels, s.out_h(), s.out_w()]
}

/// The convolution's output, and the moments of its maps into `moments` when given.
fn conv_forward(
    x: &FlexTensor,
    w: &FlexTensor,
    b: Option<&FlexTensor>,
    s: &ConvShape,
    relu: bool,
    moments: Option<&mut [MapMoments]>,
) -> FlexTensor {
    let (x, w, b) = (f32s(x), f32s(w), b.map(f32s));
    let out = cpu::fresh(s.batch * s.out_image(), |out| match moments {
        Some(m) => conv2d_forward_moments(s, x, w, b, relu, out, m),
        None => conv2d_forward(s, x, w, b, relu, out),
    });
    from_vec(out, conv_out_shape(s))
}

/// Dispatches a convolution (with its ReLU when `relu`) of backend `B` (flex or autodiff flex) to
/// the kernels.
pub(crate) fn conv2d<B: Backend>(
    x: Tensor<B, 4>,
    w: Tensor<B, 4>,
    b: Option<Tensor<B, 1>>,
    s: ConvShape,
    relu: bool,
) -> Tensor<B, 4> {
    if is_flex::<B>() {
        let (x, w) = (contiguous(flex_prim(x)), contiguous(flex_prim(w)));
        let b = b.map(|b| contiguous(flex_prim(b)));
        let out = conv_forward(&x, &w, b.as_ref(), &s, relu, None);
        return back::<B, 4>(tensor::<Flex, 4>(out));
    }
    let (x, w) = (ad_prim(x), ad_prim(w));
    let b = b.map(ad_prim);
    back::<B, 4>(tensor::<Ad, 4>(conv2d_autodiff(x, w, b, s, relu, None)))
}

/// [`conv2d`] on autodiff flex, with the moments of the output's maps (`[batch, out_channels]`)
/// for the batch norm that follows.
pub(crate) fn conv2d_moments<B: Backend>(
    x: Tensor<B, 4>,
    w: Tensor<B, 4>,
    b: Option<Tensor<B, 1>>,
    s: ConvShape,
    relu: bool,
) -> (Tensor<B, 4>, Vec<MapMoments>) {
    let mut moments = vec![MapMoments::default(); s.batch * s.out_channels];
    let (x, w) = (ad_prim(x), ad_prim(w));
    let b = b.map(ad_prim);
    let y = conv2d_autodiff(x, w, b, s, relu, Some(&mut moments));
    (back::<B, 4>(tensor::<Ad, 4>(y)), moments)
}

fn flex_prim<B: Backend, const D: usize>(t: Tensor<B, D>) -> FlexTensor {
    primitive::<Flex, D>(cast(t).ok().expect("backend is Flex"))
}

fn ad_prim<B: Backend, const D: usize>(t: Tensor<B, D>) -> AdTensor {
    primitive::<Ad, D>(cast(t).ok().expect("backend is Autodiff<Flex>"))
}

fn back<B: Backend, const D: usize>(t: Tensor<impl Backend, D>) -> Tensor<B, D> {
    cast(t).ok().expect("the caller's backend")
}

#[derive(Debug)]
struct ConvBackward;

/// What a convolution's or fully connected layer's backward reads: its input and weight, and its
/// output when a ReLU was fused into it (all shared, not copied), and its shapes `S`.
#[derive(Clone)]
struct LayerState<S> {
    x: FlexTensor,
    w: FlexTensor,
    relu_out: Option<FlexTensor>,
    shape: S,
}

impl<S: fmt::Debug> fmt::Debug for LayerState<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LayerState({:?})", self.shape)
    }
}

/// A constant zero bias of `len` (no gradient is tracked for it): a layer without a bias keeps
/// the one node type with three parents.
fn zero_bias(len: usize) -> AdTensor {
    AdTensor::new(from_vec(vec![0.0; len], [len]))
}

/// Registers `values` (shaped `shape`) as the gradient of `node`, when both exist.
fn register<const D: usize>(
    grads: &mut Gradients,
    node: Option<NodeId>,
    values: Option<Vec<f32>>,
    shape: [usize; D],
) {
    if let (Some(node), Some(values)) = (node, values) {
        grads.register::<Flex>(node, from_vec(values, shape));
    }
}

impl Backward<Flex, 3> for ConvBackward {
    type State = LayerState<ConvShape>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let parents = ops.parents.map(|p| p.map(|n| n.id));
        conv_grads(&ops.state, Images::Values(f32s(&dy)), parents, grads);
    }
}

/// A convolution's gradients from `dy` for the parents that want them (input, weight, bias),
/// registered in `grads`.
fn conv_grads(
    conv: &LayerState<ConvShape>,
    dy: Images<'_>,
    [node_x, node_w, node_b]: [Option<NodeId>; 3],
    grads: &mut Gradients,
) {
    let s = conv.shape;
    let mut dw = node_w.as_ref().map(|_| cpu::zeroed::<f32>(s.weight_len()));
    let mut db = node_b.as_ref().map(|_| cpu::zeroed::<f32>(s.out_channels));
    if node_x.is_none() && dw.is_none() && db.is_none() {
        return;
    }
    let dx = fresh_if(node_x.is_some(), s.batch * s.in_image(), |dx| {
        conv2d_backward_from(
            &s,
            f32s(&conv.x),
            f32s(&conv.w),
            dy,
            conv.relu_out.as_ref().map(f32s),
            dx,
            dw.as_deref_mut(),
            db.as_deref_mut(),
        )
    });
    register(grads, node_x, dx, [s.batch, s.in_channels, s.in_h, s.in_w]);
    let weight_shape = [s.out_channels, s.in_channels, s.kernel[0], s.kernel[1]];
    register(grads, node_w, dw, weight_shape);
    register(grads, node_b, db, [s.out_channels]);
}

fn conv2d_autodiff(
    x: AdTensor,
    w: AdTensor,
    b: Option<AdTensor>,
    s: ConvShape,
    relu: bool,
    moments: Option<&mut [MapMoments]>,
) -> AdTensor {
    let b = b.unwrap_or_else(|| zero_bias(s.out_channels));
    let (xp, wp, bp) = (
        contiguous(x.primitive),
        contiguous(w.primitive),
        contiguous(b.primitive),
    );
    let out = conv_forward(&xp, &wp, Some(&bp), &s, relu, moments);
    match ConvBackward
        .prepare::<NoCheckpointing>([x.node, w.node, b.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            LayerState {
                x: xp,
                w: wp,
                relu_out: relu.then(|| out.clone()),
                shape: s,
            },
            out,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

fn linear_forward(
    x: &FlexTensor,
    w: &FlexTensor,
    b: Option<&FlexTensor>,
    s: &LinearShape,
    relu: bool,
) -> FlexTensor {
    let mut y = cpu::zeroed::<f32>(s.batch * s.outputs);
    cpu::linear::linear_forward(s, f32s(x), f32s(w), b.map(f32s), relu, &mut y);
    from_vec(y, [s.batch, s.outputs])
}

/// Dispatches a fully connected layer (with its ReLU when `relu`) of backend `B` (flex or
/// autodiff flex) to the kernels.
pub(crate) fn linear<B: Backend>(
    x: Tensor<B, 2>,
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
    s: LinearShape,
    relu: bool,
) -> Tensor<B, 2> {
    if is_flex::<B>() {
        let (x, w) = (contiguous(flex_prim(x)), contiguous(flex_prim(w)));
        let b = b.map(|b| contiguous(flex_prim(b)));
        return back::<B, 2>(tensor::<Flex, 2>(linear_forward(&x, &w, b.as_ref(), &s, relu)));
    }
    let (x, w) = (ad_prim(x), ad_prim(w));
    let b = b.map(ad_prim).unwrap_or_else(|| zero_bias(s.outputs));
    let (xp, wp, bp) = (
        contiguous(x.primitive),
        contiguous(w.primitive),
        contiguous(b.primitive),
    );
    let y = linear_forward(&xp, &wp, Some(&bp), &s, relu);
    let y = match LinearBackward
        .prepare::<NoCheckpointing>([x.node, w.node, b.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            LayerState {
                x: xp,
                w: wp,
                relu_out: relu.then(|| y.clone()),
                shape: s,
            },
            y,
        ),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    back::<B, 2>(tensor::<Ad, 2>(y))
}

#[derive(Debug)]
struct LinearBackward;

impl Backward<Flex, 3> for LinearBackward {
    type State = LayerState<LinearShape>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let LayerState {
            x,
            w,
            relu_out,
            shape: s,
        } = ops.state;
        let mut dx = node_x.as_ref().map(|_| cpu::zeroed::<f32>(s.batch * s.inputs));
        let mut dw = node_w.as_ref().map(|_| cpu::zeroed::<f32>(s.inputs * s.outputs));
        let mut db = node_b.as_ref().map(|_| cpu::zeroed::<f32>(s.outputs));
        cpu::linear::linear_backward(
            &s,
            f32s(&x),
            f32s(&w),
            f32s(&dy),
            relu_out.as_ref().map(f32s),
            dx.as_deref_mut(),
            dw.as_deref_mut(),
            db.as_deref_mut(),
        );
        register(grads, node_x.map(|n| n.id), dx, [s.batch, s.inputs]);
        register(grads, node_w.map(|n| n.id), dw, [s.inputs, s.outputs]);
        register(grads, node_b.map(|n| n.id), db, [s.outputs]);
    }
}

fn pool_forward(x: &FlexTensor, s: &PoolShape) -> (FlexTensor, Vec<u32>) {
    let n = s.planes() * s.out_plane();
    let mut argmax = Vec::new();
    let out = cpu::fresh(n, |out| {
        argmax = cpu::fresh(n, |argmax| max_pool2d_forward(s, f32s(x), out, argmax))
    });
    (from_vec(out, [s.batch, s.channels, s.out_h(), s.out_w()]), argmax)
}

/// Dispatches a max pooling of backend `B` (flex or autodiff flex) to the kernels.
pub(crate) fn max_pool2d<B: Backend>(x: Tensor<B, 4>, s: PoolShape) -> Tensor<B, 4> {
    if is_flex::<B>() {
        let (out, _) = pool_forward(&contiguous(flex_prim(x)), &s);
        return back::<B, 4>(tensor::<Flex, 4>(out));
    }
    let x = ad_prim(x);
    let (out, argmax) = pool_forward(&contiguous(x.primitive), &s);
    let out = match PoolBackward
        .prepare::<NoCheckpointing>([x.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            PoolState {
                argmax: Arc::new(argmax),
                shape: s,
            },
            out,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    back::<B, 4>(tensor::<Ad, 4>(out))
}

#[derive(Debug)]
struct PoolBackward;

#[derive(Clone)]
struct PoolState {
    argmax: Arc<Vec<u32>>,
    shape: PoolShape,
}

impl fmt::Debug for PoolState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PoolState({:?})", self.shape)
    }
}

impl Backward<Flex, 1> for PoolBackward {
    type State = PoolState;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let Some(node) = node_x else { return };
        let s = ops.state.shape;
        let dx = cpu::fresh(s.planes() * s.in_plane(), |dx| {
            max_pool2d_backward(&s, f32s(&dy), &ops.state.argmax, dx)
        });
        grads.register::<Flex>(node.id, from_vec(dx, [s.batch, s.channels, s.in_h, s.in_w]));
    }
}

/// `t`'s elements contiguous from offset 0 in a buffer of exactly their size, so that
/// `storage_mut` addresses just them (it copies the buffer first if it is shared).
fn owned(t: FlexTensor) -> FlexTensor {
    t.to_contiguous()
}

/// Body of the fused optimizer update (the `optim` module's `update`) on flex tensors.
pub(crate) fn optim_update<B: Backend, const D: usize>(
    rule: crate::cpu::optim::Rule,
    weight_decay: f64,
    param: Tensor<B, D>,
    grad: Tensor<B, D>,
    state: (Option<Tensor<B, D>>, Option<Tensor<B, D>>),
) -> (Tensor<B, D>, (Option<Tensor<B, D>>, Option<Tensor<B, D>>)) {
    let shape = param.shape();
    let mut param = owned(flex_prim(param));
    let mut grad = owned(flex_prim(grad));
    let used = rule.buffers();
    // A buffer the rule uses: the last step's, or zeros as `torch.optim` starts; an unused one
    // is empty.
    let buffer = |kept: Option<Tensor<B, D>>, index: usize| match kept {
        Some(t) if index < used => owned(flex_prim(t)),
        _ if index < used => FlexTensor::zeros(shape.clone(), burn::tensor::DType::F32),
        _ => FlexTensor::zeros([0].into(), burn::tensor::DType::F32),
    };
    let (mut first, mut second) = (buffer(state.0, 0), buffer(state.1, 1));
    crate::cpu::optim::update(
        rule,
        weight_decay,
        param.storage_mut(),
        grad.storage_mut(),
        first.storage_mut(),
        second.storage_mut(),
    );
    let param = back::<B, D>(tensor::<Flex, D>(param));
    let keep = |t: FlexTensor, index: usize| (index < used).then(|| back::<B, D>(tensor::<Flex, D>(t)));
    (param, (keep(first, 0), keep(second, 1)))
}

/// burn's `Dropout` (drop probability `prob`, in `(0, 1]`) on `Autodiff<Flex>`, with its mask
/// from [`cpu::dropout`].
pub(crate) fn dropout<B: Backend, const D: usize>(x: Tensor<B, D>, prob: f64) -> Tensor<B, D> {
    let dims = x.dims();
    let x = ad_prim(x);
    let keep = 1.0 - prob;
    let mask = DropoutMask {
        key: crate::next_dropout_key(),
        keep,
    };
    let scale = (1.0 / keep) as f32;
    let xp = contiguous(x.primitive);
    let out = cpu::fresh(dims.iter().product(), |out| {
        dropout_forward(&mask, scale, f32s(&xp), out)
    });
    let out = from_vec(out, dims);
    let out = match DropoutBackward
        .prepare::<NoCheckpointing>([x.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(DropoutState { mask, scale }, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    back::<B, D>(tensor::<Ad, D>(out))
}

#[derive(Debug)]
struct DropoutBackward;

#[derive(Clone, Debug)]
struct DropoutState {
    mask: DropoutMask,
    scale: f32,
}

impl Backward<Flex, 1> for DropoutBackward {
    type State = DropoutState;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let Some(node) = node_x else { return };
        let DropoutState { mask, scale } = ops.state;
        let dx = cpu::fresh(dy.layout().num_elements(), |dx| {
            dropout_backward(&mask, scale, f32s(&dy), dx)
        });
        grads.register::<Flex>(
            node.id,
            FlexTensor::from_data(TensorData::new(dx, dy.layout().shape().clone())),
        );
    }
}

#[derive(Debug)]
struct BatchNormBackward;

/// What batch norm's backward reads: the input, the batch's statistics, the scale, and the
/// output when a ReLU was fused.
#[derive(Clone)]
struct BnState {
    x: FlexTensor,
    mean: Vec<f64>,
    inv_std: Vec<f64>,
    weight: FlexTensor,
    relu_out: Option<FlexTensor>,
    shape: BnShape,
    dims: [usize; 4],
}

impl fmt::Debug for BnState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BnState({:?})", self.shape)
    }
}

impl Backward<Flex, 3> for BatchNormBackward {
    type State = BnState;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let ids = [node_x, node_w, node_b].map(|n| n.map(|n| n.id));
        batch_norm_grads(ops.state, &dy, ids, grads);
    }
}

/// [`batch_norm_add_relu_train`]'s backward: batch norm's, gated by the ReLU on the sum's
/// output, and the residual's gradient, `dy` where that output is positive.
#[derive(Debug)]
struct BatchNormAddBackward;

impl Backward<Flex, 4> for BatchNormAddBackward {
    type State = BnState;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w, node_b, node_r] = ops.parents;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        if let Some(node) = node_r {
            let y = ops
                .state
                .relu_out
                .as_ref()
                .expect("the fused op keeps its output");
            let dr = cpu::par_relu_mask(f32s(&dy), f32s(y));
            register(grads, Some(node.id), Some(dr), ops.state.dims);
        }
        let ids = [node_x, node_w, node_b].map(|n| n.map(|n| n.id));
        batch_norm_grads(ops.state, &dy, ids, grads);
    }
}

/// Batch norm's gradients from `dy` (gated by `relu_out` when kept) for the parents that want
/// them: input, weight, bias.
fn batch_norm_grads(
    s: BnState,
    dy: &FlexTensor,
    [node_x, node_w, node_b]: [Option<NodeId>; 3],
    grads: &mut Gradients,
) {
    let sh = s.shape;
    let mut dw = node_w.as_ref().map(|_| vec![0.0; sh.channels]);
    let mut db = node_b.as_ref().map(|_| vec![0.0; sh.channels]);
    let dx = fresh_if(node_x.is_some(), sh.len(), |dx| {
        batch_norm_backward(
            &sh,
            f32s(&s.x),
            &s.mean,
            &s.inv_std,
            f32s(&s.weight),
            f32s(dy),
            s.relu_out.as_ref().map(f32s),
            dx,
            dw.as_deref_mut(),
            db.as_deref_mut(),
        )
    });
    register(grads, node_x, dx, s.dims);
    register(grads, node_w, dw, [sh.channels]);
    register(grads, node_b, db, [sh.channels]);
}

/// `(mean, biased variance)` per channel of `x`: from the moments of its maps when its
/// convolution took them, else by a pass over it. The same values either way.
fn stats_of(s: &BnShape, x: &FlexTensor, moments: Option<&[MapMoments]>) -> (Vec<f64>, Vec<f64>) {
    match moments {
        Some(m) => combine_moments(s, m),
        None => batch_stats(s, f32s(x)),
    }
}

/// Batch norm in training mode on backend `B` (flex or autodiff flex): the output and the
/// batch's mean and biased variance (untracked).
pub(crate) fn batch_norm_train<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    shape: BnShape,
    eps: f64,
    relu: bool,
    moments: Option<Vec<MapMoments>>,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let dims = x.dims();
    let forward = |x: &FlexTensor, w: &FlexTensor, b: &FlexTensor| {
        let (mean, var) = stats_of(&shape, x, moments.as_deref());
        let inv = inv_std(&var, eps);
        let y = cpu::fresh(shape.len(), |y| {
            normalise(
                &shape,
                f32s(x),
                &to_f32(&mean),
                &to_f32(&inv),
                f32s(w),
                f32s(b),
                relu,
                y,
            )
        });
        (from_vec(y, dims), mean, var, inv)
    };
    let stats = |mean: &[f64], var: &[f64]| {
        let c = shape.channels;
        (from_vec(to_f32(mean), [c]), from_vec(to_f32(var), [c]))
    };
    if is_flex::<B>() {
        let (x, w, b) = (
            contiguous(flex_prim(x)),
            contiguous(flex_prim(weight)),
            contiguous(flex_prim(bias)),
        );
        let (y, mean, var, _) = forward(&x, &w, &b);
        let (mean, var) = stats(&mean, &var);
        return (
            back::<B, 4>(tensor::<Flex, 4>(y)),
            back::<B, 1>(tensor::<Flex, 1>(mean)),
            back::<B, 1>(tensor::<Flex, 1>(var)),
        );
    }
    let (x, w, b) = (ad_prim(x), ad_prim(weight), ad_prim(bias));
    let (xp, wp, bp) = (
        contiguous(x.primitive),
        contiguous(w.primitive),
        contiguous(b.primitive),
    );
    let (y, mean, var, inv) = forward(&xp, &wp, &bp);
    let (mean_t, var_t) = stats(&mean, &var);
    let y = match BatchNormBackward
        .prepare::<NoCheckpointing>([x.node, w.node, b.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            BnState {
                x: xp,
                mean,
                inv_std: inv,
                weight: wp,
                relu_out: relu.then(|| y.clone()),
                shape,
                dims,
            },
            y,
        ),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    ad_outputs(y, [mean_t, var_t])
}

/// `relu(batch norm (training mode) of x + residual)` on backend `B` (autodiff flex): one pass
/// forward and one backward where burn would run three ops each way. The output and the
/// batch's mean and biased variance (untracked).
pub(crate) fn batch_norm_add_relu_train<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    residual: Tensor<B, 4>,
    shape: BnShape,
    eps: f64,
    moments: Option<Vec<MapMoments>>,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let dims = x.dims();
    let (x, w, b, r) = (ad_prim(x), ad_prim(weight), ad_prim(bias), ad_prim(residual));
    let (xp, wp, bp, rp) = (
        contiguous(x.primitive),
        contiguous(w.primitive),
        contiguous(b.primitive),
        contiguous(r.primitive),
    );
    let (mean, var) = stats_of(&shape, &xp, moments.as_deref());
    let inv = inv_std(&var, eps);
    let y = cpu::fresh(shape.len(), |y| {
        normalise_add_relu(
            &shape,
            f32s(&xp),
            &to_f32(&mean),
            &to_f32(&inv),
            f32s(&wp),
            f32s(&bp),
            f32s(&rp),
            y,
        )
    });
    let y = from_vec(y, dims);
    let c = shape.channels;
    let (mean_t, var_t) = (from_vec(to_f32(&mean), [c]), from_vec(to_f32(&var), [c]));
    let y = match BatchNormAddBackward
        .prepare::<NoCheckpointing>([x.node, w.node, b.node, r.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            BnState {
                x: xp,
                mean,
                inv_std: inv,
                weight: wp,
                relu_out: Some(y.clone()),
                shape,
                dims,
            },
            y,
        ),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    ad_outputs(y, [mean_t, var_t])
}

/// `1 / sqrt(var + eps)` of running variances, in `f64` and rounded to `f32`.
fn running_inv_std(var: &FlexTensor, eps: f64) -> Vec<f32> {
    let var: Vec<f64> = f32s(var).iter().map(|&v| f64::from(v)).collect();
    to_f32(&inv_std(&var, eps))
}

/// Batch norm with given statistics (inference) on flex, then `relu`; with a `residual`,
/// `relu(batch_norm(x) + residual)` (`relu` is then implied).
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_eval<B: Backend>(
    x: Tensor<B, 4>,
    mean: Tensor<B, 1>,
    var: Tensor<B, 1>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    residual: Option<Tensor<B, 4>>,
    shape: BnShape,
    eps: f64,
    relu: bool,
) -> Tensor<B, 4> {
    let dims = x.dims();
    let [x, mean, var, w, b] = [
        contiguous(flex_prim(x)),
        contiguous(flex_prim(mean)),
        contiguous(flex_prim(var)),
        contiguous(flex_prim(weight)),
        contiguous(flex_prim(bias)),
    ];
    let residual = residual.map(|r| contiguous(flex_prim(r)));
    let inv = running_inv_std(&var, eps);
    let (x, mean, w, b) = (f32s(&x), f32s(&mean), f32s(&w), f32s(&b));
    let y = cpu::fresh(shape.len(), |y| match &residual {
        Some(r) => normalise_add_relu(&shape, x, mean, &inv, w, b, f32s(r), y),
        None => normalise(&shape, x, mean, &inv, w, b, relu, y),
    });
    back::<B, 4>(tensor::<Flex, 4>(from_vec(y, dims)))
}

#[derive(Debug)]
struct BnPoolBackward;

/// What the fused batch norm + ReLU + pool's backward reads besides its input: the batch's
/// statistics, the scale, and the pooled output with its argmax and the input there (all
/// pooled-size).
#[derive(Clone)]
struct BnPoolState {
    mean: Vec<f64>,
    inv_std: Vec<f64>,
    weight: FlexTensor,
    z: FlexTensor,
    argmax: Arc<Vec<u32>>,
    x_at: Arc<Vec<f32>>,
    shape: BnPoolShape,
}

impl fmt::Debug for BnPoolState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BnPoolState({:?})", self.shape)
    }
}

/// [`BnPoolBackward`]'s state: the input it keeps, and the rest.
#[derive(Clone, Debug)]
struct BnPoolKept {
    x: FlexTensor,
    bn: BnPoolState,
}

impl Backward<Flex, 3> for BnPoolBackward {
    type State = BnPoolKept;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents.map(|p| p.map(|n| n.id));
        let dz = contiguous(grads.consume::<Flex>(&ops.node));
        let BnPoolKept { x, bn } = &ops.state;
        let sh = bn.shape;
        let grad = bn_pool_grads(bn, Images::Values(f32s(x)), &dz, [node_w, node_b], grads);
        let dx = fresh_if(node_x.is_some(), sh.bn().len(), |dx| {
            if let Some(dx) = dx {
                grad.all(dx)
            }
        });
        register(grads, node_x, dx, [sh.batch, sh.channels, sh.in_h, sh.in_w]);
    }
}

/// Batch norm + ReLU + pool's weight and bias gradients from `dz` (registered for the parents
/// that want them) and its input gradient, to take whole or image by image.
fn bn_pool_grads<'a>(
    s: &'a BnPoolState,
    x: Images<'a>,
    dz: &'a FlexTensor,
    [node_w, node_b]: [Option<NodeId>; 2],
    grads: &mut Gradients,
) -> BnPoolInputGrad<'a> {
    let c = s.shape.channels;
    let mut dw = node_w.as_ref().map(|_| vec![0.0; c]);
    let mut db = node_b.as_ref().map(|_| vec![0.0; c]);
    let grad = bn_pool_input_grad(
        &s.shape,
        x,
        &s.mean,
        &s.inv_std,
        f32s(&s.weight),
        f32s(dz),
        f32s(&s.z),
        &s.argmax,
        &s.x_at,
        dw.as_deref_mut(),
        db.as_deref_mut(),
    );
    register(grads, node_w, dw, [c]);
    register(grads, node_b, db, [c]);
    grad
}

/// The fused forward: pooled output, argmax and input at the maxima.
fn bn_pool_forward(
    s: &BnPoolShape,
    x: Images<'_>,
    mean: &[f32],
    inv: &[f32],
    w: &FlexTensor,
    b: &FlexTensor,
) -> (FlexTensor, Vec<u32>, Vec<f32>) {
    let n = s.out_len();
    let (mut argmax, mut x_at) = (Vec::new(), Vec::new());
    let z = cpu::fresh(n, |z| {
        argmax = cpu::fresh(n, |argmax| {
            x_at = cpu::fresh(n, |x_at| {
                normalise_relu_pool_from(s, x, mean, inv, f32s(w), f32s(b), z, argmax, x_at)
            })
        })
    });
    (
        from_vec(z, [s.batch, s.channels, s.out_h(), s.out_w()]),
        argmax,
        x_at,
    )
}

/// `max_pool2d(relu(batch_norm_train(x)), 2)` on backend `B` (flex or autodiff flex): the pooled
/// output and the batch's mean and biased variance (untracked).
pub(crate) fn batch_norm_relu_pool_train<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    shape: BnPoolShape,
    eps: f64,
    moments: Option<Vec<MapMoments>>,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    if is_flex::<B>() {
        let [x, w, b] = [flex_prim(x), flex_prim(weight), flex_prim(bias)].map(contiguous);
        let stats = stats_of(&shape.bn(), &x, moments.as_deref());
        let (z, _, [mean, var]) = bn_pool_train(&shape, Images::Values(f32s(&x)), stats, eps, w, &b);
        return (
            back::<B, 4>(tensor::<Flex, 4>(z)),
            back::<B, 1>(tensor::<Flex, 1>(mean)),
            back::<B, 1>(tensor::<Flex, 1>(var)),
        );
    }
    let (x, w, b) = (ad_prim(x), ad_prim(weight), ad_prim(bias));
    let [xp, wp, bp] = [x.primitive, w.primitive, b.primitive].map(contiguous);
    let stats = stats_of(&shape.bn(), &xp, moments.as_deref());
    let (z, bn, stats) = bn_pool_train(&shape, Images::Values(f32s(&xp)), stats, eps, wp, &bp);
    let z = match BnPoolBackward
        .prepare::<NoCheckpointing>([x.node, w.node, b.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(BnPoolKept { x: xp, bn }, z),
        OpsKind::UnTracked(prep) => prep.finish(z),
    };
    ad_outputs(z, stats)
}

/// Batch norm (training, the batch's `(mean, var)`), ReLU and 2x2 pool on `x`: the pooled
/// output, the state its backward keeps besides `x`, and the mean and variance as tensors.
fn bn_pool_train(
    shape: &BnPoolShape,
    x: Images<'_>,
    (mean, var): (Vec<f64>, Vec<f64>),
    eps: f64,
    weight: FlexTensor,
    bias: &FlexTensor,
) -> (FlexTensor, BnPoolState, [FlexTensor; 2]) {
    let inv = inv_std(&var, eps);
    let (z, argmax, x_at) = bn_pool_forward(shape, x, &to_f32(&mean), &to_f32(&inv), &weight, bias);
    let c = shape.channels;
    let stats = [from_vec(to_f32(&mean), [c]), from_vec(to_f32(&var), [c])];
    let state = BnPoolState {
        mean,
        inv_std: inv,
        weight,
        z: z.clone(),
        argmax: Arc::new(argmax),
        x_at: Arc::new(x_at),
        shape: *shape,
    };
    (z, state, stats)
}

/// A training batch norm's results on autodiff flex as `B`'s tensors: the output (tracked)
/// and the batch's mean and variance (untracked).
fn ad_outputs<B: Backend>(
    y: AdTensor,
    [mean, var]: [FlexTensor; 2],
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    (
        back::<B, 4>(tensor::<Ad, 4>(y)),
        back::<B, 1>(tensor::<Ad, 1>(AdTensor::new(mean))),
        back::<B, 1>(tensor::<Ad, 1>(AdTensor::new(var))),
    )
}

/// [`batch_norm_relu_pool_train`] with given statistics (inference) on flex.
pub(crate) fn batch_norm_relu_pool_eval<B: Backend>(
    x: Tensor<B, 4>,
    mean: Tensor<B, 1>,
    var: Tensor<B, 1>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    shape: BnPoolShape,
    eps: f64,
) -> Tensor<B, 4> {
    let [x, mean, var, w, b] = [
        flex_prim(x),
        flex_prim(mean),
        flex_prim(var),
        flex_prim(weight),
        flex_prim(bias),
    ]
    .map(contiguous);
    let inv = running_inv_std(&var, eps);
    let (z, _, _) = bn_pool_forward(&shape, Images::Values(f32s(&x)), f32s(&mean), &inv, &w, &b);
    back::<B, 4>(tensor::<Flex, 4>(z))
}

/// A convolution, then batch norm (training), ReLU and 2x2 max pool, as one autodiff node whose
/// backward never stores the convolution's output gradient: the batch norm's input gradient is
/// produced a few images at a time inside the convolution's backward, while they are in cache
/// ([`Images::Produce`]). Where the convolution is cheap to compute again ([`ConvImages`], a
/// first layer), its output is not stored either: the statistics, the normalise + pool pass
/// and the input gradient each compute it again, image by image. The same values as the two
/// nodes.
#[derive(Debug)]
struct ConvBnPoolBackward;

#[derive(Clone, Debug)]
struct ConvBnPoolState {
    conv: LayerState<ConvShape>,
    y: ConvOut,
    bn: BnPoolState,
}

/// How [`ConvBnPoolBackward`] reads the convolution's output (the batch norm's input).
#[derive(Clone, Debug)]
enum ConvOut {
    /// Stored by the forward.
    Kept(FlexTensor),
    /// Computed again from the convolution's input, weight and this bias ([`conv_again`]
    /// applies: the forward chose this only where it did).
    Again(FlexTensor),
}

/// The convolution of `conv` (bias `b`, no ReLU) computed again image by image
/// ([`ConvImages`]), where that applies.
fn conv_again<'a>(conv: &'a LayerState<ConvShape>, b: &'a FlexTensor) -> Option<ConvImages<'a>> {
    ConvImages::recompute(&conv.shape, f32s(&conv.x), f32s(&conv.w), Some(f32s(b)))
}

impl Backward<Flex, 5> for ConvBnPoolBackward {
    type State = ConvBnPoolState;

    fn backward(self, ops: Ops<Self::State, 5>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dz = contiguous(grads.consume::<Flex>(&ops.node));
        let ConvBnPoolState { conv, y, bn } = &ops.state;
        let [node_x, node_w, node_b, node_g, node_beta] = ops.parents.map(|p| p.map(|n| n.id));
        let backward = |y: Images<'_>, grads: &mut Gradients| {
            let grad = bn_pool_grads(bn, y, &dz, [node_g, node_beta], grads);
            let produce = |first: usize, dy: &mut [f32]| grad.images(first, dy);
            conv_grads(conv, Images::Produce(&produce), [node_x, node_w, node_b], grads);
        };
        match y {
            ConvOut::Kept(y) => backward(Images::Values(f32s(y)), grads),
            ConvOut::Again(b) => {
                let images = conv_again(conv, b).expect("the forward computed it again");
                let produce = |first: usize, y: &mut [f32]| images.images(first, y);
                backward(Images::Produce(&produce), grads)
            }
        }
    }
}

/// A convolution's and the batch norm after it's tensors on autodiff flex (`x`, weight, bias,
/// scale, shift; a constant zero bias where the convolution has none) and their values,
/// contiguous.
fn conv_bn_parts<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    bn_weight: Tensor<B, 1>,
    bn_bias: Tensor<B, 1>,
    out_channels: usize,
) -> ([AdTensor; 5], [FlexTensor; 5]) {
    let b = bias.map(ad_prim).unwrap_or_else(|| zero_bias(out_channels));
    let parts = [
        ad_prim(x),
        ad_prim(weight),
        b,
        ad_prim(bn_weight),
        ad_prim(bn_bias),
    ];
    let values = parts.each_ref().map(|t| contiguous(t.primitive.clone()));
    (parts, values)
}

/// `max_pool2d(relu(batch_norm_train(conv2d(x))), 2)` on autodiff flex as one node
/// ([`ConvBnPoolBackward`]): the pooled output and the batch's mean and biased variance
/// (untracked). The batch statistics come from the convolution's moments.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv2d_batch_norm_relu_pool_train<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    s: ConvShape,
    relu: bool,
    bn_weight: Tensor<B, 1>,
    bn_bias: Tensor<B, 1>,
    shape: BnPoolShape,
    eps: f64,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let ([x, w, b, g, beta], [xp, wp, bp, gp, betap]) =
        conv_bn_parts(x, weight, bias, bn_weight, bn_bias, s.out_channels);
    let mut conv = LayerState {
        x: xp,
        w: wp,
        relu_out: None,
        shape: s,
    };
    let (z, y, bn, stats) = match conv_again(&conv, &bp).filter(|_| !relu) {
        Some(images) => {
            let produce = |first: usize, y: &mut [f32]| images.images(first, y);
            let y = Images::Produce(&produce);
            let stats = batch_stats_from(&shape.bn(), y);
            let (z, bn, stats) = bn_pool_train(&shape, y, stats, eps, gp, &betap);
            (z, ConvOut::Again(bp), bn, stats)
        }
        None => {
            let mut moments = vec![MapMoments::default(); s.batch * s.out_channels];
            let y = conv_forward(&conv.x, &conv.w, Some(&bp), &s, relu, Some(&mut moments));
            conv.relu_out = relu.then(|| y.clone());
            let stats = combine_moments(&shape.bn(), &moments);
            let (z, bn, stats) = bn_pool_train(&shape, Images::Values(f32s(&y)), stats, eps, gp, &betap);
            (z, ConvOut::Kept(y), bn, stats)
        }
    };
    let z = match ConvBnPoolBackward
        .prepare::<NoCheckpointing>([x.node, w.node, b.node, g.node, beta.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(ConvBnPoolState { conv, y, bn }, z),
        OpsKind::UnTracked(prep) => prep.finish(z),
    };
    ad_outputs(z, stats)
}

/// A convolution, then batch norm (training) with a ReLU, or with a residual added and a ReLU,
/// as one autodiff node whose backward never stores the convolution's output gradient: the
/// batch norm's input gradient is produced a few images at a time inside the convolution's
/// backward, while they are in cache ([`Images::Produce`]), instead of written whole and read
/// back. The same values as the two nodes. Taken only where the convolution's backward reads
/// its output gradient once ([`crate::cpu::conv::reads_output_grad_once`]).
#[derive(Debug)]
struct ConvBnBackward;

/// [`ConvBnBackward`] with a residual: its gradient is `dz` where the output is positive.
#[derive(Debug)]
struct ConvBnAddBackward;

#[derive(Clone, Debug)]
struct ConvBnState {
    conv: LayerState<ConvShape>,
    /// The batch norm's, its input the convolution's output; `relu_out` its output.
    bn: BnState,
}

impl Backward<Flex, 5> for ConvBnBackward {
    type State = ConvBnState;

    fn backward(self, ops: Ops<Self::State, 5>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dz = contiguous(grads.consume::<Flex>(&ops.node));
        conv_bn_grads(&ops.state, &dz, ops.parents.map(|p| p.map(|n| n.id)), grads);
    }
}

impl Backward<Flex, 6> for ConvBnAddBackward {
    type State = ConvBnState;

    fn backward(self, ops: Ops<Self::State, 6>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dz = contiguous(grads.consume::<Flex>(&ops.node));
        let [node_x, node_w, node_b, node_g, node_beta, node_r] = ops.parents.map(|p| p.map(|n| n.id));
        if let Some(node) = node_r {
            let z = ops
                .state
                .bn
                .relu_out
                .as_ref()
                .expect("the fused op keeps its output");
            let dr = cpu::par_relu_mask(f32s(&dz), f32s(z));
            register(grads, Some(node), Some(dr), ops.state.bn.dims);
        }
        let nodes = [node_x, node_w, node_b, node_g, node_beta];
        conv_bn_grads(&ops.state, &dz, nodes, grads);
    }
}

/// The batch norm's scale and shift gradients from `dz`, then the convolution's gradients from
/// the batch norm's input gradient, produced as the convolution's backward reads it.
fn conv_bn_grads(
    state: &ConvBnState,
    dz: &FlexTensor,
    [node_x, node_w, node_b, node_g, node_beta]: [Option<NodeId>; 5],
    grads: &mut Gradients,
) {
    let bn = &state.bn;
    let c = bn.shape.channels;
    let mut dg = node_g.as_ref().map(|_| vec![0.0; c]);
    let mut dbeta = node_beta.as_ref().map(|_| vec![0.0; c]);
    let grad = bn_input_grad(
        &bn.shape,
        f32s(&bn.x),
        &bn.mean,
        &bn.inv_std,
        f32s(&bn.weight),
        f32s(dz),
        bn.relu_out.as_ref().map(f32s),
        dg.as_deref_mut(),
        dbeta.as_deref_mut(),
    );
    register(grads, node_g, dg, [c]);
    register(grads, node_beta, dbeta, [c]);
    let produce = |first: usize, dy: &mut [f32]| grad.images(first, dy);
    conv_grads(
        &state.conv,
        Images::Produce(&produce),
        [node_x, node_w, node_b],
        grads,
    );
}

/// `batch_norm_train(conv2d(x), relu)`, or with a `residual`, `relu(batch_norm_train(conv2d(x))
/// + residual)`, on autodiff flex as one node ([`ConvBnBackward`], [`ConvBnAddBackward`]): the
/// output and the batch's mean and biased variance (untracked). The statistics come from the
/// convolution's moments.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv2d_batch_norm_train<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    s: ConvShape,
    conv_relu: bool,
    bn_weight: Tensor<B, 1>,
    bn_bias: Tensor<B, 1>,
    eps: f64,
    relu: bool,
    residual: Option<Tensor<B, 4>>,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let ([x, w, b, g, beta], [xp, wp, bp, gp, betap]) =
        conv_bn_parts(x, weight, bias, bn_weight, bn_bias, s.out_channels);
    let (node_r, rp) = match residual.map(ad_prim) {
        Some(r) => (Some(r.node), Some(contiguous(r.primitive))),
        None => (None, None),
    };
    let shape = BnShape {
        batch: s.batch,
        channels: s.out_channels,
        plane: s.pixels(),
    };
    let dims = conv_out_shape(&s);
    let mut moments = vec![MapMoments::default(); s.batch * s.out_channels];
    let y = conv_forward(&xp, &wp, Some(&bp), &s, conv_relu, Some(&mut moments));
    let (mean, var) = combine_moments(&shape, &moments);
    let inv = inv_std(&var, eps);
    let (mean32, inv32) = (to_f32(&mean), to_f32(&inv));
    let z = cpu::fresh(shape.len(), |z| match &rp {
        Some(r) => normalise_add_relu(
            &shape,
            f32s(&y),
            &mean32,
            &inv32,
            f32s(&gp),
            f32s(&betap),
            f32s(r),
            z,
        ),
        None => normalise(
            &shape,
            f32s(&y),
            &mean32,
            &inv32,
            f32s(&gp),
            f32s(&betap),
            relu,
            z,
        ),
    });
    let z = from_vec(z, dims);
    let (mean_t, var_t) = (
        from_vec(to_f32(&mean), [s.out_channels]),
        from_vec(to_f32(&var), [s.out_channels]),
    );
    let relu_out = (relu || rp.is_some()).then(|| z.clone());
    let state = ConvBnState {
        conv: LayerState {
            x: xp,
            w: wp,
            relu_out: conv_relu.then(|| y.clone()),
            shape: s,
        },
        bn: BnState {
            x: y,
            mean,
            inv_std: inv,
            weight: gp,
            relu_out,
            shape,
            dims,
        },
    };
    let z = match node_r {
        Some(node_r) => match ConvBnAddBackward
            .prepare::<NoCheckpointing>([x.node, w.node, b.node, g.node, beta.node, node_r])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, z),
            OpsKind::UnTracked(prep) => prep.finish(z),
        },
        None => match ConvBnBackward
            .prepare::<NoCheckpointing>([x.node, w.node, b.node, g.node, beta.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, z),
            OpsKind::UnTracked(prep) => prep.finish(z),
        },
    };
    ad_outputs(z, [mean_t, var_t])
}
