//! Numerical parity with PyTorch on the f32 backends ember trains with (flex; CUDA when built
//! with it and a device is present), and import of a PyTorch state_dict. Method and fixtures:
//! tests/common/parity.rs.

#[path = "common/parity.rs"]
mod parity;

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use ember::import::from_pytorch_file;
use ember::model::ModelKind;
use ember_models::Classifier;
use parity::{compare, fixtures, Fixture, Tolerance, CPU};

/// Replays the fixture of every built-in model ([`each_builtin`], the one list of them) on the
/// backend `arg` selects, at `tol`; returns the models' names. A model without a fixture fails
/// (`benches/pytorch/parity.py` writes it from its twin in `models.py`): a model added to the
/// registry is compared with PyTorch without a line here.
fn replay_every_builtin(arg: ember::backend::DeviceArg, tol: Tolerance) -> Vec<String> {
    use burn::tensor::backend::AutodiffBackend;
    use ember::backend::{DeviceInfo, ModelTask, Trains};
    use ember::model::{EmberModel, Trainable};
    use ember::registry::{each_builtin, EachBuiltin};

    struct Replay(Tolerance);
    impl<D: EmberModel> ModelTask<D> for Replay {
        type Output = ();
        fn run<B: AutodiffBackend>(self, model: &D, device: B::Device, _info: DeviceInfo)
        where
            D::Net<B>: Trainable<B>,
        {
            parity::assert_parity_of::<B, D>(model, self.0, &device);
        }
    }
    struct Each(ember::backend::DeviceArg, Tolerance, Vec<String>);
    impl EachBuiltin for Each {
        fn visit<D: Trains>(&mut self, model: D) {
            let name = model.name().to_string();
            assert!(
                fixtures().join(format!("parity-{name}.safetensors")).is_file(),
                "{name} has no parity fixture: add its twin to benches/pytorch/models.py and run parity.py --only {name}"
            );
            model.dispatch(self.0, Replay(self.1)).unwrap();
            self.2.push(name);
        }
    }
    let mut each = Each(arg, tol, Vec::new());
    each_builtin(&mut each);
    each.2
}

/// Every built-in model against its PyTorch fixture on the float32 CPU backend ember trains with.
#[test]
fn parity_every_builtin_model_flex() {
    let replayed = replay_every_builtin(ember::backend::DeviceArg::Cpu, CPU);
    // The six models of ModelKind (the seed CNNs, ResNet-20 and -18, the speedrun net) and LeNet-5.
    assert!(replayed.len() >= 7, "{replayed:?}");
    assert!(replayed.iter().any(|m| m == "resnet18"), "{replayed:?}");
}

#[cfg(feature = "cuda")]
#[test]
fn parity_every_builtin_model_cuda() {
    use ember::backend::{resolve, DeviceArg, Resolved};
    match resolve(DeviceArg::Cuda(0)) {
        Ok(Resolved::Cuda { .. }) => {}
        other => {
            println!("skipping CUDA parity: no CUDA device ({other:?})");
            return;
        }
    }
    // TF32 and different reduction orders on the GPU.
    let gpu = Tolerance {
        outputs: 1e-3,
        grads: 1e-3,
        params: 1e-3,
        f32_slack: 4.0,
    };
    let replayed = replay_every_builtin(DeviceArg::Cuda(0), gpu);
    assert!(replayed.len() >= 7, "{replayed:?}");
}

#[test]
fn parity_import_of_a_pytorch_state_dict() {
    // pytorch-example-net.pt is the parity fixture's initial state_dict, saved by torch.save.
    let fixture = Fixture::load("pytorch-example-net");
    let device = Default::default();
    let imported = from_pytorch_file::<NdArray>(
        ModelKind::PytorchExampleNet,
        &fixtures().join("pytorch-example-net.pt"),
        &device,
    )
    .unwrap();
    let (shape, images) = fixture.get("images");
    let x = Tensor::<NdArray, 4>::from_data(
        TensorData::new(
            images.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            shape.clone(),
        ),
        &device,
    );
    compare(&fixture, "logits", &imported.forward(x).to_data(), CPU.outputs).unwrap();

    // The same file is not a flashlight-cnn: every mismatching key is listed.
    let err = from_pytorch_file::<NdArray>(
        ModelKind::FlashlightCnn,
        &fixtures().join("pytorch-example-net.pt"),
        &device,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("not a flashlight-cnn state_dict"), "{err}");
    assert!(err.contains("fc1.weight"), "{err}");
}
