//! `torch.optim.Adam` and `torch.optim.AdamW`.

use serde_json::{Value, json};

use super::options::{self, OptionMap};
use super::{
    LocalOptimizer, apply_loaded_options, check_groups, check_loaded_groups, check_same_model,
    local_indices, param_groups_json, read_state, write_state,
};
use crate::backend::kernels::{AdamArenas, AdamScalars};
use crate::backend::{Arena, BoxFuture};
use crate::error::{Error, Result};
use crate::json::{tensor_from_json, tensor_to_json};
use crate::pyfmt::float_repr;
use crate::replicas::Replicas;
use crate::tensor::Tensor;

/// Adam's hyper-parameters, with PyTorch's defaults (AdamW: `weight_decay` 1e-2).
#[derive(Debug, Clone, PartialEq)]
pub struct AdamOptions {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Coefficients of the running averages (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator (default 1e-8).
    pub eps: f64,
    /// Weight decay (Adam: L2 penalty, default 0; AdamW: decoupled, default 1e-2).
    pub weight_decay: f64,
    /// AMSGrad variant (default false).
    pub amsgrad: bool,
    /// Maximize the objective (default false).
    pub maximize: bool,
}

impl AdamOptions {
    /// PyTorch's defaults for Adam (`decoupled == false`) or AdamW.
    pub fn defaults(decoupled: bool) -> AdamOptions {
        AdamOptions {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: if decoupled { 1e-2 } else { 0.0 },
            amsgrad: false,
            maximize: false,
        }
    }

    fn to_map(&self) -> OptionMap {
        options::map(&[
            ("lr", json!(self.lr)),
            ("betas", json!([self.betas.0, self.betas.1])),
            ("eps", json!(self.eps)),
            ("weight_decay", json!(self.weight_decay)),
            ("amsgrad", json!(self.amsgrad)),
            ("maximize", json!(self.maximize)),
        ])
    }

    fn from_map(map: &OptionMap) -> Result<AdamOptions> {
        Ok(AdamOptions {
            lr: options::number(map, "lr")?,
            betas: options::pair(map, "betas")?,
            eps: options::number(map, "eps")?,
            weight_decay: options::number(map, "weight_decay")?,
            amsgrad: options::flag(map, "amsgrad")?,
            maximize: options::flag(map, "maximize")?,
        })
    }

    /// PyTorch's constructor checks, in its order.
    fn validate(&self) -> Result<()> {
        if !at_least_zero(self.lr) {
            return Err(Error::value(format!(
                "Invalid learning rate: {}",
                float_repr(self.lr)
            )));
        }
        if !at_least_zero(self.eps) {
            return Err(Error::value(format!(
                "Invalid epsilon value: {}",
                float_repr(self.eps)
            )));
        }
        for (index, beta) in [self.betas.0, self.betas.1].into_iter().enumerate() {
            if !(0.0..1.0).contains(&beta) {
                return Err(Error::value(format!(
                    "Invalid beta parameter at index {index}: {}",
                    float_repr(beta)
                )));
            }
        }
        if !at_least_zero(self.weight_decay) {
            return Err(Error::value(format!(
                "Invalid weight_decay value: {}",
                float_repr(self.weight_decay)
            )));
        }
        Ok(())
    }
}

/// Python's `0.0 <= x`: false for NaN, which PyTorch therefore rejects.
fn at_least_zero(x: f64) -> bool {
    x >= 0.0
}

fn defaults(decoupled: bool) -> OptionMap {
    let mut map = AdamOptions::defaults(decoupled).to_map();
    for (key, value) in [
        ("foreach", Value::Null),
        ("capturable", json!(false)),
        ("differentiable", json!(false)),
        ("fused", Value::Null),
        ("decoupled_weight_decay", json!(decoupled)),
    ] {
        map.insert(key.into(), value);
    }
    map
}

/// The state arenas of one replica group.
#[derive(Debug)]
struct Moments {
    exp_avg: Arena,
    exp_avg_sq: Arena,
    max_exp_avg_sq: Option<Arena>,
}

/// `torch.optim.Adam` (or `AdamW`, with decoupled weight decay) on every rank of a
/// [`Replicas`]. The bias corrections of each (rank, parameter) follow its own step count, which
/// advances only on steps where it had a gradient.
#[derive(Debug)]
pub struct Adam {
    decoupled: bool,
    groups: Vec<(Vec<usize>, OptionMap)>,
    defaults: OptionMap,
    ranks: usize,
    moments: Vec<Option<Moments>>,
    /// `steps[rank * params + j]`: completed steps of parameter j on that rank (0: no state).
    steps: Vec<u64>,
}

impl Adam {
    /// Adam (`decoupled == false`) or AdamW over every parameter of `replicas`.
    pub fn new(replicas: &Replicas, options: AdamOptions, decoupled: bool) -> Result<Adam> {
        let mut defaults = defaults(decoupled);
        defaults.extend(options.to_map());
        Adam::from_options(
            replicas,
            vec![((0..replicas.len()).collect(), OptionMap::new())],
            &defaults,
            decoupled,
        )
    }

    /// Adam/AdamW over parameter groups, each with its own options over `defaults`.
    pub fn from_options(
        replicas: &Replicas,
        groups: Vec<(Vec<usize>, OptionMap)>,
        defaults: &OptionMap,
        decoupled: bool,
    ) -> Result<Adam> {
        let class = if decoupled { "AdamW" } else { "Adam" };
        let defaults = options::merge(class, &self::defaults(decoupled), defaults)?;
        AdamOptions::from_map(&defaults)?.validate()?;
        let mut merged = Vec::with_capacity(groups.len());
        for (params, given) in groups {
            let map = options::merge(class, &defaults, &given)?;
            AdamOptions::from_map(&map)?;
            merged.push((params, map));
        }
        let indices: Vec<Vec<usize>> = merged.iter().map(|(p, _)| p.clone()).collect();
        check_groups(replicas, &indices)?;
        Ok(Adam {
            decoupled,
            groups: merged,
            defaults,
            ranks: replicas.ranks(),
            moments: (0..replicas.groups.len()).map(|_| None).collect(),
            steps: vec![0; replicas.ranks() * replicas.len()],
        })
    }

    fn moment_bytes(&self) -> usize {
        self.moments
            .iter()
            .flatten()
            .map(|m| {
                let per_rank = |a: &Arena| a.bytes() / a.ranks().max(1);
                per_rank(&m.exp_avg)
                    + per_rank(&m.exp_avg_sq)
                    + m.max_exp_avg_sq.as_ref().map_or(0, per_rank)
            })
            .sum()
    }

    fn ensure_moments(
        &mut self,
        replicas: &Replicas,
        group: usize,
        amsgrad: bool,
    ) -> Result<&mut Moments> {
        let backend = replicas.backend().clone();
        let layout = &replicas.groups[group];
        if self.moments[group].is_none() {
            self.moments[group] = Some(Moments {
                exp_avg: layout.state_arena(backend.as_ref(), self.ranks)?,
                exp_avg_sq: layout.state_arena(backend.as_ref(), self.ranks)?,
                max_exp_avg_sq: None,
            });
        }
        let moments = self.moments[group].as_mut().expect("created above");
        if amsgrad && moments.max_exp_avg_sq.is_none() {
            moments.max_exp_avg_sq = Some(layout.state_arena(backend.as_ref(), self.ranks)?);
        }
        Ok(moments)
    }
}

impl LocalOptimizer for Adam {
    fn name(&self) -> &'static str {
        if self.decoupled { "AdamW" } else { "Adam" }
    }

    fn step(&mut self, replicas: &mut Replicas) -> Result<()> {
        check_same_model(replicas, self.ranks, self.steps.len() / self.ranks.max(1))?;
        let count = replicas.len();
        let mut options_of: Vec<Option<AdamOptions>> = vec![None; count];
        for (params, map) in &self.groups {
            let options = AdamOptions::from_map(map)?;
            for &j in params {
                options_of[j] = Some(options.clone());
            }
        }
        let mut tables = Vec::with_capacity(replicas.groups.len());
        for group in &replicas.groups {
            let members = group.members.len();
            let mut scalars = vec![AdamScalars::default(); self.ranks * members];
            let mut amsgrad = false;
            for rank in 0..self.ranks {
                for (k, &j) in group.members.iter().enumerate() {
                    let Some(o) = &options_of[j] else { continue };
                    let active = replicas.has_grad(rank, j);
                    if !active {
                        continue;
                    }
                    let step = (self.steps[rank * count + j] + 1) as f64;
                    let (beta1, beta2) = o.betas;
                    let bias_correction1 = 1.0 - beta1.powf(step);
                    let bias_correction2 = 1.0 - beta2.powf(step);
                    scalars[rank * members + k] = AdamScalars {
                        active,
                        maximize: o.maximize,
                        amsgrad: o.amsgrad,
                        decoupled: self.decoupled && o.weight_decay != 0.0,
                        weight_decay: if self.decoupled { 0.0 } else { o.weight_decay },
                        decay_factor: 1.0 - o.lr * o.weight_decay,
                        one_minus_beta1: 1.0 - beta1,
                        beta2,
                        one_minus_beta2: 1.0 - beta2,
                        step_size: o.lr / bias_correction1,
                        bias_correction2_sqrt: bias_correction2.powf(0.5),
                        eps: o.eps,
                    };
                    amsgrad |= o.amsgrad;
                }
            }
            tables.push((scalars, amsgrad));
        }
        let backend = replicas.backend().clone();
        for (g, (scalars, amsgrad)) in tables.into_iter().enumerate() {
            if !scalars.iter().any(|s| s.active) {
                continue;
            }
            self.ensure_moments(replicas, g, amsgrad)?;
            let moments = self.moments[g].as_mut().expect("ensured");
            let group = &mut replicas.groups[g];
            backend.adam(
                AdamArenas {
                    params: &mut group.params,
                    grads: &group.grads,
                    exp_avg: &mut moments.exp_avg,
                    exp_avg_sq: &mut moments.exp_avg_sq,
                    max_exp_avg_sq: moments.max_exp_avg_sq.as_mut(),
                },
                &group.starts,
                &scalars,
            )?;
            let members = group.members.len();
            for rank in 0..self.ranks {
                for (k, &j) in group.members.iter().enumerate() {
                    if scalars[rank * members + k].active {
                        self.steps[rank * count + j] += 1;
                    }
                }
            }
        }
        Ok(())
    }

    fn state_bytes_per_rank(&self) -> usize {
        self.moment_bytes()
    }

    fn state_len(&self, rank: usize) -> usize {
        let count = self.steps.len() / self.ranks.max(1);
        self.steps[rank * count..(rank + 1) * count]
            .iter()
            .filter(|s| **s > 0)
            .count()
    }

    fn group_options(&self) -> Vec<OptionMap> {
        self.groups.iter().map(|(_, m)| m.clone()).collect()
    }

    fn param_groups(&self) -> Vec<Vec<usize>> {
        self.groups.iter().map(|(p, _)| p.clone()).collect()
    }

    fn add_param_group(&mut self, params: Vec<usize>, given: &OptionMap) -> Result<()> {
        let map = options::merge(self.name(), &self.defaults, given)?;
        AdamOptions::from_map(&map)?;
        self.groups.push((params, map));
        Ok(())
    }

    fn state_dict<'a>(
        &'a self,
        replicas: &'a Replicas,
        rank: usize,
    ) -> BoxFuture<'a, Result<Value>> {
        Box::pin(async move {
            check_same_model(replicas, self.ranks, self.steps.len() / self.ranks.max(1))?;
            if rank >= self.ranks {
                return Err(Error::new(
                    crate::ErrorKind::IndexError,
                    format!("rank {rank} out of range for {} ranks", self.ranks),
                ));
            }
            let groups = self.param_groups();
            let amsgrad_of = |j: usize| {
                self.groups
                    .iter()
                    .find(|(p, _)| p.contains(&j))
                    .is_some_and(|(_, m)| options::flag(m, "amsgrad").unwrap_or(false))
            };
            let mut state = serde_json::Map::new();
            for (k, &j) in groups.iter().flatten().enumerate() {
                let steps = self.steps[rank * replicas.len() + j];
                if steps == 0 {
                    continue;
                }
                let slot = &replicas.slots[j];
                let Some(moments) = &self.moments[slot.group] else {
                    continue;
                };
                let step = Tensor::from_f32(&[], vec![steps as f32])?;
                let mut entry = serde_json::Map::new();
                entry.insert("step".into(), tensor_to_json(&step).await?);
                let exp_avg = read_state(&moments.exp_avg, replicas, rank, j).await?;
                entry.insert("exp_avg".into(), tensor_to_json(&exp_avg).await?);
                let exp_avg_sq = read_state(&moments.exp_avg_sq, replicas, rank, j).await?;
                entry.insert("exp_avg_sq".into(), tensor_to_json(&exp_avg_sq).await?);
                if amsgrad_of(j) {
                    if let Some(max) = &moments.max_exp_avg_sq {
                        let max = read_state(max, replicas, rank, j).await?;
                        entry.insert("max_exp_avg_sq".into(), tensor_to_json(&max).await?);
                    }
                }
                state.insert(k.to_string(), Value::Object(entry));
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
        check_same_model(replicas, self.ranks, self.steps.len() / self.ranks.max(1))?;
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
        let count = replicas.len();
        for (j, local) in locals.iter().enumerate() {
            let Some(local) = local else { continue };
            let Some(entry) = state.get(&local.to_string()) else {
                self.steps[rank * count + j] = 0;
                continue;
            };
            let what = |key: &str| format!("{key} of parameter {local}");
            let step = match entry.get("step") {
                Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
                Some(tensor) => tensor_from_json(tensor, &what("step"))?
                    .values_f64()?
                    .first()
                    .copied()
                    .unwrap_or(0.0),
                None => {
                    return Err(Error::value(format!(
                        "state of parameter {local} has no \"step\""
                    )));
                }
            };
            let slot = replicas.slots[j].clone();
            let has_max = entry.get("max_exp_avg_sq").is_some_and(|v| !v.is_null());
            let moments = self.ensure_moments(replicas, slot.group, has_max)?;
            for (key, arena) in [
                ("exp_avg", &mut moments.exp_avg),
                ("exp_avg_sq", &mut moments.exp_avg_sq),
            ] {
                let value = entry.get(key).ok_or_else(|| {
                    Error::value(format!("state of parameter {local} has no \"{key}\""))
                })?;
                write_state(arena, &slot, rank, &tensor_from_json(value, &what(key))?)?;
            }
            if has_max {
                let value = &entry["max_exp_avg_sq"];
                let arena = moments.max_exp_avg_sq.as_mut().expect("ensured");
                write_state(
                    arena,
                    &slot,
                    rank,
                    &tensor_from_json(value, &what("max_exp_avg_sq"))?,
                )?;
            }
            self.steps[rank * count + j] = step as u64;
        }
        apply_loaded_options(&mut self.groups, saved);
        Ok(())
    }
}
