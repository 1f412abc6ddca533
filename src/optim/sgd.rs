//! `torch.optim.SGD`: its options and its math; the shell ([`super::Optimizer`]) does the rest.

use serde_json::{Map, Value, json};

use super::OptimizerKind;
use super::options::{self, GroupOptions, OptionMap};
use super::shell::{Optimizer, OptimizerMath, Shell, all_params, parse_state_tensor};
use crate::backend::BoxFuture;
use crate::backend::kernels::SgdScalars;
use crate::error::{Error, Result};
use crate::json::tensor_to_json;
use crate::pyfmt::float_repr;
use crate::replicas::{Replicas, StateArenas};

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
        if self.fused {
            // Only when set: PyTorch prints the default as `None`.
            map.insert("fused".into(), json!(true));
        }
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
        })
    }

    /// PyTorch's constructor checks, in its order. Like PyTorch's (`lr < 0.0`), they let NaN
    /// through.
    fn validate(&self) -> Result<()> {
        if self.lr < 0.0 {
            return Err(Error::value(format!(
                "Invalid learning rate: {}",
                float_repr(self.lr)
            )));
        }
        if self.momentum < 0.0 {
            return Err(Error::value(format!(
                "Invalid momentum value: {}",
                float_repr(self.momentum)
            )));
        }
        if self.weight_decay < 0.0 {
            return Err(Error::value(format!(
                "Invalid weight_decay value: {}",
                float_repr(self.weight_decay)
            )));
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::value(
                "Nesterov momentum requires a momentum and zero dampening",
            ));
        }
        Ok(())
    }
}

/// SGD's math: one momentum arena per storage format, created on first use. The shell's
/// counter of a (rank, parameter) is 1 when it has a momentum buffer.
#[derive(Debug)]
pub struct SgdMath {
    momentum: StateArenas,
}

/// `torch.optim.SGD` on every rank of a [`Replicas`].
///
/// ```
/// use distopt::BlockOn;
/// use std::sync::Arc;
/// use distopt::{CpuBackend, Tensor};
/// use distopt::optim::{LocalOptimizer, Sgd, SgdOptions};
/// use distopt::replicas::Replicas;
/// let w = Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap();
/// let mut model = Replicas::replicate(Arc::new(CpuBackend::new()), 1, &[w]).unwrap();
/// let mut sgd = Sgd::new(&model, SgdOptions::default().with_lr(0.5)).unwrap();
/// model.set_grads(0, &[Some(Tensor::from_f32(&[2], vec![1.0, 1.0]).unwrap())]).unwrap();
/// sgd.step(&mut model).unwrap();
/// assert_eq!(model.param(0, 0).block_on().unwrap().values_f64().unwrap(), vec![0.5, 1.5]);
/// assert!(Sgd::new(&model, SgdOptions::default().with_lr(-0.1)).is_err());
/// ```
pub type Sgd = Optimizer<SgdMath>;

impl Optimizer<SgdMath> {
    /// SGD over every parameter of `replicas`.
    ///
    /// # Errors
    /// PyTorch's `ValueError`s for invalid options or an empty parameter list.
    pub fn new(replicas: &Replicas, options: SgdOptions) -> Result<Sgd> {
        Sgd::from_options(replicas, all_params(replicas), &options.to_map())
    }

    /// SGD over parameter groups, each with its own options over `defaults` (PyTorch's
    /// keyword names; unknown names are a `TypeError`).
    ///
    /// # Errors
    /// As [`Optimizer::with_groups`].
    pub fn from_options(
        replicas: &Replicas,
        groups: Vec<(Vec<usize>, OptionMap)>,
        defaults: &OptionMap,
    ) -> Result<Sgd> {
        Optimizer::with_groups(OptimizerKind::Sgd, replicas, groups, defaults)
    }
}

impl OptimizerMath for SgdMath {
    type Options = SgdOptions;
    type Scalars = SgdScalars;
    /// The encoded momentum buffer (`None`: PyTorch's `momentum_buffer: None`).
    type Loaded = Option<Vec<u32>>;

    fn empty(buckets: usize) -> Self {
        SgdMath {
            momentum: StateArenas::empty(buckets),
        }
    }

    fn scalars(o: &SgdOptions, count: u64, has_grad: bool) -> SgdScalars {
        SgdScalars {
            active: has_grad,
            first_step: count == 0,
            nesterov: o.nesterov,
            maximize: o.maximize,
            lr: o.lr,
            momentum: o.momentum,
            one_minus_dampening: 1.0 - o.dampening,
            weight_decay: o.weight_decay,
            fused: o.fused,
        }
    }

    fn active(entry: &SgdScalars) -> bool {
        entry.active
    }

    /// The counter says whether a momentum buffer exists (PyTorch's `momentum_buffer` is
    /// created by the first step with momentum).
    fn counted(entry: &SgdScalars, count: u64) -> u64 {
        if entry.momentum != 0.0 { 1 } else { count }
    }

    fn run(&mut self, replicas: &mut Replicas, b: usize, table: &[SgdScalars]) -> Result<()> {
        if table.iter().any(|s| s.active && s.momentum != 0.0) {
            self.momentum.ensure(replicas, b)?;
        }
        let backend = replicas.backend().clone();
        let (params, grads, starts) = replicas.buckets_mut()[b].step_arenas();
        backend.sgd(params, grads, self.momentum.get_mut(b), starts, table)
    }

    fn state_bytes_per_rank(&self) -> usize {
        self.momentum.bytes_per_rank()
    }

    fn state_entry<'a>(
        &'a self,
        _shell: &'a Shell<SgdOptions>,
        replicas: &'a Replicas,
        rank: usize,
        j: usize,
    ) -> BoxFuture<'a, Result<Option<Map<String, Value>>>> {
        Box::pin(async move {
            let Some(tensor) = self.momentum.read(replicas, rank, j).await? else {
                return Ok(None);
            };
            let mut entry = Map::new();
            entry.insert("momentum_buffer".into(), tensor_to_json(&tensor).await?);
            Ok(Some(entry))
        })
    }

    fn parse_entry(
        replicas: &Replicas,
        j: usize,
        local: usize,
        entry: &Value,
    ) -> Result<Option<Vec<u32>>> {
        match entry.get("momentum_buffer") {
            // PyTorch keeps `momentum_buffer: None` (momentum 0); no buffer either way.
            Some(Value::Null) | None => Ok(None),
            Some(buffer) => parse_state_tensor(
                replicas,
                j,
                buffer,
                &format!("momentum_buffer of parameter {local}"),
            )
            .map(Some),
        }
    }

    fn commit_entry(
        &mut self,
        shell: &mut Shell<SgdOptions>,
        replicas: &Replicas,
        rank: usize,
        j: usize,
        loaded: Option<Option<Vec<u32>>>,
    ) -> Result<()> {
        let Some(words) = loaded.flatten() else {
            shell.set_count(rank, j, 0);
            return Ok(());
        };
        self.momentum.write_words(replicas, rank, j, &words)?;
        shell.set_count(rank, j, 1);
        Ok(())
    }
}
