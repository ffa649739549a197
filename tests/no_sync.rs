//! Between log points, a training step never waits for the device: it reads nothing back,
//! never synchronises or reseeds the backend, and uploads nothing.
//!
//! On burn's CUDA backend (fusion over cubecl) each of these is a blocking round trip: a read or
//! `sync` waits for the queue, and `seed` drains the fusion stream first (burn-fusion 0.21
//! `backend.rs`). The test runs the real training loop on a backend that counts them: burn's
//! router (`burn-router`, the backend that replays burn's tensor-op IR on another backend)
//! over ndarray, with a client that counts every read, sync, seed and upload. An epoch of 6
//! steps must do exactly what an epoch of 2 does (the per-epoch permutation upload and the
//! end-of-epoch reads); any per-step round trip makes the counts differ.

mod common;

use std::cell::Cell;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{DType, Shape, TensorData};
use burn_backend::{DTypeUsageSet, ExecutionError};
use burn_ir::{OperationIr, TensorId, TensorIr};
use burn_router::{BackendRouter, MultiBackendBridge, RouterTensor, Runner, RunnerChannel, RunnerClient};
use burn_std::future::DynFut;
use ember::config::Recipe;
use ember::train::{init_model, train_whole_epoch, EpochEnd, Splits};

type Inner = NdArray<f32>;
type Device = <Inner as burn::tensor::backend::BackendTypes>::Device;

/// Round trips to the device, per thread (the router runs each op on the calling thread).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    reads: usize,
    syncs: usize,
    seeds: usize,
    uploads: usize,
}

thread_local! {
    static COUNTS: Cell<Counts> = Cell::new(Counts::default());
}

fn count(f: impl FnOnce(&mut Counts)) {
    COUNTS.with(|c| {
        let mut counts = c.get();
        f(&mut counts);
        c.set(counts);
    });
}

fn counts() -> Counts {
    COUNTS.with(Cell::get)
}

/// burn-router's runner for ndarray, counting.
#[derive(Clone)]
struct Counting(Runner<Inner>);

impl RunnerClient for Counting {
    type Device = Device;

    fn register_op(&self, op: OperationIr) {
        self.0.register_op(op)
    }

    fn read_tensor_async(&self, tensor: TensorIr) -> DynFut<Result<TensorData, ExecutionError>> {
        count(|c| c.reads += 1);
        self.0.read_tensor_async(tensor)
    }

    fn sync(&self) -> Result<(), ExecutionError> {
        count(|c| c.syncs += 1);
        self.0.sync()
    }

    fn create_empty_handle(&self) -> TensorId {
        self.0.create_empty_handle()
    }

    fn register_tensor_data(&self, data: TensorData) -> RouterTensor<Self> {
        count(|c| c.uploads += 1);
        let ir = self.0.register_tensor_data_desc(data);
        RouterTensor::new(ir.id, ir.shape, ir.dtype, self.clone())
    }

    fn device(&self) -> Self::Device {
        self.0.device()
    }

    fn seed(&self, seed: u64) {
        count(|c| c.seeds += 1);
        self.0.seed(seed)
    }

    fn dtype_usage(&self, dtype: DType) -> DTypeUsageSet {
        self.0.dtype_usage(dtype)
    }
}

/// One backend, one device: nothing to bridge.
struct NoBridge;

impl MultiBackendBridge for NoBridge {
    type TensorHandle = <Inner as burn_ir::BackendIr>::Handle;
    type Device = Device;

    fn change_backend_float(tensor: Self::TensorHandle, _: Shape, _: &Device) -> Self::TensorHandle {
        tensor
    }

    fn change_backend_int(tensor: Self::TensorHandle, _: Shape, _: &Device) -> Self::TensorHandle {
        tensor
    }

    fn change_backend_bool(tensor: Self::TensorHandle, _: Shape, _: &Device) -> Self::TensorHandle {
        tensor
    }
}

#[derive(Clone)]
struct CountingChannel;

impl RunnerChannel for CountingChannel {
    type Device = Device;
    type Bridge = NoBridge;
    type Client = Counting;
    type FloatElem = f32;
    type IntElem = i64;
    type BoolElem = bool;

    fn name(_: &Device) -> String {
        "counting<ndarray>".into()
    }

    fn init_client(device: &Device) -> Counting {
        Counting(Runner::new(device.clone()))
    }

    fn get_tensor_handle(
        tensor: &TensorIr,
        client: &Counting,
    ) -> <NoBridge as MultiBackendBridge>::TensorHandle {
        client.0.get_tensor_handle(tensor)
    }

    fn register_tensor(
        client: &Counting,
        handle: <NoBridge as MultiBackendBridge>::TensorHandle,
        shape: Shape,
        dtype: DType,
    ) -> RouterTensor<Counting> {
        client.0.register_tensor(handle, shape, dtype, client.clone())
    }
}

type Counted = BackendRouter<CountingChannel>;

/// What one epoch of `steps` steps of `recipe` costs in round trips, counted from its start
/// (the splits already uploaded, the model built).
fn epoch_round_trips(recipe: Recipe, steps: usize) -> Counts {
    let data = common::load_mnist();
    let mut config = recipe.config();
    config.batch_size = 16;
    config.valid_size = 0;
    config.limit_train = Some(steps * 16);
    config.limit_test = Some(10);
    let device = Device::default();
    let splits = Splits::<Counted>::upload(&data, &config, &device).unwrap();
    let model = init_model::<Autodiff<Counted>>(&config, &device);
    let mut optim = config.optimizer.init();
    let before = counts();
    let (_, end) = train_whole_epoch(model, &mut optim, &splits.train, &config, 0);
    let after = counts();
    assert!(
        matches!(end, EpochEnd::Done(ref s) if s.steps == steps),
        "{end:?}"
    );
    Counts {
        reads: after.reads - before.reads,
        syncs: after.syncs - before.syncs,
        seeds: after.seeds - before.seeds,
        uploads: after.uploads - before.uploads,
    }
}

/// `recipe`'s epoch of 6 steps makes exactly the round trips one of 2 steps makes.
fn assert_no_per_step_round_trips(recipe: Recipe) -> Counts {
    let two = epoch_round_trips(recipe, 2);
    let six = epoch_round_trips(recipe, 6);
    assert_eq!(
        six, two,
        "6 steps made more round trips than 2: {six:?} vs {two:?}"
    );
    two
}

/// The PyTorch example's recipe: channel and element dropout, Adadelta.
#[test]
fn training_steps_make_no_round_trips_to_the_device() {
    let two = assert_no_per_step_round_trips(Recipe::PytorchExample);
    assert_eq!(two.syncs + two.seeds, 0, "{two:?}");
    // The counter sees what it should: the epoch's permutation is uploaded once.
    assert!(two.uploads >= 1, "{two:?}");
    // Reads: the loss sum and the first non-finite step, once each at the end of the epoch.
    assert!(two.reads <= 2, "{two:?}");
}

/// The speedrun recipe: batch norm, on-device augmentation, a per-step schedule with momentum.
#[test]
fn steps_with_augmentation_and_a_schedule_make_none_either() {
    assert_no_per_step_round_trips(Recipe::Speedrun);
}
