//! The optimizer classes distopt runs, by PyTorch's class names: the one table every front
//! end and algorithm (ZeRO, `DistributedOptimizer`, the JS bindings, the CLI) parses names with.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A local optimizer class.
///
/// ```
/// use distopt::optim::OptimizerKind;
/// let kind: OptimizerKind = "AdamW".parse().unwrap();
/// assert_eq!(kind, OptimizerKind::AdamW);
/// assert_eq!(kind.class_path(), "torch.optim.adamw.AdamW");
/// assert_eq!(
///     "Adagrad".parse::<OptimizerKind>().unwrap_err().to_string(),
///     "ValueError: unknown optimizer 'Adagrad': expected SGD, Adam or AdamW"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OptimizerKind {
    /// `torch.optim.SGD`.
    Sgd,
    /// `torch.optim.Adam`.
    Adam,
    /// `torch.optim.AdamW` (Adam with decoupled weight decay, default 1e-2).
    AdamW,
}

impl OptimizerKind {
    /// Every kind, in the order error texts list them.
    pub const ALL: [OptimizerKind; 3] = [
        OptimizerKind::Sgd,
        OptimizerKind::Adam,
        OptimizerKind::AdamW,
    ];

    /// PyTorch's class name: `"SGD"`, `"Adam"`, `"AdamW"`.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "SGD",
            OptimizerKind::Adam => "Adam",
            OptimizerKind::AdamW => "AdamW",
        }
    }

    /// The class's module path, as `repr(cls)` shows it: `torch.optim.sgd.SGD`, …
    pub fn class_path(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "torch.optim.sgd.SGD",
            OptimizerKind::Adam => "torch.optim.adam.Adam",
            OptimizerKind::AdamW => "torch.optim.adamw.AdamW",
        }
    }

    /// The functional optimizer PyTorch's `torch.distributed.optim` pairs with the class
    /// (`_FunctionalSGD`, …).
    pub fn functional_name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "_FunctionalSGD",
            OptimizerKind::Adam => "_FunctionalAdam",
            OptimizerKind::AdamW => "_FunctionalAdamW",
        }
    }
}

impl fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OptimizerKind {
    type Err = Error;

    /// Parses PyTorch's class name (`"SGD"`, `"Adam"`, `"AdamW"`; exact case).
    ///
    /// # Errors
    /// A `ValueError` naming the unknown class and the known ones.
    fn from_str(name: &str) -> Result<OptimizerKind> {
        OptimizerKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                Error::value(format!(
                    "unknown optimizer '{}': expected SGD, Adam or AdamW",
                    clip(name)
                ))
            })
    }
}

/// At most 64 characters of a user's string, for an error message.
fn clip(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_string(),
    }
}
