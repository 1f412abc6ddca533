//! Local optimizers over replica arenas: `torch.optim.SGD`, `Adam` and `AdamW`, one fused
//! dispatch per step per dtype for every rank and parameter, with PyTorch's defaults,
//! constructor errors, parameter groups and `state_dict()` layout.
//!
//! Every rank has its own optimizer state (as every process has its own optimizer in PyTorch);
//! state dicts are per rank.
//! A file a concept, imports pointing down: `sealed` and `kind` at the bottom; the options
//! (`options`, `sgd_options`, `adam_options`) and `defaults` above them; `local` (the
//! [`LocalOptimizer`] trait); the `shell` every optimizer is built on; each optimizer's math
//! (`sgd`, `adam`); and `factory`, which names them all. This file only re-exports.

mod adam;
mod adam_options;
mod bias_correction;
mod defaults;
mod factory;
mod kind;
mod local;
mod options;
pub(crate) mod sealed;
mod sgd;
mod sgd_options;
mod shell;

pub use adam::{Adam, AdamLoaded, AdamMath};
pub use adam_options::{AdamOptions, AdamWOptions};
pub use defaults::defaults_of;
pub use factory::{build, create};
pub use kind::OptimizerKind;
pub use local::LocalOptimizer;
pub(crate) use local::check_same_model;
pub use options::{GroupOptions, OptionMap, option_map};
pub use sgd::{Sgd, SgdMath};
pub use sgd_options::SgdOptions;
pub use shell::{DUPLICATE_WARNING, Optimizer, OptimizerMath, ParamGroup, Shell};
pub(crate) use shell::{check_loaded_group_size, loaded_param_groups};
