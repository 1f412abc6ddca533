//! Building an optimizer by its class: PyTorch's class names to [`Sgd`] or [`Adam`].

use super::adam::Adam;
use super::kind::OptimizerKind;
use super::local::LocalOptimizer;
use super::options::OptionMap;
use super::sgd::Sgd;
use crate::error::Result;
use crate::replicas::Replicas;

/// Builds the optimizer named `name` (`"SGD"`, `"Adam"`, `"AdamW"`: PyTorch's class names)
/// over `groups` of global parameter indices, each with its own options over `defaults`.
///
/// # Errors
/// A `ValueError` for an unknown name; otherwise as [`build`].
pub fn create(
    name: &str,
    replicas: &Replicas,
    groups: Vec<(Vec<usize>, OptionMap)>,
    defaults: &OptionMap,
) -> Result<Box<dyn LocalOptimizer>> {
    build(name.parse()?, replicas, groups, defaults)
}

/// Builds an optimizer of class `kind` over `groups` of global parameter indices, each with
/// its own options over `defaults` (PyTorch's keyword names, parsed here once).
///
/// # Errors
/// PyTorch's: a `TypeError` for an unknown keyword, a `ValueError` for an invalid
/// hyper-parameter, an empty parameter list or a parameter in two groups; an `IndexError` for
/// an index outside the replicas.
pub fn build(
    kind: OptimizerKind,
    replicas: &Replicas,
    groups: Vec<(Vec<usize>, OptionMap)>,
    defaults: &OptionMap,
) -> Result<Box<dyn LocalOptimizer>> {
    Ok(match kind {
        OptimizerKind::Sgd => Box::new(Sgd::from_options(replicas, groups, defaults)?),
        OptimizerKind::Adam | OptimizerKind::AdamW => {
            Box::new(Adam::from_options(kind, replicas, groups, defaults)?)
        }
    })
}
