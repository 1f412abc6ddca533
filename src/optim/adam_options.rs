//! `torch.optim.Adam`'s and `AdamW`'s hyper-parameters: PyTorch's defaults and constructor
//! checks, and the typed form each step reads.

use serde_json::{Value, json};

use super::kind::OptimizerKind;
use super::options::{self, GroupOptions, OptionMap};
use crate::error::Result;

/// Adam's hyper-parameters, with `torch.optim.Adam`'s defaults. Build them with
/// `AdamOptions::default().with_lr(..)…` (the struct may gain fields). For `AdamW` use
/// [`AdamWOptions`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AdamOptions {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Coefficients of the running averages (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator (default 1e-8).
    pub eps: f64,
    /// Weight decay (default 0): an L2 penalty, or decoupled (AdamW's) with
    /// `decoupled_weight_decay`.
    pub weight_decay: f64,
    /// AMSGrad variant (default false).
    pub amsgrad: bool,
    /// Maximize the objective (default false).
    pub maximize: bool,
    /// Decoupled weight decay, as AdamW (default false; always true in an `AdamW`).
    pub decoupled_weight_decay: bool,
    /// PyTorch's `fused=True` (default false, printed as PyTorch's `None`): the update is
    /// computed as PyTorch's fused kernel does: in its "opmath" precision (float32 for 16-bit
    /// parameters, float64 for float64), its multiply-adds rounded once, and rounded to the
    /// parameter's format once per stored tensor instead of after every tensor operation
    /// (see `distopt::backend::kernels`).
    pub fused: bool,
    /// PyTorch's `foreach=True` (default false, printed as PyTorch's `None`, which on CPU
    /// tensors is the single-tensor path). Its one difference in value: on float16 and
    /// bfloat16 parameters `_foreach_mul_` scales the second moment by `beta2`, and AdamW's
    /// parameters by `1 - lr * weight_decay`, rounded to the parameter's format first.
    pub foreach: bool,
}

impl Default for AdamOptions {
    fn default() -> Self {
        AdamOptions {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
            maximize: false,
            decoupled_weight_decay: false,
            fused: false,
            foreach: false,
        }
    }
}

/// AdamW's hyper-parameters, with `torch.optim.AdamW`'s defaults (`weight_decay` 1e-2). The
/// weight decay is always decoupled: there is nothing to disagree with.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AdamWOptions {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Coefficients of the running averages (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (default 1e-2).
    pub weight_decay: f64,
    /// AMSGrad variant (default false).
    pub amsgrad: bool,
    /// Maximize the objective (default false).
    pub maximize: bool,
    /// PyTorch's `fused=True` (default false, printed as PyTorch's `None`): the update is
    /// computed as PyTorch's fused kernel does: in its "opmath" precision (float32 for 16-bit
    /// parameters, float64 for float64), its multiply-adds rounded once, and rounded to the
    /// parameter's format once per stored tensor instead of after every tensor operation
    /// (see `distopt::backend::kernels`).
    pub fused: bool,
    /// PyTorch's `foreach=True` (default false, printed as PyTorch's `None`, which on CPU
    /// tensors is the single-tensor path). Its one difference in value: on float16 and
    /// bfloat16 parameters `_foreach_mul_` scales the second moment by `beta2`, and AdamW's
    /// parameters by `1 - lr * weight_decay`, rounded to the parameter's format first.
    pub foreach: bool,
}

impl Default for AdamWOptions {
    fn default() -> Self {
        AdamWOptions {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            amsgrad: false,
            maximize: false,
            fused: false,
            foreach: false,
        }
    }
}

macro_rules! adam_builders {
    ($ty:ty) => {
        impl $ty {
            /// With learning rate `lr`.
            pub fn with_lr(mut self, lr: f64) -> Self {
                self.lr = lr;
                self
            }

            /// With running-average coefficients `betas`.
            pub fn with_betas(mut self, betas: (f64, f64)) -> Self {
                self.betas = betas;
                self
            }

            /// With denominator term `eps`.
            pub fn with_eps(mut self, eps: f64) -> Self {
                self.eps = eps;
                self
            }

            /// With weight decay `weight_decay`.
            pub fn with_weight_decay(mut self, weight_decay: f64) -> Self {
                self.weight_decay = weight_decay;
                self
            }

            /// With or without AMSGrad.
            pub fn with_amsgrad(mut self, amsgrad: bool) -> Self {
                self.amsgrad = amsgrad;
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
        }
    };
}

adam_builders!(AdamOptions);
adam_builders!(AdamWOptions);

impl AdamOptions {
    /// With or without decoupled weight decay (`Adam(decoupled_weight_decay=True)`).
    pub fn with_decoupled_weight_decay(mut self, decoupled: bool) -> Self {
        self.decoupled_weight_decay = decoupled;
        self
    }

    /// The options by PyTorch's keyword names.
    pub fn to_map(&self) -> OptionMap {
        let mut map = options::map(&[
            ("lr", options::float_json(self.lr)),
            (
                "betas",
                Value::Array(vec![
                    options::float_json(self.betas.0),
                    options::float_json(self.betas.1),
                ]),
            ),
            ("eps", options::float_json(self.eps)),
            ("weight_decay", options::float_json(self.weight_decay)),
            ("amsgrad", json!(self.amsgrad)),
            ("maximize", json!(self.maximize)),
            ("decoupled_weight_decay", json!(self.decoupled_weight_decay)),
        ]);
        options::insert_paths(&mut map, self.fused, self.foreach);
        map
    }
}

impl AdamWOptions {
    /// The options by PyTorch's keyword names (AdamW's constructor takes no
    /// `decoupled_weight_decay`).
    pub fn to_map(&self) -> OptionMap {
        let mut map = AdamOptions::from(self.clone()).to_map();
        map.remove("decoupled_weight_decay");
        map
    }
}

impl From<AdamWOptions> for AdamOptions {
    fn from(o: AdamWOptions) -> AdamOptions {
        AdamOptions {
            lr: o.lr,
            betas: o.betas,
            eps: o.eps,
            weight_decay: o.weight_decay,
            amsgrad: o.amsgrad,
            maximize: o.maximize,
            decoupled_weight_decay: true,
            fused: o.fused,
            foreach: o.foreach,
        }
    }
}

impl GroupOptions for AdamOptions {
    fn defaults(kind: OptimizerKind) -> OptionMap {
        let mut map = if kind == OptimizerKind::AdamW {
            AdamOptions::from(AdamWOptions::default()).to_map()
        } else {
            AdamOptions::default().to_map()
        };
        for (key, value) in [
            ("foreach", Value::Null),
            ("capturable", json!(false)),
            ("differentiable", json!(false)),
            ("fused", Value::Null),
        ] {
            map.insert(key.into(), value);
        }
        map
    }

    fn from_map(map: &OptionMap) -> Result<AdamOptions> {
        Ok(AdamOptions {
            lr: options::number(map, "lr")?,
            betas: options::pair(map, "betas")?,
            eps: options::number(map, "eps")?,
            weight_decay: options::number(map, "weight_decay")?,
            amsgrad: options::flag(map, "amsgrad")?,
            maximize: options::flag(map, "maximize")?,
            decoupled_weight_decay: options::flag(map, "decoupled_weight_decay")?,
            fused: options::flag(map, "fused")?,
            foreach: options::flag(map, "foreach")?,
        })
    }

    /// PyTorch's constructor checks (`not 0.0 <= x`, so NaN is refused), in its order.
    fn validate(&self) -> Result<()> {
        if !at_least_zero(self.lr) {
            return Err(options::invalid("learning rate", self.lr));
        }
        if !at_least_zero(self.eps) {
            return Err(options::invalid("epsilon value", self.eps));
        }
        for (index, beta) in [self.betas.0, self.betas.1].into_iter().enumerate() {
            if !(0.0..1.0).contains(&beta) {
                let what = format!("beta parameter at index {index}");
                return Err(options::invalid(&what, beta));
            }
        }
        if !at_least_zero(self.weight_decay) {
            return Err(options::invalid("weight_decay value", self.weight_decay));
        }
        Ok(())
    }
}

/// Python's `0.0 <= x`: false for NaN, which PyTorch therefore rejects.
fn at_least_zero(x: f64) -> bool {
    x >= 0.0
}

impl super::sealed::Sealed for AdamOptions {}
