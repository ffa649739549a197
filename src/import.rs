//! PyTorch weights in and out of ember models, by PyTorch's parameter names and layouts
//! (`conv1.weight`, `fc1.weight` as `[out, in]`), through burn-store: no libtorch.

use std::path::{Path, PathBuf};

use burn::module::{AutodiffModule, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::store::{
    ApplyResult, BurnToPyTorchAdapter, ModuleSnapshot, PyTorchToBurnAdapter, PytorchStore, TensorSnapshot,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use crate::model::{Model, ModelKind};

/// Errors importing weights; each names the file and the keys at fault.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{}: cannot read as a PyTorch checkpoint ({reason})", path.display())]
    Read { path: PathBuf, reason: String },
    #[error("{}: not a {model} state_dict:{}", path.display(), describe(.missing, .unexpected, .invalid))]
    Mismatch {
        path: PathBuf,
        model: String,
        missing: Vec<String>,
        unexpected: Vec<String>,
        invalid: Vec<String>,
    },
}

fn describe(missing: &[String], unexpected: &[String], invalid: &[String]) -> String {
    let mut s = String::new();
    for (what, keys) in [
        ("missing keys", missing),
        ("unexpected keys", unexpected),
        ("invalid tensors", invalid),
    ] {
        if !keys.is_empty() {
            s += &format!(" {what}: {};", keys.join(", "));
        }
    }
    s.pop();
    s
}

fn check(result: ApplyResult, path: &Path, kind: ModelKind) -> Result<(), ImportError> {
    let missing: Vec<String> = result.missing.into_iter().map(|(path, _)| path).collect();
    let invalid: Vec<String> = result.errors.iter().map(ToString::to_string).collect();
    if missing.is_empty() && result.unused.is_empty() && invalid.is_empty() {
        return Ok(());
    }
    let mut unexpected = result.unused;
    unexpected.sort();
    Err(ImportError::Mismatch {
        path: path.to_owned(),
        model: kind.name().to_string(),
        missing,
        unexpected,
        invalid,
    })
}

/// Loads a PyTorch `state_dict` saved with `torch.save` (`.pt`/`.pth`) into a new `kind` model.
/// Every key must match a parameter and every parameter must be present.
pub fn from_pytorch_file<B: Backend>(
    kind: ModelKind,
    path: &Path,
    device: &B::Device,
) -> Result<Model<B>, ImportError> {
    let mut model = kind.init::<B>(device);
    let mut store = PytorchStore::from_file(path).allow_partial(true).validate(false);
    let result = model.load_from(&mut store).map_err(|e| ImportError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    check(result, path, kind)?;
    Ok(model)
}

/// Loads named tensors in PyTorch's layout into `model`, converted to the backend's float type;
/// `source` names them in errors.
pub fn from_pytorch_tensors<B: Backend>(
    mut model: Model<B>,
    tensors: Vec<(String, TensorData)>,
    source: &Path,
) -> Result<Model<B>, ImportError> {
    let kind = model.kind();
    let snapshots = tensors
        .into_iter()
        .map(|(name, data)| {
            let path: Vec<String> = name.split('.').map(String::from).collect();
            TensorSnapshot::from_data(
                data.convert::<B::FloatElem>(),
                path,
                Vec::new(),
                Default::default(),
            )
        })
        .collect();
    let result = model.apply(snapshots, None, Some(Box::new(PyTorchToBurnAdapter)), true);
    check(result, source, kind)?;
    Ok(model)
}

/// The model's parameters by PyTorch name, in PyTorch's layout.
pub fn to_pytorch_tensors<B: Backend>(model: &Model<B>) -> Vec<(String, TensorData)> {
    model
        .collect(None, Some(Box::new(BurnToPyTorchAdapter)), true)
        .into_iter()
        .map(|s| {
            let data = s.to_data().expect("in-memory tensors read back");
            (s.full_path(), data)
        })
        .collect()
}

/// The gradients in `grads` of `model`'s parameters, by PyTorch name and layout.
pub fn gradients_as_pytorch<B: AutodiffBackend>(
    model: &Model<B>,
    grads: &GradientsParams,
) -> Vec<(String, TensorData)> {
    let mut as_values = GradsAsValues { grads };
    let grads_model = burn::module::Module::map(model.valid(), &mut as_values);
    to_pytorch_tensors(&grads_model)
}

/// Replaces each parameter by its gradient (zeros where it has none).
struct GradsAsValues<'a> {
    grads: &'a GradientsParams,
}

impl<B: Backend> ModuleMapper<B> for GradsAsValues<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, value, _) = param.consume();
        let grad = self.grads.get::<B, D>(id).unwrap_or_else(|| value.zeros_like());
        Param::initialized(id, grad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    #[test]
    fn round_trips_through_pytorch_layout() {
        let device = Default::default();
        let model = ModelKind::TchNet.init::<NdArray>(&device);
        let tensors = to_pytorch_tensors(&model);
        let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "conv1.weight",
                "conv1.bias",
                "conv2.weight",
                "conv2.bias",
                "fc1.weight",
                "fc1.bias",
                "fc2.weight",
                "fc2.bias"
            ]
        );
        // PyTorch's Linear stores [out, in]; burn's [in, out].
        let fc1 = &tensors[4].1;
        assert_eq!(fc1.shape.as_slice(), [128, 9216]);
        let reloaded = from_pytorch_tensors(
            ModelKind::TchNet.init::<NdArray>(&device),
            tensors.clone(),
            Path::new("mem"),
        )
        .unwrap();
        let again = to_pytorch_tensors(&reloaded);
        for ((n, a), (_, b)) in tensors.iter().zip(&again) {
            a.assert_eq(b, true);
            assert!(!n.is_empty());
        }
    }

    #[test]
    fn missing_and_unexpected_keys_are_listed() {
        let device = Default::default();
        let mut tensors = to_pytorch_tensors(&ModelKind::TchNet.init::<NdArray>(&device));
        tensors.retain(|(n, _)| n != "fc2.bias");
        tensors.push(("fc3.weight".into(), TensorData::new(vec![0f32; 4], [2, 2])));
        let err = from_pytorch_tensors(
            ModelKind::TchNet.init::<NdArray>(&device),
            tensors,
            Path::new("x.pt"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("x.pt: not a tch-net state_dict"), "{err}");
        assert!(err.contains("missing keys: fc2.bias"), "{err}");
        assert!(err.contains("unexpected keys: fc3.weight"), "{err}");
    }
}
