//! `torch.optim.Adam`'s and `AdamW`'s math (their options: `adam_options.rs`); the shell
//! ([`super::Optimizer`]) does the rest.

use serde_json::{Map, Value};

use super::adam_options::{AdamOptions, AdamWOptions};
use super::bias_correction::bias_corrections;
use super::kind::OptimizerKind;
use super::options::OptionMap;
use super::shell::{Optimizer, OptimizerMath, Shell, all_params, parse_state_tensor};
use crate::backend::BoxFuture;
use crate::backend::kernels::{AdamArenas, AdamScalars, remainder_from, vector_tail_from};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::json::{tensor_from_json, tensor_to_json};
use crate::pyfmt::float_repr;
use crate::replicas::{Replicas, StateArenas};
use crate::tensor::Tensor;

/// Adam's math: the moments laid out like the parameters, created on first use. The shell's
/// counter of a (rank, parameter) is its step count, which advances only on steps where it had
/// a gradient; the bias corrections follow it.
#[derive(Debug)]
pub struct AdamMath {
    exp_avg: StateArenas,
    exp_avg_sq: StateArenas,
    /// Only for buckets with an amsgrad parameter.
    max_exp_avg_sq: StateArenas,
}

/// One parameter's loaded Adam state, encoded.
#[derive(Debug)]
pub struct AdamLoaded {
    step: u64,
    exp_avg: Vec<u32>,
    exp_avg_sq: Vec<u32>,
    max_exp_avg_sq: Option<Vec<u32>>,
}

/// `torch.optim.Adam` or `torch.optim.AdamW` on every rank of a [`Replicas`].
///
/// ```
/// use std::sync::Arc;
/// use distopt::{CpuBackend, Tensor};
/// use distopt::optim::{Adam, AdamWOptions, LocalOptimizer, OptimizerKind};
/// use distopt::replicas::Replicas;
/// let w = Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap();
/// let model = Replicas::replicate(Arc::new(CpuBackend::new()), 1, &[w]).unwrap();
/// let adamw = Adam::adamw(&model, AdamWOptions::default().with_lr(0.1)).unwrap();
/// assert_eq!(adamw.kind(), OptimizerKind::AdamW);
/// assert_eq!(adamw.groups()[0].options().weight_decay, 1e-2);
/// ```
pub type Adam = Optimizer<AdamMath>;

impl Optimizer<AdamMath> {
    /// `torch.optim.Adam` over every parameter of `replicas`.
    ///
    /// # Errors
    /// PyTorch's `ValueError`s for invalid options or an empty parameter list.
    pub fn new(replicas: &Replicas, options: AdamOptions) -> Result<Adam> {
        Adam::from_options(
            OptimizerKind::Adam,
            replicas,
            all_params(replicas),
            &options.to_map(),
        )
    }

    /// `torch.optim.AdamW` over every parameter of `replicas`.
    ///
    /// # Errors
    /// PyTorch's `ValueError`s for invalid options or an empty parameter list.
    pub fn adamw(replicas: &Replicas, options: AdamWOptions) -> Result<Adam> {
        Adam::from_options(
            OptimizerKind::AdamW,
            replicas,
            all_params(replicas),
            &options.to_map(),
        )
    }

    /// Adam or AdamW (`kind`) over parameter groups, each with its own options over
    /// `defaults` (PyTorch's keyword names).
    ///
    /// # Errors
    /// A `ValueError` for a `kind` other than Adam or AdamW; otherwise as
    /// [`Optimizer::with_groups`].
    pub fn from_options(
        kind: OptimizerKind,
        replicas: &Replicas,
        groups: Vec<(Vec<usize>, OptionMap)>,
        defaults: &OptionMap,
    ) -> Result<Adam> {
        if !matches!(kind, OptimizerKind::Adam | OptimizerKind::AdamW) {
            return Err(Error::value(format!("{kind} is not Adam or AdamW")));
        }
        Optimizer::with_groups(kind, replicas, groups, defaults)
    }
}

impl OptimizerMath for AdamMath {
    type Options = AdamOptions;
    type Scalars = AdamScalars;
    type Loaded = AdamLoaded;

    fn empty(buckets: usize) -> Self {
        AdamMath {
            exp_avg: StateArenas::empty(buckets),
            exp_avg_sq: StateArenas::empty(buckets),
            max_exp_avg_sq: StateArenas::empty(buckets),
        }
    }

    fn state_arenas_mut(&mut self) -> Vec<&mut StateArenas> {
        vec![
            &mut self.exp_avg,
            &mut self.exp_avg_sq,
            &mut self.max_exp_avg_sq,
        ]
    }

    fn scalars(o: &AdamOptions, count: u64, has_grad: bool, param: (usize, DType)) -> AdamScalars {
        if !has_grad {
            return AdamScalars::default();
        }
        let (beta1, beta2) = o.betas;
        let (bias_correction1, bias_correction2_sqrt) =
            bias_corrections(o.betas, count + 1, o.fused);
        let decoupled = o.decoupled_weight_decay;
        // The scalars of the two `mul_`s: `_foreach_mul_` rounds them to a 16-bit format.
        let mul_scalar = |x: f64| {
            if o.foreach {
                param.1.foreach_scalar(x)
            } else {
                x
            }
        };
        AdamScalars {
            active: true,
            maximize: o.maximize,
            amsgrad: o.amsgrad,
            decoupled: decoupled && o.weight_decay != 0.0,
            weight_decay: if decoupled { 0.0 } else { o.weight_decay },
            decay_factor: mul_scalar(1.0 - o.lr * o.weight_decay),
            one_minus_beta1: 1.0 - beta1,
            beta2: mul_scalar(beta2),
            one_minus_beta2: 1.0 - beta2,
            step_size: o.lr / bias_correction1,
            bias_correction2_sqrt,
            eps: o.eps,
            fused: o.fused,
            remainder_from: if o.fused && o.amsgrad {
                remainder_from(param.0, param.1.size_bytes())
            } else {
                usize::MAX
            },
            half_tail_from: vector_tail_from(param.0),
        }
    }

    fn active(entry: &AdamScalars) -> bool {
        entry.active
    }

    /// PyTorch's `state["step"]`: one more per step that updated the parameter.
    fn counted(_entry: &AdamScalars, count: u64) -> u64 {
        count + 1
    }

    fn run(&mut self, replicas: &mut Replicas, b: usize, table: &[AdamScalars]) -> Result<()> {
        self.exp_avg.ensure(replicas, b)?;
        self.exp_avg_sq.ensure(replicas, b)?;
        if table.iter().any(|s| s.active && s.amsgrad) {
            self.max_exp_avg_sq.ensure(replicas, b)?;
        }
        let backend = replicas.backend().clone();
        let (params, grads, starts) = replicas.buckets_mut()[b].step_arenas();
        backend.adam(
            AdamArenas {
                params,
                grads,
                exp_avg: self.exp_avg.get_mut(b).expect("ensured"),
                exp_avg_sq: self.exp_avg_sq.get_mut(b).expect("ensured"),
                max_exp_avg_sq: self.max_exp_avg_sq.get_mut(b),
            },
            starts,
            table,
        )
    }

    fn state_bytes_per_rank(&self) -> usize {
        self.exp_avg.bytes_per_rank()
            + self.exp_avg_sq.bytes_per_rank()
            + self.max_exp_avg_sq.bytes_per_rank()
    }

    fn state_entry<'a>(
        &'a self,
        shell: &'a Shell<AdamOptions>,
        replicas: &'a Replicas,
        rank: usize,
        j: usize,
    ) -> BoxFuture<'a, Result<Option<Map<String, Value>>>> {
        Box::pin(async move {
            if !self.exp_avg.holds(replicas, j) {
                return Ok(None);
            }
            let step = Tensor::from_f32(&[], vec![shell.count(rank, j) as f32])?;
            let mut entry = Map::new();
            entry.insert("step".into(), tensor_to_json(&step).await?);
            for (key, state) in [("exp_avg", &self.exp_avg), ("exp_avg_sq", &self.exp_avg_sq)] {
                let tensor = state
                    .read(replicas, rank, j)
                    .await?
                    .expect("created together");
                entry.insert(key.into(), tensor_to_json(&tensor).await?);
            }
            if shell.options_of(j).is_some_and(|o| o.amsgrad) {
                if let Some(max) = self.max_exp_avg_sq.read(replicas, rank, j).await? {
                    entry.insert("max_exp_avg_sq".into(), tensor_to_json(&max).await?);
                }
            }
            Ok(Some(entry))
        })
    }

    fn parse_entry(
        replicas: &Replicas,
        j: usize,
        local: usize,
        entry: &Value,
    ) -> Result<AdamLoaded> {
        let what = |key: &str| format!("{key} of parameter {local}");
        let step = match entry.get("step") {
            Some(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
            Some(tensor) => tensor_from_json(tensor, &what("step"))?
                .values_f64()?
                .first()
                .copied()
                .unwrap_or(f64::NAN),
            None => {
                return Err(Error::value(format!(
                    "state of parameter {local} has no \"step\""
                )));
            }
        };
        if !(step >= 0.0 && step <= u64::MAX as f64) {
            return Err(Error::value(format!(
                "state of parameter {local} has an invalid step {}",
                float_repr(step)
            )));
        }
        let tensor = |key: &str| {
            let value = entry.get(key).ok_or_else(|| {
                Error::value(format!("state of parameter {local} has no \"{key}\""))
            })?;
            parse_state_tensor(replicas, j, value, &what(key))
        };
        let exp_avg = tensor("exp_avg")?;
        let exp_avg_sq = tensor("exp_avg_sq")?;
        let max_exp_avg_sq = match entry.get("max_exp_avg_sq") {
            None | Some(Value::Null) => None,
            Some(_) => Some(tensor("max_exp_avg_sq")?),
        };
        Ok(AdamLoaded {
            step: step as u64,
            exp_avg,
            exp_avg_sq,
            max_exp_avg_sq,
        })
    }

    fn commit_entry(
        &mut self,
        shell: &mut Shell<AdamOptions>,
        replicas: &Replicas,
        rank: usize,
        j: usize,
        loaded: Option<AdamLoaded>,
    ) -> Result<()> {
        let Some(loaded) = loaded else {
            shell.set_count(rank, j, 0);
            return Ok(());
        };
        self.exp_avg
            .write_words(replicas, rank, j, &loaded.exp_avg)?;
        self.exp_avg_sq
            .write_words(replicas, rank, j, &loaded.exp_avg_sq)?;
        if let Some(words) = &loaded.max_exp_avg_sq {
            self.max_exp_avg_sq.write_words(replicas, rank, j, words)?;
        }
        shell.set_count(rank, j, loaded.step);
        Ok(())
    }
}

impl super::sealed::Sealed for AdamMath {}
