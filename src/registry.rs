//! The models a binary knows by name: ember's built-in ones and those a user adds
//! (`ember::cli::main_with(Registry::builtin().with(MyNet))`). `--model NAME` and a run's
//! `config.json` are resolved here, and each command's task (`crate::tasks`) runs for the model
//! found, on the backend `--device` picks.
//!
//! The list of built-in models is [`Registry::builtin`]: adding one is its file in `models/`
//! (an [`EmberModel`]) and one line there.

use std::sync::{Arc, OnceLock};

use crate::backend::{DeviceArg, Trains};
use crate::bench::BenchRecord;
use crate::model::{DoesNotFit, EmberModel, ImageShape, ModelKind, ModelName};
use crate::tasks::{BenchJob, EvalJob, ExportJob, ImportJob, PredictJob, TrainJob};
use crate::train::EvalStats;

/// A model known by name, whatever its type: what the command line needs of an [`EmberModel`].
/// Every [`EmberModel`] whose network trains on the compiled backends is one.
pub trait AnyModel: Send + Sync {
    fn name(&self) -> &str;
    fn aliases(&self) -> Vec<String>;
    fn about(&self) -> &str;
    fn fits(&self, input: ImageShape) -> Result<(), DoesNotFit>;
    fn forward_macs_per_image(&self, input: ImageShape) -> Option<u64>;
    fn activation_bytes(&self, input: ImageShape) -> Option<ember_models::ActivationBytes>;
    /// Trained parameters for images of `input` and `classes` classes.
    fn trainable_params(&self, input: ImageShape, classes: usize) -> usize;
    fn train(&self, device: DeviceArg, job: TrainJob) -> anyhow::Result<EvalStats>;
    fn eval(&self, device: DeviceArg, job: EvalJob) -> anyhow::Result<EvalStats>;
    fn predict(&self, device: DeviceArg, job: PredictJob) -> anyhow::Result<()>;
    fn bench(&self, device: DeviceArg, job: BenchJob) -> anyhow::Result<BenchRecord>;
    /// On the CPU: the weights are read into a checkpoint, not run.
    fn import(&self, job: ImportJob) -> anyhow::Result<usize>;
    /// On the CPU: the checkpoint's weights are written out, not run.
    fn export(&self, job: ExportJob) -> anyhow::Result<usize>;
}

impl<D: Trains> AnyModel for D {
    fn name(&self) -> &str {
        EmberModel::name(self)
    }

    fn aliases(&self) -> Vec<String> {
        EmberModel::aliases(self)
    }

    fn about(&self) -> &str {
        EmberModel::about(self)
    }

    fn fits(&self, input: ImageShape) -> Result<(), DoesNotFit> {
        EmberModel::fits(self, input)
    }

    fn forward_macs_per_image(&self, input: ImageShape) -> Option<u64> {
        EmberModel::forward_macs_per_image(self, input)
    }

    fn activation_bytes(&self, input: ImageShape) -> Option<ember_models::ActivationBytes> {
        EmberModel::activation_bytes(self, input)
    }

    fn trainable_params(&self, input: ImageShape, classes: usize) -> usize {
        let net = self.init::<burn::backend::NdArray>(input, classes, &Default::default());
        ember_models::Classifier::trainable_params(&net)
    }

    fn train(&self, device: DeviceArg, job: TrainJob) -> anyhow::Result<EvalStats> {
        self.dispatch(device, job)?
    }

    fn eval(&self, device: DeviceArg, job: EvalJob) -> anyhow::Result<EvalStats> {
        self.dispatch(device, job)?
    }

    fn predict(&self, device: DeviceArg, job: PredictJob) -> anyhow::Result<()> {
        self.dispatch(device, job)?
    }

    fn bench(&self, device: DeviceArg, job: BenchJob) -> anyhow::Result<BenchRecord> {
        Ok(self.dispatch(device, job)?)
    }

    fn import(&self, job: ImportJob) -> anyhow::Result<usize> {
        self.dispatch(DeviceArg::Cpu, job)?
    }

    fn export(&self, job: ExportJob) -> anyhow::Result<usize> {
        self.dispatch(DeviceArg::Cpu, job)?
    }
}

/// Something done with every built-in model, with its type (tests run each one's parity
/// fixture this way).
pub trait EachBuiltin {
    fn visit<D: Trains>(&mut self, model: D);
}

/// ember's built-in models, in order: the one list of them. The seed models and the recipes'
/// ResNets and speedrun net ([`ModelKind`]), then one line for each model added after them.
pub fn each_builtin(each: &mut impl EachBuiltin) {
    for kind in <ModelKind as clap::ValueEnum>::value_variants() {
        each.visit(*kind);
    }
    each.visit(ember_models::LeNet5Model);
}

/// A name that no model of this binary has.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("no model is called {name:?}; this binary has {known}")]
pub struct UnknownModel {
    pub name: String,
    pub known: String,
}

/// The models a binary knows, by name.
#[derive(Clone, Default)]
pub struct Registry {
    models: Vec<Arc<dyn AnyModel>>,
}

impl Registry {
    /// No models.
    pub fn empty() -> Self {
        Self::default()
    }

    /// ember's own models ([`each_builtin`]).
    pub fn builtin() -> Self {
        struct Collect(Registry);
        impl EachBuiltin for Collect {
            fn visit<D: Trains>(&mut self, model: D) {
                self.0 = std::mem::take(&mut self.0).with(model);
            }
        }
        let mut collect = Collect(Self::empty());
        each_builtin(&mut collect);
        collect.0
    }

    /// This registry and `model`.
    ///
    /// # Panics
    /// When `model`'s name or an alias is taken already: two models must not answer to one
    /// `--model` value.
    pub fn with(mut self, model: impl Trains) -> Self {
        for name in std::iter::once(EmberModel::name(&model).to_string()).chain(EmberModel::aliases(&model)) {
            assert!(
                self.find(&name).is_none(),
                "two models are called {name:?}: give the new one another name"
            );
        }
        self.models.push(Arc::new(model));
        self
    }

    fn find(&self, name: &str) -> Option<&Arc<dyn AnyModel>> {
        self.models
            .iter()
            .find(|m| m.name() == name || m.aliases().iter().any(|a| a == name))
    }

    /// The model called `name` (or one of its aliases).
    pub fn get(&self, name: &str) -> Result<&dyn AnyModel, UnknownModel> {
        self.find(name).map(|m| &**m).ok_or_else(|| UnknownModel {
            name: name.to_string(),
            known: self.names().join(", "),
        })
    }

    /// `name`'s canonical name, as `config.json` records it.
    pub fn resolve(&self, name: &str) -> Result<ModelName, UnknownModel> {
        self.get(name).map(|m| ModelName::new(m.name()))
    }

    /// The models' names, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.models.iter().map(|m| m.name().to_string()).collect()
    }

    pub fn models(&self) -> impl Iterator<Item = &dyn AnyModel> {
        self.models.iter().map(|m| &**m)
    }
}

static GLOBAL: OnceLock<Registry> = OnceLock::new();

/// Makes `registry` the one the command line resolves `--model` in (see
/// `cli::main_with`); only the first call takes effect.
pub fn install(registry: Registry) {
    let _ = GLOBAL.set(registry);
}

/// The registry the command line uses: the installed one, else [`Registry::builtin`].
pub fn global() -> &'static Registry {
    GLOBAL.get_or_init(Registry::builtin)
}

/// clap's parser of `--model`: a name or alias of [`global`]'s, as its canonical name.
pub fn parse_model(text: &str) -> Result<ModelName, String> {
    global().resolve(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_names_and_aliases_resolve() {
        let r = Registry::builtin();
        assert_eq!(
            r.resolve("flashlight").unwrap(),
            ModelName::from(ModelKind::FlashlightCnn)
        );
        assert_eq!(
            r.resolve("resnet18").unwrap(),
            ModelName::from(ModelKind::Resnet18)
        );
        let err = r.resolve("lenet").unwrap_err().to_string();
        assert!(err.contains("\"lenet\"") && err.contains("speedrun-net"), "{err}");
    }

    #[test]
    #[should_panic(expected = "two models are called \"tch-net\"")]
    fn a_taken_name_is_refused() {
        let _ = Registry::builtin().with(ModelKind::TchNet);
    }
}
