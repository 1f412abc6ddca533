//! `PostLocalSGDOptimizer` and the post-local-SGD gradient synchronization that PyTorch's DDP
//! communication hook (`post_localSGD_hook`) performs, so the whole post-local SGD recipe runs
//! without DDP.

use std::sync::Arc;

use serde_json::Value;

use crate::averaging::ModelAverager;
use crate::comm::{Communicator, Subgroups, new_subgroups};
use crate::error::{Error, Result};
use crate::optim::LocalOptimizer;
use crate::replicas::{Replicas, Values};

/// The warning of a `load_state_dict` without an averager step.
pub const MISSING_STEP_WARNING: &str =
    "Loaded state dict does not contain a step counter for an averager. Setting step counter to 0.";

/// Local optimizer steps, then periodic (or hierarchical) model averaging after warm-up.
#[derive(Debug)]
pub struct PostLocalSgdOptimizer {
    optim: Box<dyn LocalOptimizer>,
    averager: Box<dyn ModelAverager>,
}

impl PostLocalSgdOptimizer {
    /// Wraps `optim` and `averager`.
    pub fn new(optim: Box<dyn LocalOptimizer>, averager: Box<dyn ModelAverager>) -> Self {
        PostLocalSgdOptimizer { optim, averager }
    }

    /// The local optimizer.
    pub fn optim(&self) -> &(dyn LocalOptimizer + 'static) {
        self.optim.as_ref()
    }

    /// The averager.
    pub fn averager(&self) -> &(dyn ModelAverager + 'static) {
        self.averager.as_ref()
    }

    /// `step()`: the local step on every rank, then `average_parameters` over the optimizer's
    /// parameter groups. Returns the averaging group size, or `None` when this step did not
    /// average. On success the averager's step counter advances by one (PyTorch's), as do the
    /// local optimizer's per-parameter counters (Adam's `step`, SGD's momentum buffers).
    ///
    /// # Errors
    /// A `ValueError` for replicas of another model ([`LocalOptimizer::check_model`]), then the
    /// averager's checks ([`ModelAverager::check_average`]: an `IndexError`, a
    /// `ValueError` for no parameter with a gradient on rank 0 or groups or replicas that do not
    /// fit the world, a `ZeroDivisionError` for a period of 0), then the local optimizer's
    /// ([`LocalOptimizer::step`]), then a failure of the averaging collective itself (a
    /// `RuntimeError` from the backend or the transport). A refused call changes nothing. When the
    /// collective fails, the local step has been applied (parameters, optimizer state and
    /// counters), the averager's counter is unchanged, and the parameters of the storage formats
    /// averaged before the failure hold their means: the parameters differ across ranks until the
    /// next averaging step succeeds.
    pub fn step(&mut self, replicas: &mut Replicas) -> Result<Option<usize>> {
        let params: Vec<usize> = self.optim.param_groups().into_iter().flatten().collect();
        // What the local optimizer or the averager would refuse is refused before the local
        // step changes anything.
        self.optim.check_model(replicas)?;
        self.averager.check_average(replicas, Some(&params))?;
        self.optim.step(replicas)?;
        let used = self.averager.average_parameters(replicas, Some(&params))?;
        self.heal_optimizer(replicas)?;
        Ok(used)
    }

    /// Takes this process's ranks into a running run of processes (a process that joins,
    /// `distopt train --join`): the averager admits them at the next sync point and heals them
    /// ([`ModelAverager::admit`]), then each gets its source's local optimizer state and step
    /// counters, as the live ranks heal it at the end of that point's [`Self::step`]. The next
    /// [`Self::step`] is the live ranks' next step.
    ///
    /// # Errors
    /// A `ValueError` for replicas of another model; those of [`ModelAverager::admit`] and
    /// of the heal's transfers.
    pub fn admit(&mut self, replicas: &mut Replicas) -> Result<()> {
        self.optim.check_model(replicas)?;
        self.averager.admit(replicas)?;
        self.heal_optimizer(replicas)
    }

    /// Heals the local optimizer's state of each rank the averager healed last, from that
    /// heal's source.
    fn heal_optimizer(&mut self, replicas: &Replicas) -> Result<()> {
        let healed = self.averager.healed().to_vec();
        let Some(world) = self.averager.world() else {
            return Ok(());
        };
        for (joiner, source) in healed {
            self.optim
                .heal_rank_state(world, replicas, source, joiner)?;
        }
        Ok(())
    }

    /// `zero_grad()`.
    pub fn zero_grad(&self, replicas: &mut Replicas) {
        self.optim.zero_grad(replicas);
    }

    /// Rank `rank`'s `state_dict()`: the local optimizer's, plus `"step"`, the averager's
    /// step counter.
    ///
    /// # Errors
    /// As the local optimizer's [`LocalOptimizer::state_dict`]: a `ValueError` for replicas of
    /// another model, an `IndexError` for a `rank` out of range, a `RuntimeError` when a readback
    /// fails.
    pub async fn state_dict(&self, replicas: &Replicas, rank: usize) -> Result<Value> {
        let mut state_dict = self.optim.state_dict(replicas, rank).await?;
        if let Value::Object(map) = &mut state_dict {
            map.insert("step".into(), Value::from(self.averager.step()));
        }
        Ok(state_dict)
    }

    /// `load_state_dict()` on rank `rank`: the local optimizer's state, and the averager's step
    /// counter from `"step"` — or, without it, a warning and a counter of 0.
    ///
    /// # Errors
    /// A `ValueError` when `"step"` is present but not a non-negative integer (checked before
    /// anything is loaded); the local optimizer's errors ([`LocalOptimizer::load_state_dict`]), in
    /// which case the averager's counter is unchanged.
    pub fn load_state_dict(
        &mut self,
        replicas: &mut Replicas,
        rank: usize,
        state_dict: &Value,
    ) -> Result<()> {
        // `"step"` is checked before anything is loaded, so that a bad one changes nothing.
        let step = match state_dict.get("step") {
            Some(step) => Some(
                step.as_u64()
                    .or_else(|| {
                        step.as_f64()
                            .filter(|s| {
                                *s >= 0.0 && s.fract() == 0.0 && *s <= 9_007_199_254_740_991.0
                            })
                            .map(|s| s as u64)
                    })
                    .ok_or_else(|| {
                        Error::value(format!(
                            "\"step\" must be a non-negative integer, got {}",
                            crate::json::clip_json(step)
                        ))
                    })?,
            ),
            None => None,
        };
        self.optim.load_state_dict(replicas, rank, state_dict)?;
        match step {
            Some(step) => self.averager.set_step(step),
            None => {
                crate::warnings::warn(MISSING_STEP_WARNING);
                self.averager.set_step(0);
            }
        }
        Ok(())
    }
}

/// `PostLocalSGDState` plus `post_localSGD_hook`: gradients all-reduced (mean) over the world
/// for the first `start_local_sgd_iter` iterations, then within the subgroup (or not at all
/// when `post_local_gradient_allreduce` is false).
#[derive(Debug)]
pub struct PostLocalSgdState {
    world: Arc<dyn Communicator>,
    subgroup: Subgroups,
    start_local_sgd_iter: u64,
    post_local_gradient_allreduce: bool,
    iter: u64,
}

impl PostLocalSgdState {
    /// `subgroup_size` `None` is PyTorch's default subgroup (one per machine; here the world).
    ///
    /// # Errors
    /// The `ValueError`s of [`new_subgroups`] for a `subgroup_size` that is not positive, exceeds
    /// the world size or does not divide it.
    pub fn new(
        world: Arc<dyn Communicator>,
        subgroup_size: Option<i64>,
        start_local_sgd_iter: u64,
        post_local_gradient_allreduce: bool,
    ) -> Result<Self> {
        let world_size = world.world_size();
        let subgroup = match subgroup_size {
            Some(size) => new_subgroups(world_size, size)?,
            None => Subgroups::world(world_size),
        };
        Ok(PostLocalSgdState {
            world,
            subgroup,
            start_local_sgd_iter,
            post_local_gradient_allreduce,
            iter: 0,
        })
    }

    /// Iterations seen so far (PyTorch stops counting once local SGD starts).
    pub fn iter(&self) -> u64 {
        self.iter
    }

    /// Sets the iteration count (PyTorch's `state.iter`): how a rank that joins a running run
    /// takes the live ranks' count, so that it does not start the warm-up again.
    pub fn set_iter(&mut self, iter: u64) {
        self.iter = iter;
    }

    /// The hook, run after every rank's backward pass: averages the gradients (each divided
    /// by the group size, then summed, in the gradient's dtype). Returns the group size used.
    /// A successful call during the warm-up counts the iteration (PyTorch's
    /// `maybe_increase_iter`: `iter` stops at `start_local_sgd_iter`).
    ///
    /// # Errors
    /// The collectives' errors ([`crate::comm::any_rank`], [`Communicator::all_reduce_mean`]): a
    /// `ValueError` when `replicas` does not hold the world's local ranks, a `RuntimeError` for a
    /// GPU error or a lost device. A failed call does not count the iteration and changes no
    /// gradient's presence; of the gradients' values, those of the storage formats reduced before
    /// the failure hold their means (one all-reduce runs per format), the others are untouched.
    pub fn synchronize_gradients(&mut self, replicas: &mut Replicas) -> Result<Option<usize>> {
        let warm_up = self.iter < self.start_local_sgd_iter;
        let groups = if warm_up {
            Subgroups::world(self.world.world_size())
        } else if self.post_local_gradient_allreduce {
            self.subgroup
        } else {
            return Ok(None);
        };
        let ranks = replicas.ranks();
        // Which gradients exist on some rank (DDP's map of used parameters).
        let local: Vec<Vec<bool>> = (0..ranks)
            .map(|r| {
                (0..replicas.len())
                    .map(|j| replicas.has_grad(r, j))
                    .collect()
            })
            .collect();
        let has = crate::comm::any_rank(self.world.as_ref(), &local)?;
        // Each gradient is averaged in its own dtype.
        replicas.all_reduce_mean(self.world.as_ref(), Values::Grads, groups, &has, None)?;
        // DDP gives every rank the reduced gradient: a rank without one now has it.
        for (j, _) in has.iter().enumerate().filter(|(_, h)| **h) {
            for rank in 0..ranks {
                replicas.set_has_grad(rank, j, true);
            }
        }
        // Counted only once the collectives have succeeded.
        if warm_up {
            self.iter += 1;
        }
        Ok(Some(groups.group_size()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockOn;
    use crate::averaging::PeriodicModelAverager;
    use crate::backend::CpuBackend;
    use crate::comm::SimulatedWorld;
    use crate::tensor::{HostData, Tensor};
    use serde_json::json;

    fn post_local(replicas: &Replicas) -> PostLocalSgdOptimizer {
        let world: Arc<dyn Communicator> = Arc::new(SimulatedWorld::new(2).unwrap());
        let optim = crate::optim::create(
            "SGD",
            replicas,
            vec![(vec![0], Default::default())],
            &json!({"lr": 0.1, "momentum": 0.9})
                .as_object()
                .unwrap()
                .clone(),
        )
        .unwrap();
        let averager = PeriodicModelAverager::new(2, 0, world).unwrap();
        PostLocalSgdOptimizer::new(optim, Box::new(averager))
    }

    /// A fractional or negative `"step"` is refused before anything is loaded: neither the
    /// averager's counter nor the local optimizer's state changes.
    #[test]
    fn a_bad_step_loads_nothing() {
        let backend: Arc<dyn crate::backend::Backend> = Arc::new(CpuBackend::new());
        let param = Tensor::new(&[2], HostData::Float32(vec![1.0, 2.0])).unwrap();
        let mut replicas = Replicas::replicate(backend, 2, &[param]).unwrap();
        let mut target = post_local(&replicas);
        let before = target.state_dict(&replicas, 0).block_on().unwrap();
        let mut incoming = before.clone();
        incoming["param_groups"][0]["lr"] = json!(0.5);
        for step in [json!(2.9), json!(-1), json!("3")] {
            incoming["step"] = step.clone();
            let error = target
                .load_state_dict(&mut replicas, 0, &incoming)
                .unwrap_err();
            assert_eq!(error.kind(), crate::error::ErrorKind::ValueError);
            assert_eq!(
                error.message(),
                format!("\"step\" must be a non-negative integer, got {step}")
            );
            assert_eq!(target.state_dict(&replicas, 0).block_on().unwrap(), before);
        }
        incoming["step"] = json!(3);
        target.load_state_dict(&mut replicas, 0, &incoming).unwrap();
        let after = target.state_dict(&replicas, 0).block_on().unwrap();
        assert_eq!(after["step"], json!(3));
        assert_eq!(after["param_groups"][0]["lr"], json!(0.5));
    }
}
