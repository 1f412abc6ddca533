//! Every class's defaults, for the checks that look beyond one class (a state dict of another
//! optimizer, ZeRO's and DiLoCo's option lists).

use super::adam_options::AdamOptions;
use super::kind::OptimizerKind;
use super::options::{GroupOptions, OptionMap};
use super::sgd_options::SgdOptions;

/// The complete defaults of `kind` (`optimizer.defaults`).
pub fn defaults_of(kind: OptimizerKind) -> OptionMap {
    match kind {
        OptimizerKind::Sgd => SgdOptions::defaults(kind),
        OptimizerKind::Adam | OptimizerKind::AdamW => AdamOptions::defaults(kind),
    }
}
