#![allow(dead_code)]
//! Shared by the parity tests: numerical parity with PyTorch, replayed from the fixtures that `benches/pytorch/parity.py`
//! wrote (tests/fixtures/parity-*.safetensors): same initial weights, same batch of 32 MNIST
//! test images; ember must produce the same outputs, loss, gradients and parameters after three
//! steps of the recipe optimizer, and the same StepLR schedule.
//!
//! Errors are relative to the tensor's scale: max |ours - torch| / max |torch| over the tensor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::optim::{GradientsParams, Optimizer as _};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use ember::import::{from_pytorch_tensors_of, gradients_as_pytorch, to_pytorch_tensors};
use ember::model::{EmberModel, ImageShape, ModelKind, Trainable};
use ember::train::loss;
use ember_models::Classifier;
use safetensors::SafeTensors;

/// Largest relative errors allowed.
#[derive(Clone, Copy)]
pub struct Tolerance {
    pub outputs: f64,
    pub grads: f64,
    pub params: f64,
    /// Where a fixture is a float64 reference that records PyTorch's own float32 error per
    /// tensor (the batch norm models: benches/pytorch/parity.py, `f32_error`), a tensor may be
    /// off by this many times that error when it exceeds the bound: a float32 backend cannot be
    /// held closer to the exact result than float32 PyTorch is. 0 for float64 backends.
    pub f32_slack: f64,
}

/// The bounds for ember's float32 CPU backend.
pub const CPU: Tolerance = Tolerance {
    outputs: 1e-5,
    grads: 1e-4,
    params: 1e-5,
    f32_slack: 4.0,
};

/// The same bounds, with no allowance for float32 rounding: for the float64 reference backend.
pub const EXACT: Tolerance = Tolerance {
    f32_slack: 0.0,
    ..CPU
};

/// `tests/fixtures`, or `EMBER_FIXTURES` where the test binary runs away from its source tree
/// (the GPU bundle, `benches/gpu-bundle.sh`).
pub fn fixtures() -> PathBuf {
    match std::env::var_os("EMBER_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"),
    }
}

pub struct Fixture {
    tensors: HashMap<String, (Vec<usize>, Vec<f64>)>,
    meta: HashMap<String, String>,
}

impl Fixture {
    pub fn load(model: &str) -> Fixture {
        let path = fixtures().join(format!("parity-{model}.safetensors"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
        let meta = header.metadata().clone().unwrap_or_default();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let tensors = st
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                let values = match view.dtype() {
                    safetensors::Dtype::F32 => view
                        .data()
                        .chunks(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                        .collect(),
                    safetensors::Dtype::F64 => view
                        .data()
                        .chunks(8)
                        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                        .collect(),
                    safetensors::Dtype::I64 => view
                        .data()
                        .chunks(8)
                        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                        .collect(),
                    other => panic!("{name}: unexpected dtype {other:?}"),
                };
                (name, (view.shape().to_vec(), values))
            })
            .collect();
        Fixture { tensors, meta }
    }

    pub fn get(&self, name: &str) -> &(Vec<usize>, Vec<f64>) {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("fixture has no tensor {name}"))
    }

    /// Whether the fixture holds `key`, whole or sampled.
    pub fn has(&self, key: &str) -> bool {
        self.tensors.contains_key(key) || self.tensors.contains_key(&format!("{key}.index"))
    }

    fn param_names(&self) -> Vec<String> {
        serde_json::from_str(&self.meta["params"]).unwrap()
    }

    /// PyTorch's float32 error on `key` against this float64 fixture, as the metadata `record`
    /// holds it (`f32_error`: oneDNN on 1 to 4 threads; `f32_native_error`: its own
    /// convolution; 0 when not recorded). A
    /// sampled tensor's error is measured as [`compare`] measures ours: the larger of the samples'
    /// and half the sum of squares' (parity.py records them as `KEY.value` and `KEY.sumsq`).
    fn torch_f32_error(&self, key: &str, record: &str) -> f64 {
        let Some(errors) = self
            .meta
            .get(record)
            .map(|e| serde_json::from_str::<HashMap<String, f64>>(e).unwrap())
        else {
            return 0.0;
        };
        let of = |k: &str| errors.get(k).copied();
        of(key)
            .or_else(|| {
                let value = of(&format!("{key}.value"))?;
                Some(value.max(of(&format!("{key}.sumsq"))? / 2.0))
            })
            .unwrap_or(0.0)
    }
}

/// The fixture's initial weights: element `i` of parameter `k` from SplitMix64 of
/// `(seed << 40) ^ (k << 32) ^ i`, as `hash_uniform` in benches/pytorch/parity.py.
fn hash_uniform(seed: u64, k: u64, n: usize, bound: f64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut z = ((seed << 40) ^ (k << 32) ^ i).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = (z >> 40) as f64 / (1u64 << 24) as f64;
            ((2.0 * u - 1.0) * bound) as f32
        })
        .collect()
}

/// `kind`'s model (dropout off) with the fixture's initial weights.
fn initial_model<B: burn::tensor::backend::Backend, D: EmberModel>(
    kind: &D,
    fixture: &Fixture,
    device: &B::Device,
) -> D::Net<B> {
    let model = kind.init_without_dropout::<B>(ImageShape::MNIST, 10, device);
    let shapes: HashMap<String, Vec<usize>> = to_pytorch_tensors(&model)
        .into_iter()
        .map(|(n, d)| (n, d.shape.to_vec()))
        .collect();
    let seed: u64 = fixture.meta["seed"].parse().unwrap();
    let mut tensors: HashMap<String, TensorData> = fixture
        .param_names()
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let shape = &shapes[name];
            let weight = &shapes[&format!("{}.weight", name.rsplit_once('.').unwrap().0)];
            let fan_in: usize = weight[1..].iter().product();
            let n = shape.iter().product();
            let values = hash_uniform(seed, k as u64, n, 1.0 / (fan_in as f64).sqrt());
            (name.clone(), TensorData::new(values, shape.clone()))
        })
        .collect();
    // Batch norm's buffers keep their initial values, as in PyTorch.
    let all = to_pytorch_tensors(&model)
        .into_iter()
        .map(|(name, initial)| {
            let data = tensors.remove(&name).unwrap_or(initial);
            (name, data)
        })
        .collect();
    from_pytorch_tensors_of(model, kind.name(), all, Path::new("fixture")).unwrap()
}

/// Max |a - b| / max |b|.
fn relative_error(ours: &[f64], torch: &[f64]) -> f64 {
    let scale = torch.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    ours.iter()
        .zip(torch)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

fn values(data: &TensorData) -> Vec<f64> {
    data.clone().convert::<f64>().to_vec().unwrap()
}

/// Compares our `ours` (full tensor) with the fixture's `key` at bound `tol`, or `slack` times
/// PyTorch's own float32 error on it where that is larger (see [`Tolerance::f32_slack`]).
///
/// A float32 result may take a ReLU whose exact input is within float32's rounding of zero the
/// other way, and its gradients then differ at that element, far above any rounding bound; the
/// batch norm fixtures have such inputs in every layer, and PyTorch's float32 with its own
/// convolution (oneDNN off) takes some of ResNet-18's the other way (benches/pytorch/parity.py).
/// Where ours does not match the exact result, the first pass (logits, loss, gradients) must
/// match that PyTorch result (`torch32_native.KEY`) to the same bound; after three steps, where
/// each run's parameters follow its own ReLUs, ours must be within `slack` times the larger of
/// the two PyTorch runs' errors.
pub fn compare_with_slack(
    fixture: &Fixture,
    key: &str,
    ours: &TensorData,
    tol: f64,
    slack: f64,
) -> Result<f64, String> {
    let bound = tol.max(slack * fixture.torch_f32_error(key, "f32_error"));
    let native = format!("torch32_native.{key}");
    match compare(fixture, key, ours, bound) {
        Err(exact) if slack > 0.0 && fixture.has(&native) => compare(fixture, &native, ours, bound)
            .map_err(|e| format!("{exact}, and against PyTorch's float32 with its own convolution {e}")),
        Err(exact) if slack > 0.0 && key.starts_with("step3.") && fixture.has("torch32_native.loss") => {
            let native_bound = tol.max(slack * fixture.torch_f32_error(key, "f32_native_error"));
            compare(fixture, key, ours, bound.max(native_bound))
                .map_err(|e| format!("{exact}; {e} with PyTorch's float32 error with its own convolution"))
        }
        result => result,
    }
}

/// Compares our `ours` (full tensor) with the fixture's `key`, which may be sampled.
pub fn compare(fixture: &Fixture, key: &str, ours: &TensorData, tol: f64) -> Result<f64, String> {
    let ours_v = values(ours);
    let (err, what) = if fixture.tensors.contains_key(key) {
        let (shape, torch) = fixture.get(key);
        if shape.as_slice() != ours.shape.as_slice() && !(shape.is_empty() && ours_v.len() == 1) {
            return Err(format!("{key}: shape {:?}, torch has {shape:?}", ours.shape));
        }
        (relative_error(&ours_v, torch), String::new())
    } else {
        let index = &fixture.get(&format!("{key}.index")).1;
        let torch = &fixture.get(&format!("{key}.value")).1;
        let sampled: Vec<f64> = index.iter().map(|&i| ours_v[i as usize]).collect();
        let sumsq_torch = fixture.get(&format!("{key}.sumsq")).1[0];
        let sumsq: f64 = ours_v.iter().map(|v| v * v).sum();
        let err = relative_error(&sampled, torch).max((sumsq - sumsq_torch).abs() / sumsq_torch / 2.0);
        (
            err,
            format!(" ({} sampled elements and the sum of squares)", index.len()),
        )
    };
    if std::env::var_os("EMBER_PARITY_VERBOSE").is_some() {
        eprintln!("{key:<22} relative error {err:.3e} (bound {tol:e}){what}");
    }
    if err > tol {
        return Err(format!("{key}: relative error {err:.3e} > {tol:e}{what}"));
    }
    Ok(err)
}

/// Replays `fixture_name` against a `kind` model on backend `B`; Err names the first tensor
/// that diverges and by how much.
pub fn check<B: AutodiffBackend>(
    fixture_name: &str,
    kind: ModelKind,
    tol: Tolerance,
    device: &B::Device,
) -> Result<(), String> {
    check_of::<B, ModelKind>(fixture_name, &kind, tol, device)
}

/// [`check`] for any model.
pub fn check_of<B: AutodiffBackend, D: EmberModel>(
    fixture_name: &str,
    kind: &D,
    tol: Tolerance,
    device: &B::Device,
) -> Result<(), String>
where
    D::Net<B>: Trainable<B>,
{
    let fixture = Fixture::load(fixture_name);
    let (shape, images) = fixture.get("images");
    let x = Tensor::<B, 4>::from_data(
        TensorData::new(
            images.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            shape.clone(),
        ),
        device,
    );
    let (_, labels) = fixture.get("labels");
    let y = Tensor::<B, 1, Int>::from_data(
        TensorData::new(
            labels.iter().map(|&v| v as i64).collect::<Vec<_>>(),
            [labels.len()],
        )
        .convert::<B::IntElem>(),
        device,
    );
    let mut model = initial_model::<B, D>(kind, &fixture, device);
    let out = model.forward(x.clone());
    let batch_loss = loss(out.clone(), model.output(), y.clone(), 0.0);
    let slack = tol.f32_slack;
    compare_with_slack(&fixture, "logits", &out.to_data(), tol.outputs, slack)?;
    compare_with_slack(&fixture, "loss", &batch_loss.to_data(), tol.outputs, slack)?;
    let grads = GradientsParams::from_grads(batch_loss.backward(), &model);
    let by_name: HashMap<String, TensorData> = gradients_as_pytorch(&model, &grads).into_iter().collect();
    for name in fixture.param_names() {
        compare_with_slack(
            &fixture,
            &format!("grad.{name}"),
            &by_name[&name],
            tol.grads,
            slack,
        )?;
    }

    let config = ember::config::Recipe::of_model(kind.name()).config();
    let o = &config.optimizer;
    let described = if o.nesterov {
        // models.py's "sgd-nesterov": momentum 0.9, weight decay 5e-4 on weights only.
        assert_eq!((o.momentum, o.weight_decay, o.no_decay_1d), (0.9, 5e-4, true));
        "sgd-nesterov".to_string()
    } else {
        format!("{:?}", o.kind).to_lowercase()
    };
    assert_eq!(fixture.meta["optimizer"], described);
    assert_eq!(fixture.meta["lr"].parse::<f64>().unwrap(), config.lr);
    let mut optim = config.optimizer.init::<B, D::Net<B>>();
    for _ in 0..3 {
        let out = model.forward(x.clone());
        let grads = GradientsParams::from_grads(loss(out, model.output(), y.clone(), 0.0).backward(), &model);
        model = optim.step(config.lr, model, grads);
    }
    // Parameters and batch norm's running statistics.
    for (name, data) in to_pytorch_tensors(&model) {
        compare_with_slack(&fixture, &format!("step3.{name}"), &data, tol.params, slack)?;
    }

    let schedule = ember::config::Recipe::PytorchExample.config().schedule(1);
    let ours: Vec<f64> = (0..5).map(|e| schedule.at(e, e).lr).collect();
    if ours != fixture.get("lr_schedule").1 {
        return Err(format!(
            "lr_schedule: {ours:?}, torch has {:?}",
            fixture.get("lr_schedule").1
        ));
    }
    Ok(())
}

pub fn assert_parity<B: AutodiffBackend>(kind: ModelKind, tol: Tolerance, device: &B::Device) {
    assert_parity_of::<B, ModelKind>(&kind, tol, device)
}

/// [`assert_parity`] for any model.
pub fn assert_parity_of<B: AutodiffBackend, D: EmberModel>(kind: &D, tol: Tolerance, device: &B::Device)
where
    D::Net<B>: Trainable<B>,
{
    if let Err(e) = check_of::<B, D>(kind.name(), kind, tol, device) {
        panic!(
            "{} diverges from PyTorch on {}: {e}",
            kind.name(),
            std::any::type_name::<B>()
        );
    }
}
