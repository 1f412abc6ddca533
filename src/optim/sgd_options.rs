//! `torch.optim.SGD`'s hyper-parameters: PyTorch's defaults and constructor checks, and the
//! typed form each step reads.

use serde_json::{Value, json};

use super::kind::OptimizerKind;
use super::options::{self, GroupOptions, OptionMap};
use crate::error::{Error, Result};

/// SGD's hyper-parameters, with PyTorch's defaults. Build them with
/// `SgdOptions::default().with_lr(..)…` (the struct may gain fields).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SgdOptions {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Momentum factor (default 0).
    pub momentum: f64,
    /// Dampening for momentum (default 0).
    pub dampening: f64,
    /// L2 penalty (default 0).
    pub weight_decay: f64,
    /// Nesterov momentum (default false).
    pub nesterov: bool,
    /// Maximize the objective (default false).
    pub maximize: bool,
    /// PyTorch's `fused=True` (default false, printed as PyTorch's `None`): the update is
    /// computed as PyTorch's fused kernel does: in its "opmath" precision (float32 for 16-bit
    /// parameters, float64 for float64), its multiply-adds rounded once, and rounded to the
    /// parameter's format once per stored tensor instead of after every tensor operation
    /// (see `distopt::backend::kernels`).
    pub fused: bool,
    /// PyTorch's `foreach=True` (default false, printed as PyTorch's `None`, which on CPU
    /// tensors is the single-tensor path). Its one difference in value: the momentum buffers
    /// of a group's float16 and bfloat16 parameters are scaled with `_foreach_mul_`, which
    /// rounds the momentum to the format first (see
    /// [`SgdScalars::foreach_momentum`](crate::backend::kernels::SgdScalars::foreach_momentum)).
    pub foreach: bool,
}

impl Default for SgdOptions {
    fn default() -> Self {
        SgdOptions {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
            fused: false,
            foreach: false,
        }
    }
}

impl SgdOptions {
    /// With learning rate `lr`.
    pub fn with_lr(mut self, lr: f64) -> Self {
        self.lr = lr;
        self
    }

    /// With momentum factor `momentum`.
    pub fn with_momentum(mut self, momentum: f64) -> Self {
        self.momentum = momentum;
        self
    }

    /// With dampening `dampening`.
    pub fn with_dampening(mut self, dampening: f64) -> Self {
        self.dampening = dampening;
        self
    }

    /// With L2 penalty `weight_decay`.
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// With or without Nesterov momentum.
    pub fn with_nesterov(mut self, nesterov: bool) -> Self {
        self.nesterov = nesterov;
        self
    }

    /// Maximizing or minimizing.
    pub fn with_maximize(mut self, maximize: bool) -> Self {
        self.maximize = maximize;
        self
    }

    /// With or without PyTorch's fused update (`fused=True`).
    pub fn with_fused(mut self, fused: bool) -> Self {
        self.fused = fused;
        self
    }

    /// With or without PyTorch's multi-tensor update (`foreach=True`).
    pub fn with_foreach(mut self, foreach: bool) -> Self {
        self.foreach = foreach;
        self
    }

    /// The options by PyTorch's keyword names.
    pub fn to_map(&self) -> OptionMap {
        let mut map = options::map(&[
            ("lr", options::float_json(self.lr)),
            ("momentum", options::float_json(self.momentum)),
            ("dampening", options::float_json(self.dampening)),
            ("weight_decay", options::float_json(self.weight_decay)),
            ("nesterov", json!(self.nesterov)),
            ("maximize", json!(self.maximize)),
        ]);
        options::insert_paths(&mut map, self.fused, self.foreach);
        map
    }
}

impl GroupOptions for SgdOptions {
    fn defaults(_kind: OptimizerKind) -> OptionMap {
        let mut map = SgdOptions::default().to_map();
        map.insert("foreach".into(), Value::Null);
        map.insert("differentiable".into(), json!(false));
        map.insert("fused".into(), Value::Null);
        map
    }

    fn from_map(map: &OptionMap) -> Result<SgdOptions> {
        Ok(SgdOptions {
            lr: options::number(map, "lr")?,
            momentum: options::number(map, "momentum")?,
            dampening: options::number(map, "dampening")?,
            weight_decay: options::number(map, "weight_decay")?,
            nesterov: options::flag(map, "nesterov")?,
            maximize: options::flag(map, "maximize")?,
            fused: options::flag(map, "fused")?,
            foreach: options::flag(map, "foreach")?,
        })
    }

    /// PyTorch's constructor checks, in its order. Like PyTorch's (`lr < 0.0`), they let NaN
    /// through.
    fn validate(&self) -> Result<()> {
        if self.lr < 0.0 {
            return Err(options::invalid("learning rate", self.lr));
        }
        if self.momentum < 0.0 {
            return Err(options::invalid("momentum value", self.momentum));
        }
        if self.weight_decay < 0.0 {
            return Err(options::invalid("weight_decay value", self.weight_decay));
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::value(
                "Nesterov momentum requires a momentum and zero dampening",
            ));
        }
        Ok(())
    }
}

impl super::sealed::Sealed for SgdOptions {}
