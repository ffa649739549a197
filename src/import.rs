//! PyTorch weights in and out of ember models, by PyTorch's parameter names and layouts
//! (`conv1.weight`, `fc1.weight` as `[out, in]`), through burn-store: no libtorch.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::module::{AutodiffModule, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::store::{ApplyResult, BurnToPyTorchAdapter, ModuleSnapshot, PyTorchToBurnAdapter, TensorSnapshot};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData};
use burn_store::pytorch::PytorchReader;

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
    let file = PytorchReader::new(path).map_err(|e| ImportError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let model = kind.init::<B>(device);
    let tensors = checked_tensors(file.into_tensors(), &to_pytorch_tensors(&model), path, kind)?;
    from_pytorch_tensors(model, tensors, path)
}

/// The file's tensors, read only after their names, shapes and types match `expected` (the
/// model's, by PyTorch name and layout): what a file's header claims never decides how much is
/// allocated. A storage shorter than its tensor, an integer tensor or a non-finite value is an
/// error naming the tensor.
fn checked_tensors(
    file: HashMap<String, TensorSnapshot>,
    expected: &[(String, TensorData)],
    path: &Path,
    kind: ModelKind,
) -> Result<Vec<(String, TensorData)>, ImportError> {
    let mismatch = |missing, unexpected, invalid| ImportError::Mismatch {
        path: path.to_owned(),
        model: kind.name().to_string(),
        missing,
        unexpected,
        invalid,
    };
    let missing: Vec<String> = expected
        .iter()
        .filter(|(name, _)| !file.contains_key(name))
        .map(|(name, _)| name.clone())
        .collect();
    let mut unexpected: Vec<String> = file
        .keys()
        .filter(|name| !expected.iter().any(|(n, _)| n == *name))
        .cloned()
        .collect();
    unexpected.sort();
    let mut invalid = Vec::new();
    for (name, want) in expected {
        let Some(snapshot) = file.get(name) else { continue };
        if snapshot.shape.as_slice() != want.shape.as_slice() {
            invalid.push(format!(
                "{name} has shape {:?} in the file, {:?} expected",
                snapshot.shape.as_slice(),
                want.shape.as_slice()
            ));
        } else if !matches!(snapshot.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
            invalid.push(format!(
                "{name} holds {:?}, floating point expected",
                snapshot.dtype
            ));
        }
    }
    if !(missing.is_empty() && unexpected.is_empty() && invalid.is_empty()) {
        return Err(mismatch(missing, unexpected, invalid));
    }
    let mut tensors = Vec::with_capacity(expected.len());
    for (name, _) in expected {
        let snapshot = &file[name];
        let data = snapshot.to_data().map_err(|e| ImportError::Read {
            path: path.to_owned(),
            reason: format!("{name}: {e}"),
        })?;
        if data.bytes.len() != snapshot.data_len() {
            invalid.push(format!(
                "{name} has {} bytes of data, {} expected (a truncated file?)",
                data.bytes.len(),
                snapshot.data_len()
            ));
            continue;
        }
        let data = data.convert::<f32>();
        let values = data.as_slice::<f32>().expect("converted to f32");
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            invalid.push(format!("{name} holds {} at index {i}", values[i]));
            continue;
        }
        tensors.push((name.clone(), data));
    }
    if !invalid.is_empty() {
        return Err(mismatch(Vec::new(), Vec::new(), invalid));
    }
    Ok(tensors)
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

    /// A file's tensors as PytorchReader gives them: shape and type from the header, data read
    /// by a closure. Each closure here counts its calls.
    fn lazy(
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
        data: impl Fn() -> TensorData + 'static,
        reads: &std::rc::Rc<std::cell::Cell<usize>>,
    ) -> (String, TensorSnapshot) {
        let reads = reads.clone();
        let snapshot = TensorSnapshot::from_closure(
            std::rc::Rc::new(move || {
                reads.set(reads.get() + 1);
                Ok(data())
            }),
            dtype,
            shape.into(),
            name.split('.').map(String::from).collect(),
            Vec::new(),
            Default::default(),
        );
        (name.to_string(), snapshot)
    }

    /// The tch-net state_dict with `name` replaced by `replacement`, as a lazy file.
    fn file_with(
        replacement: (String, TensorSnapshot),
        reads: &std::rc::Rc<std::cell::Cell<usize>>,
    ) -> (HashMap<String, TensorSnapshot>, Vec<(String, TensorData)>) {
        let expected = to_pytorch_tensors(&ModelKind::TchNet.init::<NdArray>(&Default::default()));
        let mut file: HashMap<String, TensorSnapshot> = expected
            .iter()
            .map(|(n, d)| {
                let d = d.clone();
                lazy(n, DType::F32, d.shape.to_vec(), move || d.clone(), reads)
            })
            .collect();
        file.insert(replacement.0.clone(), replacement.1);
        (file, expected)
    }

    fn import_error(file: HashMap<String, TensorSnapshot>, expected: &[(String, TensorData)]) -> String {
        checked_tensors(file, expected, Path::new("bad.pt"), ModelKind::TchNet)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn lying_shapes_and_integer_tensors_are_refused_before_any_read() {
        let reads = std::rc::Rc::new(std::cell::Cell::new(0));
        let never = || -> TensorData { panic!("read a tensor whose header does not fit the model") };
        for (dtype, shape, says) in [
            (
                DType::F32,
                vec![1_000_000, 1_000_000],
                "fc1.weight has shape [1000000, 1000000] in the file, [128, 9216] expected",
            ),
            (DType::F32, vec![20_000, 20_000], "[20000, 20000] in the file"),
            (
                DType::I64,
                vec![128, 9216],
                "fc1.weight holds I64, floating point expected",
            ),
        ] {
            let (file, expected) = file_with(lazy("fc1.weight", dtype, shape, never, &reads), &reads);
            let err = import_error(file, &expected);
            assert!(
                err.starts_with("bad.pt: not a tch-net state_dict: invalid tensors:"),
                "{err}"
            );
            assert!(err.contains(says), "{err}");
            assert_eq!(reads.get(), 0, "{err}");
        }
    }

    #[test]
    fn short_storages_and_non_finite_values_are_refused() {
        let reads = std::rc::Rc::new(std::cell::Cell::new(0));
        let nan = || {
            TensorData::new(
                vec![0.0f32, 1.0, f32::NAN, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                [10],
            )
        };
        let (file, expected) = file_with(lazy("fc2.bias", DType::F32, vec![10], nan, &reads), &reads);
        let err = import_error(file, &expected);
        assert!(err.contains("fc2.bias holds NaN at index 2"), "{err}");

        let truncated = || TensorData::from_bytes_vec(vec![0u8; 12], [10], DType::F32);
        let (file, expected) = file_with(lazy("fc2.bias", DType::F32, vec![10], truncated, &reads), &reads);
        let err = import_error(file, &expected);
        assert!(
            err.contains("fc2.bias has 12 bytes of data, 40 expected (a truncated file?)"),
            "{err}"
        );
    }
}
