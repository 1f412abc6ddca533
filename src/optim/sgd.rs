//! `torch.optim.SGD`.

use serde_json::{Value, json};

use super::options::{self, OptionMap};
use super::{
    LocalOptimizer, apply_loaded_options, check_groups, check_loaded_groups, check_same_model,
    local_indices, param_groups_json, read_state, write_state,
};
use crate::backend::kernels::SgdScalars;
use crate::backend::{Arena, BoxFuture};
use crate::error::{Error, Result};
use crate::json::{tensor_from_json, tensor_to_json};
use crate::pyfmt::float_repr;
use crate::replicas::Replicas;

/// SGD's hyper-parameters, with PyTorch's defaults.
#[derive(Debug, Clone, PartialEq)]
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
        }
    }
}

impl SgdOptions {
    fn to_map(&self) -> OptionMap {
        options::map(&[
            ("lr", json!(self.lr)),
            ("momentum", json!(self.momentum)),
            ("dampening", json!(self.dampening)),
            ("weight_decay", json!(self.weight_decay)),
            ("nesterov", json!(self.nesterov)),
            ("maximize", json!(self.maximize)),
        ])
    }

    fn from_map(map: &OptionMap) -> Result<SgdOptions> {
        Ok(SgdOptions {
            lr: options::number(map, "lr")?,
            momentum: options::number(map, "momentum")?,
            dampening: options::number(map, "dampening")?,
            weight_decay: options::number(map, "weight_decay")?,
            nesterov: options::flag(map, "nesterov")?,
            maximize: options::flag(map, "maximize")?,
        })
    }

    /// PyTorch's constructor checks, in its order.
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

fn defaults() -> OptionMap {
    let mut map = SgdOptions::default().to_map();
    map.insert("foreach".into(), Value::Null);
    map.insert("differentiable".into(), json!(false));
    map.insert("fused".into(), Value::Null);
    map
}

/// `torch.optim.SGD` on every rank of a [`Replicas`].
///
/// ```
/// use std::sync::Arc;
/// use distopt::{CpuBackend, Tensor};
/// use distopt::optim::{LocalOptimizer, Sgd, SgdOptions};
/// use distopt::replicas::Replicas;
/// let w = Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap();
/// let mut model = Replicas::replicate(Arc::new(CpuBackend::new()), 1, &[w]).unwrap();
/// let mut sgd = Sgd::new(&model, SgdOptions { lr: 0.5, ..Default::default() }).unwrap();
/// model.set_grads(0, &[Some(Tensor::from_f32(&[2], vec![1.0, 1.0]).unwrap())]).unwrap();
/// sgd.step(&mut model).unwrap();
/// assert_eq!(model.param_blocking(0, 0).unwrap().values_f64().unwrap(), vec![0.5, 1.5]);
/// assert!(Sgd::new(&model, SgdOptions { lr: -0.1, ..Default::default() }).is_err());
/// ```
#[derive(Debug)]
pub struct Sgd {
    groups: Vec<(Vec<usize>, OptionMap)>,
    defaults: OptionMap,
    ranks: usize,
    /// One momentum arena per replica group, created on first use.
    momentum: Vec<Option<Arena>>,
    /// `has_buffer[rank * params + j]`.
    has_buffer: Vec<bool>,
}

impl Sgd {
    /// SGD over every parameter of `replicas`.
    pub fn new(replicas: &Replicas, options: SgdOptions) -> Result<Sgd> {
        let mut defaults = defaults();
        defaults.extend(options.to_map());
        Sgd::from_options(
            replicas,
            vec![((0..replicas.len()).collect(), OptionMap::new())],
            &defaults,
        )
    }

    /// SGD over parameter groups, each with its own options over `defaults` (PyTorch's
    /// keyword names; unknown names are a `TypeError`).
    pub fn from_options(
        replicas: &Replicas,
        groups: Vec<(Vec<usize>, OptionMap)>,
        defaults: &OptionMap,
    ) -> Result<Sgd> {
        let defaults = options::merge("SGD", &self::defaults(), defaults)?;
        SgdOptions::from_map(&defaults)?.validate()?;
        let mut merged = Vec::with_capacity(groups.len());
        for (params, given) in groups {
            let map = options::merge("SGD", &defaults, &given)?;
            SgdOptions::from_map(&map)?;
            merged.push((params, map));
        }
        let indices: Vec<Vec<usize>> = merged.iter().map(|(p, _)| p.clone()).collect();
        check_groups(replicas, &indices)?;
        Ok(Sgd {
            groups: merged,
            defaults,
            ranks: replicas.ranks(),
            momentum: (0..replicas.groups.len()).map(|_| None).collect(),
            has_buffer: vec![false; replicas.ranks() * replicas.len()],
        })
    }

    /// The options of each parameter group.
    pub fn group_options(&self) -> Result<Vec<SgdOptions>> {
        self.groups
            .iter()
            .map(|(_, m)| SgdOptions::from_map(m))
            .collect()
    }

    fn momentum_bytes(&self) -> usize {
        self.momentum
            .iter()
            .flatten()
            .map(|a| a.bytes() / a.ranks().max(1))
            .sum()
    }
}

impl LocalOptimizer for Sgd {
    fn name(&self) -> &'static str {
        "SGD"
    }

    fn step(&mut self, replicas: &mut Replicas) -> Result<()> {
        check_same_model(
            replicas,
            self.ranks,
            self.has_buffer.len() / self.ranks.max(1),
        )?;
        let count = replicas.len();
        let mut options_of: Vec<Option<SgdOptions>> = vec![None; count];
        for (params, map) in &self.groups {
            let options = SgdOptions::from_map(map)?;
            for &j in params {
                options_of[j] = Some(options.clone());
            }
        }
        // One table per replica group: the settings of every (rank, parameter).
        let mut tables = Vec::with_capacity(replicas.groups.len());
        for group in &replicas.groups {
            let members = group.members.len();
            let mut scalars = vec![SgdScalars::default(); self.ranks * members];
            let mut needs_momentum = false;
            for rank in 0..self.ranks {
                for (k, &j) in group.members.iter().enumerate() {
                    let Some(o) = &options_of[j] else { continue };
                    let active = replicas.has_grad(rank, j);
                    scalars[rank * members + k] = SgdScalars {
                        active,
                        first_step: !self.has_buffer[rank * count + j],
                        nesterov: o.nesterov,
                        maximize: o.maximize,
                        lr: o.lr,
                        momentum: o.momentum,
                        one_minus_dampening: 1.0 - o.dampening,
                        weight_decay: o.weight_decay,
                    };
                    needs_momentum |= active && o.momentum != 0.0;
                }
            }
            tables.push((scalars, needs_momentum));
        }
        let backend = replicas.backend().clone();
        for ((g, group), (scalars, needs_momentum)) in
            replicas.groups.iter_mut().enumerate().zip(tables)
        {
            if !scalars.iter().any(|s| s.active) {
                continue;
            }
            if needs_momentum && self.momentum[g].is_none() {
                self.momentum[g] = Some(group.state_arena(backend.as_ref(), self.ranks)?);
            }
            backend.sgd(
                &mut group.params,
                &group.grads,
                self.momentum[g].as_mut(),
                &group.starts,
                &scalars,
            )?;
            let members = group.members.len();
            for rank in 0..self.ranks {
                for (k, &j) in group.members.iter().enumerate() {
                    let s = &scalars[rank * members + k];
                    if s.active && s.momentum != 0.0 {
                        self.has_buffer[rank * count + j] = true;
                    }
                }
            }
        }
        Ok(())
    }

    fn state_bytes_per_rank(&self) -> usize {
        self.momentum_bytes()
    }

    fn state_len(&self, rank: usize) -> usize {
        let count = self.has_buffer.len() / self.ranks.max(1);
        self.has_buffer[rank * count..(rank + 1) * count]
            .iter()
            .filter(|b| **b)
            .count()
    }

    fn group_options(&self) -> Vec<OptionMap> {
        self.groups.iter().map(|(_, m)| m.clone()).collect()
    }

    fn param_groups(&self) -> Vec<Vec<usize>> {
        self.groups.iter().map(|(p, _)| p.clone()).collect()
    }

    fn add_param_group(&mut self, params: Vec<usize>, given: &OptionMap) -> Result<()> {
        let map = options::merge("SGD", &self.defaults, given)?;
        SgdOptions::from_map(&map)?;
        self.groups.push((params, map));
        Ok(())
    }

    fn state_dict<'a>(
        &'a self,
        replicas: &'a Replicas,
        rank: usize,
    ) -> BoxFuture<'a, Result<Value>> {
        Box::pin(async move {
            check_same_model(
                replicas,
                self.ranks,
                self.has_buffer.len() / self.ranks.max(1),
            )?;
            if rank >= self.ranks {
                return Err(Error::new(
                    crate::ErrorKind::IndexError,
                    format!("rank {rank} out of range for {} ranks", self.ranks),
                ));
            }
            let groups = self.param_groups();
            let mut state = serde_json::Map::new();
            for (k, &j) in groups.iter().flatten().enumerate() {
                if !self.has_buffer[rank * replicas.len() + j] {
                    continue;
                }
                let slot = &replicas.slots[j];
                let Some(arena) = &self.momentum[slot.group] else {
                    continue;
                };
                let tensor = read_state(arena, replicas, rank, j).await?;
                state.insert(
                    k.to_string(),
                    json!({"momentum_buffer": tensor_to_json(&tensor).await?}),
                );
            }
            Ok(json!({"state": state, "param_groups": param_groups_json(&self.groups)}))
        })
    }

    fn load_state_dict(
        &mut self,
        replicas: &mut Replicas,
        rank: usize,
        state_dict: &Value,
    ) -> Result<()> {
        check_same_model(
            replicas,
            self.ranks,
            self.has_buffer.len() / self.ranks.max(1),
        )?;
        if rank >= self.ranks {
            return Err(Error::new(
                crate::ErrorKind::IndexError,
                format!("rank {rank} out of range for {} ranks", self.ranks),
            ));
        }
        let groups = self.param_groups();
        let saved = check_loaded_groups(&groups, state_dict)?;
        let locals = local_indices(&groups, replicas.len());
        let state = state_dict
            .get("state")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for (j, local) in locals.iter().enumerate() {
            let Some(local) = local else { continue };
            let count = replicas.len();
            match state
                .get(&local.to_string())
                .and_then(|s| s.get("momentum_buffer"))
            {
                Some(Value::Null) | None => self.has_buffer[rank * count + j] = false,
                Some(buffer) => {
                    let tensor =
                        tensor_from_json(buffer, &format!("momentum_buffer of parameter {local}"))?;
                    let slot = replicas.slots[j].clone();
                    let group = &replicas.groups[slot.group];
                    if self.momentum[slot.group].is_none() {
                        self.momentum[slot.group] =
                            Some(group.state_arena(replicas.backend().as_ref(), self.ranks)?);
                    }
                    let arena = self.momentum[slot.group].as_mut().expect("created above");
                    write_state(arena, &slot, rank, &tensor)?;
                    self.has_buffer[rank * count + j] = true;
                }
            }
        }
        apply_loaded_options(&mut self.groups, saved);
        Ok(())
    }
}
