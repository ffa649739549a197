//! PyTorch weights in and out of ember models, by PyTorch's parameter names and layouts
//! (`conv1.weight`, `fc1.weight` as `[out, in]`), read by `torch_save` (no libtorch, no Python) and mapped
//! through burn-store's adapters.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use burn::module::{AutodiffModule, Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::store::{ApplyResult, BurnToPyTorchAdapter, ModuleSnapshot, PyTorchToBurnAdapter, TensorSnapshot};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use crate::files::printable;
use crate::model::{EmberModel, ImageShape, Model, ModelKind};

pub mod torch_save;

use torch_save::TorchSave;

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

fn check(result: ApplyResult, path: &Path, model: &str) -> Result<(), ImportError> {
    let missing: Vec<String> = result.missing.into_iter().map(|(path, _)| path).collect();
    let invalid: Vec<String> = result.errors.iter().map(ToString::to_string).collect();
    if missing.is_empty() && result.unused.is_empty() && invalid.is_empty() {
        return Ok(());
    }
    let mut unexpected = result.unused;
    unexpected.sort();
    Err(ImportError::Mismatch {
        path: path.to_owned(),
        model: model.to_string(),
        missing,
        unexpected,
        invalid,
    })
}

/// Loads a PyTorch `state_dict` saved with `torch.save` (`.pt`/`.pth`) into a new `kind` model
/// for MNIST's images and classes. Every key must match a parameter and every parameter must be
/// present.
pub fn from_pytorch_file<B: Backend>(
    kind: ModelKind,
    path: &Path,
    device: &B::Device,
) -> Result<Model<B>, ImportError> {
    from_pytorch_file_of::<B, _>(&kind, ImageShape::MNIST, crate::data::NUM_CLASSES, path, device)
}

/// Loads a PyTorch `state_dict` into a new `model` for images of `input` and `classes`
/// classes, by PyTorch's parameter names (the module's field paths, as burn-store maps them).
pub fn from_pytorch_file_of<B: Backend, D: EmberModel>(
    model: &D,
    input: ImageShape,
    classes: usize,
    path: &Path,
    device: &B::Device,
) -> Result<D::Net<B>, ImportError> {
    let read_error = |reason| ImportError::Read {
        path: path.to_owned(),
        reason,
    };
    let mut file = TorchSave::open(path).map_err(|reason| read_error(printable(&reason)))?;
    let name = model.name().to_string();
    let model = model.init::<B>(input, classes, device);
    let tensors = checked_tensors(&mut file, &pytorch_shapes(&model), path, &name)?;
    from_pytorch_tensors_of(model, &name, tensors, path)
}

/// The file's tensors, read only after their names, shapes and types match `expected` (the
/// model's, by PyTorch name and layout): what a file's header claims never decides how much is
/// allocated. An integer tensor or a non-finite value is an error naming the tensor.
fn checked_tensors<R: Read + Seek>(
    file: &mut TorchSave<R>,
    expected: &[(String, Vec<usize>)],
    path: &Path,
    model: &str,
) -> Result<Vec<(String, TensorData)>, ImportError> {
    let mismatch = |missing, unexpected, invalid| ImportError::Mismatch {
        path: path.to_owned(),
        model: model.to_string(),
        missing,
        unexpected,
        invalid,
    };
    // A batch norm's counter may be absent (state_dicts from before PyTorch 0.4.1): PyTorch's
    // BatchNorm loads them with the counter at 0, and so does ember.
    let missing: Vec<String> = expected
        .iter()
        .filter(|(name, _)| !file.tensors.contains_key(name) && !is_counter(name))
        .map(|(name, _)| name.clone())
        .collect();
    let unexpected: Vec<String> = file
        .tensors
        .keys()
        .filter(|name| !expected.iter().any(|(n, _)| n == *name))
        .map(|name| printable(name))
        .collect();
    let mut invalid = Vec::new();
    for (name, want) in expected {
        let Some(t) = file.tensors.get(name) else { continue };
        if is_counter(name) {
            // PyTorch's batch counter: an int64 scalar, kept by ember as one f32.
            if t.shape.iter().product::<usize>() != 1 || t.shape.len() > 1 {
                invalid.push(format!(
                    "{name} has shape {:?} in the file, a scalar expected",
                    t.shape
                ));
            } else if t.element_name() != "LongStorage (int64)" {
                invalid.push(format!("{name} holds {}, int64 expected", t.element_name()));
            }
            continue;
        }
        if t.shape != *want {
            invalid.push(format!(
                "{name} has shape {:?} in the file, {want:?} expected",
                t.shape
            ));
        } else if t.element.float_dtype().is_none() {
            invalid.push(format!(
                "{name} holds {}, floating point expected",
                t.element_name()
            ));
        }
    }
    if !(missing.is_empty() && unexpected.is_empty() && invalid.is_empty()) {
        return Err(mismatch(missing, unexpected, invalid));
    }
    let mut tensors = Vec::with_capacity(expected.len());
    for (name, _) in expected {
        let Some(t) = file.tensors.get(name).cloned() else {
            tensors.push((name.clone(), TensorData::new(vec![0f32], [1])));
            continue;
        };
        let read_error = |reason: String| ImportError::Read {
            path: path.to_owned(),
            reason: format!("{name}: {}", printable(&reason)),
        };
        if is_counter(name) {
            let count = file.read_i64(&t).map_err(read_error)?[0];
            if !(0..=1 << 24).contains(&count) {
                invalid.push(format!("{name} is {count}, 0 to 2^24 expected"));
                continue;
            }
            tensors.push((name.clone(), TensorData::new(vec![count as f32], [1])));
            continue;
        }
        let data = file.read(&t).map_err(read_error)?;
        let values = data.as_slice::<f32>().expect("read as f32");
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            invalid.push(format!("{name} holds {} at index {i}", values[i]));
            continue;
        }
        // A variance below zero makes batch norm's 1/sqrt(var + eps) NaN (or huge): PyTorch
        // would evaluate to NaN, which no trained network holds.
        if name.ends_with(".running_var") {
            if let Some(i) = values.iter().position(|&v| v < 0.0) {
                invalid.push(format!(
                    "{name} holds {} at index {i}: a variance cannot be negative",
                    values[i]
                ));
                continue;
            }
        }
        tensors.push((name.clone(), data));
    }
    if !invalid.is_empty() {
        return Err(mismatch(Vec::new(), Vec::new(), invalid));
    }
    Ok(tensors)
}

/// Whether `name` is a batch norm's `num_batches_tracked`.
fn is_counter(name: &str) -> bool {
    name.ends_with(".num_batches_tracked")
}

/// Loads named tensors in PyTorch's layout into a built-in `model`, converted to the backend's
/// float type; `source` names them in errors.
pub fn from_pytorch_tensors<B: Backend>(
    model: Model<B>,
    tensors: Vec<(String, TensorData)>,
    source: &Path,
) -> Result<Model<B>, ImportError> {
    let name = model.kind().name();
    from_pytorch_tensors_of(model, name, tensors, source)
}

/// Loads named tensors in PyTorch's layout into `model` (called `name` in errors), converted
/// to the backend's float type; `source` names them in errors.
pub fn from_pytorch_tensors_of<B: Backend, M: Module<B>>(
    mut model: M,
    name: &str,
    tensors: Vec<(String, TensorData)>,
    source: &Path,
) -> Result<M, ImportError> {
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
    check(result, source, name)?;
    Ok(model)
}

/// The model's parameter shapes by PyTorch name, in PyTorch's layout, without reading values.
fn pytorch_shapes<B: Backend, M: Module<B>>(model: &M) -> Vec<(String, Vec<usize>)> {
    model
        .collect(None, Some(Box::new(BurnToPyTorchAdapter)), true)
        .into_iter()
        .map(|s| (s.full_path(), s.shape.to_vec()))
        .collect()
}

/// The model's parameters by PyTorch name, in PyTorch's layout.
pub fn to_pytorch_tensors<B: Backend, M: Module<B>>(model: &M) -> Vec<(String, TensorData)> {
    model
        .collect(None, Some(Box::new(BurnToPyTorchAdapter)), true)
        .into_iter()
        .map(|s| {
            let data = s.to_data().expect("in-memory tensors read back");
            (s.full_path(), data)
        })
        .collect()
}

/// `model`'s tensors by PyTorch name and layout (batch norm's running statistics and
/// `num_batches_tracked`, as int64, included) as a safetensors file's bytes, keys sorted, with
/// `metadata` in its header: what `safetensors.torch.load_file` reads and
/// `load_state_dict(strict=True)` of the PyTorch twin takes.
pub fn to_safetensors<B: Backend, M: Module<B>>(
    model: &M,
    metadata: std::collections::HashMap<String, String>,
) -> Vec<u8> {
    use safetensors::tensor::{Dtype, TensorView};
    let tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = to_pytorch_tensors(model)
        .into_iter()
        .map(|(name, data)| {
            let shape = data.shape.to_vec();
            let values: Vec<f32> = data.convert::<f32>().to_vec().expect("f32 tensors");
            if is_counter(&name) {
                // PyTorch's counter is an int64 scalar; ember keeps it as one f32.
                let count = values.first().copied().unwrap_or(0.0) as i64;
                (name, Dtype::I64, Vec::new(), count.to_le_bytes().to_vec())
            } else {
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                (name, Dtype::F32, shape, bytes)
            }
        })
        .collect();
    let views = tensors.iter().map(|(name, dtype, shape, bytes)| {
        let view = TensorView::new(*dtype, shape.clone(), bytes).expect("shape and bytes agree");
        (name.clone(), view)
    });
    safetensors::tensor::serialize(views, Some(metadata)).expect("in-memory tensors serialise")
}

/// The gradients in `grads` of `model`'s parameters, by PyTorch name and layout.
pub fn gradients_as_pytorch<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
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

    /// `ember export`'s file: every tensor of the state_dict under its PyTorch name, in
    /// PyTorch's layout and dtypes (the batch counter int64, as `load_state_dict` expects), with
    /// the values of the model.
    #[test]
    fn safetensors_export_holds_the_whole_state_dict() {
        let device = Default::default();
        let model = ModelKind::Resnet20.init::<NdArray>(&device);
        let meta = [("model".to_string(), "resnet20".to_string())]
            .into_iter()
            .collect();
        let bytes = to_safetensors(&model, meta);
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let expected = to_pytorch_tensors(&model);
        assert_eq!(file.len(), expected.len());
        assert_eq!(expected.len(), 128); // len(models.resnet20().state_dict())
        for (name, data) in expected {
            let t = file.tensor(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
            if name.ends_with("num_batches_tracked") {
                assert_eq!(
                    (t.dtype(), t.shape()),
                    (safetensors::Dtype::I64, &[][..]),
                    "{name}"
                );
                assert_eq!(t.data(), 0i64.to_le_bytes(), "{name}");
                continue;
            }
            assert_eq!(
                (t.dtype(), t.shape()),
                (safetensors::Dtype::F32, &data.shape[..]),
                "{name}"
            );
            let values: Vec<f32> = t
                .data()
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            assert_eq!(values, data.to_vec::<f32>().unwrap(), "{name}");
        }
        assert!(file.names().iter().any(|n| *n == "stages.0.0.bn1.running_var"));
    }

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

    #[test]
    fn names_from_a_file_print_on_one_line() {
        assert_eq!(printable("fc2.wei\nht\u{7}"), "fc2.wei\\nht\\u{7}");
        assert_eq!(printable("conv1.weight"), "conv1.weight");
    }
}
