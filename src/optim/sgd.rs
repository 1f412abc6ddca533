//! `torch.optim.SGD`'s math (its options: `sgd_options.rs`); the shell
//! ([`super::Optimizer`]) does the rest.

use serde_json::{Map, Value};

use super::kind::OptimizerKind;
use super::options::OptionMap;
use super::sgd_options::SgdOptions;
use super::shell::{Optimizer, OptimizerMath, Shell, all_params, parse_state_tensor};
use crate::backend::BoxFuture;
use crate::backend::kernels::{SgdArgs, SgdScalars, vector_tail_from};
use crate::dtype::DType;
use crate::error::Result;
use crate::json::tensor_to_json;
use crate::replicas::{Replicas, StateArenas};

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

    fn state_arenas_mut(&mut self) -> Vec<&mut StateArenas> {
        vec![&mut self.momentum]
    }

    fn scalars(o: &SgdOptions, count: u64, has_grad: bool, param: (usize, DType)) -> SgdScalars {
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
            foreach_momentum: o.foreach && o.momentum != 0.0,
            half_tail_from: vector_tail_from(param.0),
        }
    }

    /// `_multi_tensor_sgd` scales the buffers of a group and dtype with one `_foreach_mul_`
    /// only when every parameter with a gradient has one already; otherwise each takes its own
    /// `mul_`.
    fn settle(entries: &mut [SgdScalars], group: impl Fn(usize) -> Option<usize>) {
        let mut without_buffer = Vec::new();
        for (k, s) in entries.iter().enumerate() {
            if let (Some(g), true) = (group(k), s.foreach_momentum && s.active && s.first_step) {
                without_buffer.resize(without_buffer.len().max(g + 1), false);
                without_buffer[g] = true;
            }
        }
        for (k, s) in entries.iter_mut().enumerate() {
            if group(k).is_some_and(|g| without_buffer.get(g) == Some(&true)) {
                s.foreach_momentum = false;
            }
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
        backend.sgd(SgdArgs {
            params,
            grads,
            momentum: self.momentum.get_mut(b),
            starts,
            scalars: table,
        })
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

impl super::sealed::Sealed for SgdMath {}
