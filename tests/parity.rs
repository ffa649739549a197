//! Numerical parity with PyTorch on the f32 backends ember trains with (flex; CUDA when built
//! with it and a device is present), and import of a PyTorch state_dict. Method and fixtures:
//! tests/common/parity.rs.

#[path = "common/parity.rs"]
mod parity;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Tensor, TensorData};
use ember::import::from_pytorch_file;
use ember::model::ModelKind;
use ember_models::Classifier;
use parity::{assert_parity, compare, fixtures, Fixture, CPU};

#[test]
fn parity_all_models_flex() {
    for kind in [
        ModelKind::PytorchExampleNet,
        ModelKind::TchNet,
        ModelKind::FlashlightCnn,
        ModelKind::Resnet20,
        ModelKind::SpeedrunNet,
    ] {
        assert_parity::<Autodiff<ember::backend::Cpu>>(kind, CPU, &Default::default());
    }
}

/// Every built-in model has a parity fixture (`benches/pytorch/parity.py`, from its twin in
/// `models.py`), replayed here: a model added to the registry is compared with PyTorch without
/// a line here. ResNet-18 alone has none (11M parameters; ResNet-20 covers its blocks).
#[test]
fn parity_every_builtin_model_flex() {
    use burn::tensor::backend::AutodiffBackend;
    use ember::backend::{DeviceArg, DeviceInfo, ModelTask, Trains};
    use ember::model::{EmberModel, Trainable};
    use ember::registry::{each_builtin, EachBuiltin};

    struct Replay;
    impl<D: EmberModel> ModelTask<D> for Replay {
        type Output = ();
        fn run<B: AutodiffBackend>(self, model: &D, device: B::Device, _info: DeviceInfo)
        where
            D::Net<B>: Trainable<B>,
        {
            parity::assert_parity_of::<B, D>(model, CPU, &device);
        }
    }
    struct Each(Vec<String>);
    impl EachBuiltin for Each {
        fn visit<D: Trains>(&mut self, model: D) {
            let name = model.name().to_string();
            if name == "resnet18" {
                return;
            }
            assert!(
                fixtures().join(format!("parity-{name}.safetensors")).is_file(),
                "{name} has no parity fixture: add its twin to benches/pytorch/models.py and run parity.py --only {name}"
            );
            model.dispatch(DeviceArg::Cpu, Replay).unwrap();
            self.0.push(name);
        }
    }
    let mut each = Each(Vec::new());
    each_builtin(&mut each);
    assert!(each.0.len() >= 5, "{:?}", each.0);
}

#[cfg(feature = "cuda")]
#[test]
fn parity_all_models_cuda() {
    use ember::backend::{resolve, DeviceArg, Resolved};
    use parity::Tolerance;
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
    let device = burn::backend::cuda::CudaDevice::new(0);
    for kind in [
        ModelKind::PytorchExampleNet,
        ModelKind::TchNet,
        ModelKind::FlashlightCnn,
        ModelKind::Resnet20,
        ModelKind::SpeedrunNet,
    ] {
        assert_parity::<Autodiff<ember::backend::Gpu>>(kind, gpu, &device);
    }
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
