//! DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
//! Models", 2023) as torchft's `DiLoCo` runs it: every rank takes `sync_every` inner optimizer
//! steps on its own, then the ranks all-reduce the *pseudo-gradient* (the parameters at the
//! last sync minus the current ones, averaged over the world), reset the parameters to the
//! last sync's values and take one outer optimizer step with that gradient.
//!
//! Inner and outer optimizer are any [`LocalOptimizer`] built over the same [`Replicas`] (as
//! torchft builds both over the model's parameters). The parameters at the last sync are kept
//! in backup arenas on the backend, laid out like the parameters (on the device with the GPU
//! backend); a sync is one pseudo-gradient dispatch and one all-reduce per storage format, the
//! outer step, and one device copy back into the backup.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::backend::{Arena, Backend, CopyRegion};
use crate::comm::{Communicator, Subgroups};
use crate::error::{Error, Result};
use crate::json::{tensor_from_json, tensor_to_json};
use crate::optim::{LocalOptimizer, check_same_model, read_state, write_state};
use crate::replicas::Replicas;

/// DiLoCo: inner steps on every rank, and every `sync_every` of them an outer step with the
/// world's mean pseudo-gradient.
///
/// ```
/// use std::sync::Arc;
/// use distopt::comm::SimulatedWorld;
/// use distopt::diloco::DiLoCo;
/// use distopt::optim::{self, option_map};
/// use distopt::replicas::Replicas;
/// use distopt::{CpuBackend, Tensor};
/// let world = Arc::new(SimulatedWorld::new(2).unwrap());
/// let w = Tensor::from_f32(&[1], vec![1.0]).unwrap();
/// let mut model = Replicas::replicate(Arc::new(CpuBackend::new()), 2, &[w]).unwrap();
/// let sgd = |lr: f64| {
///     let options = option_map(&serde_json::json!({"lr": lr})).unwrap();
///     optim::create("SGD", &model, vec![(vec![0], Default::default())], &options).unwrap()
/// };
/// let (inner, outer) = (sgd(0.5), sgd(1.0));
/// let mut diloco = DiLoCo::new(&model, inner, outer, 1, world).unwrap();
/// for (rank, g) in [(0, 2.0), (1, 4.0)] {
///     model.set_grads(rank, &[Some(Tensor::from_f32(&[1], vec![g]).unwrap())]).unwrap();
/// }
/// assert!(diloco.step(&mut model).unwrap()); // synced: both ranks at the mean, 1 - 0.5·3
/// assert_eq!(model.param_blocking(1, 0).unwrap().values_f64().unwrap(), vec![-0.5]);
/// ```
#[derive(Debug)]
pub struct DiLoCo {
    inner: Box<dyn LocalOptimizer>,
    outer: Box<dyn LocalOptimizer>,
    world: Arc<dyn Communicator>,
    sync_every: u64,
    local_step: u64,
    /// Per replica group (storage format), every local rank's parameters at the last sync.
    backups: Vec<Arena>,
    ranks: usize,
    params: usize,
}

/// Copies every rank of `src` into `dst` (arenas of one layout) on the backend: device to
/// device on a GPU, host to host for host arenas.
fn copy_ranks(backend: &dyn Backend, src: &Arena, dst: &mut Arena) -> Result<()> {
    let regions: Vec<CopyRegion> = (0..src.ranks())
        .map(|rank| CopyRegion {
            src_rank: rank,
            src_offset: 0,
            dst_rank: rank,
            dst_offset: 0,
            len: src.rank_len(),
        })
        .collect();
    backend.copy_regions(src, dst, &regions)
}

impl DiLoCo {
    /// Wraps an inner and an outer optimizer built over `replicas` (this process's ranks of
    /// `world`), syncing every `sync_every` inner steps. The current parameters become the
    /// first sync point. A `ValueError` when `sync_every < 1` or when `replicas` does not hold
    /// the world's local ranks.
    pub fn new(
        replicas: &Replicas,
        inner: Box<dyn LocalOptimizer>,
        outer: Box<dyn LocalOptimizer>,
        sync_every: i64,
        world: Arc<dyn Communicator>,
    ) -> Result<DiLoCo> {
        Self::check_arguments(replicas, sync_every, world.as_ref())?;
        let backend = replicas.backend().clone();
        let mut backups = Vec::with_capacity(replicas.groups.len());
        for group in &replicas.groups {
            let mut backup = group.state_arena(backend.as_ref(), replicas.ranks())?;
            copy_ranks(backend.as_ref(), &group.params, &mut backup)?;
            backups.push(backup);
        }
        Ok(DiLoCo {
            inner,
            outer,
            world,
            sync_every: sync_every as u64,
            local_step: 0,
            backups,
            ranks: replicas.ranks(),
            params: replicas.len(),
        })
    }

    /// The checks [`DiLoCo::new`] makes before it builds anything: `sync_every >= 1`, and
    /// `replicas` holds `world`'s local ranks. A front end that must keep the optimizers when
    /// construction fails calls it before handing them over.
    pub fn check_arguments(
        replicas: &Replicas,
        sync_every: i64,
        world: &dyn Communicator,
    ) -> Result<()> {
        if sync_every < 1 {
            return Err(Error::value(format!(
                "sync_every must be a positive integer, got {sync_every}"
            )));
        }
        let local = world.local_ranks().len();
        if replicas.ranks() != local {
            return Err(Error::value(format!(
                "the replicas hold {} ranks, this process holds {local} ranks of a world of {}",
                replicas.ranks(),
                world.world_size()
            )));
        }
        Ok(())
    }

    /// The inner optimizer.
    pub fn inner(&self) -> &dyn LocalOptimizer {
        self.inner.as_ref()
    }

    /// The outer optimizer.
    pub fn outer(&self) -> &dyn LocalOptimizer {
        self.outer.as_ref()
    }

    /// Inner steps between syncs.
    pub fn sync_every(&self) -> u64 {
        self.sync_every
    }

    /// Inner steps taken since the last sync.
    pub fn local_step(&self) -> u64 {
        self.local_step
    }

    /// The inner optimizer's `zero_grad(set_to_none=True)`.
    pub fn zero_grad(&self, replicas: &mut Replicas) {
        self.inner.zero_grad(replicas);
    }

    /// One inner step on every rank (parameters without a gradient skipped), then a sync when
    /// `sync_every` inner steps have passed since the last one. Returns whether it synced.
    pub fn step(&mut self, replicas: &mut Replicas) -> Result<bool> {
        check_same_model(replicas, self.ranks, self.params)?;
        self.inner.step(replicas)?;
        self.local_step += 1;
        if self.local_step >= self.sync_every {
            self.sync(replicas)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// The outer step, now: every parameter's gradient becomes the world's mean of
    /// `backup - params` (computed and summed in the parameter's dtype), the parameters go back
    /// to the backup, the outer optimizer steps, the result becomes the new backup, and the
    /// gradients are cleared (`set_to_none`). Resets the local step counter.
    pub fn sync(&mut self, replicas: &mut Replicas) -> Result<()> {
        check_same_model(replicas, self.ranks, self.params)?;
        let backend = replicas.backend().clone();
        let groups = Subgroups::world(self.world.world_size());
        let bytes: Vec<u64> = replicas
            .groups
            .iter()
            .map(|g| {
                g.members
                    .iter()
                    .map(|&j| (replicas.numel(j) * replicas.dtype(j).size_bytes()) as u64)
                    .sum()
            })
            .collect();
        for ((group, backup), bytes) in replicas.groups.iter_mut().zip(&self.backups).zip(bytes) {
            backend.pseudo_gradient(&mut group.params, backup, &mut group.grads)?;
            let active = vec![true; group.members.len()];
            // The reference all-reduces each pseudo-gradient in its own dtype.
            self.world.all_reduce_mean(
                backend.as_ref(),
                &mut group.grads,
                groups,
                group.format,
                &group.starts,
                &active,
                bytes,
            )?;
        }
        for rank in 0..self.ranks {
            for j in 0..self.params {
                replicas.set_has_grad(rank, j, true);
            }
        }
        self.outer.step(replicas)?;
        for (group, backup) in replicas.groups.iter().zip(&mut self.backups) {
            copy_ranks(backend.as_ref(), &group.params, backup)?;
        }
        self.outer.zero_grad(replicas);
        self.local_step = 0;
        Ok(())
    }

    /// Rank `rank`'s (a local index) state: `{"inner_optimizer", "outer_optimizer",
    /// "local_step", "original_parameters"}` — both optimizers' `state_dict()`s, the inner
    /// steps since the last sync, and the parameters at the last sync, so that a run resumes
    /// exactly where it stopped (the model's current parameters are saved separately, as with
    /// any optimizer).
    pub async fn state_dict(&self, replicas: &Replicas, rank: usize) -> Result<Value> {
        check_same_model(replicas, self.ranks, self.params)?;
        let inner = self.inner.state_dict(replicas, rank).await?;
        let outer = self.outer.state_dict(replicas, rank).await?;
        let mut original = Vec::with_capacity(self.params);
        for j in 0..self.params {
            let backup = &self.backups[replicas.slots[j].group];
            let tensor = read_state(backup, replicas, rank, j).await?;
            original.push(tensor_to_json(&tensor).await?);
        }
        Ok(json!({
            "inner_optimizer": inner,
            "outer_optimizer": outer,
            "local_step": self.local_step,
            "original_parameters": original,
        }))
    }

    /// Blocking [`DiLoCo::state_dict`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn state_dict_blocking(&self, replicas: &Replicas, rank: usize) -> Result<Value> {
        pollster::block_on(self.state_dict(replicas, rank))
    }

    /// Loads rank `rank`'s (a local index) state saved by [`DiLoCo::state_dict`]: both
    /// optimizers, the local step counter and the parameters at the last sync.
    pub fn load_state_dict(
        &mut self,
        replicas: &mut Replicas,
        rank: usize,
        state_dict: &Value,
    ) -> Result<()> {
        check_same_model(replicas, self.ranks, self.params)?;
        if rank >= self.ranks {
            return Err(Error::new(
                crate::ErrorKind::IndexError,
                format!("rank {rank} out of range for {} ranks", self.ranks),
            ));
        }
        let field = |key: &str| {
            state_dict
                .get(key)
                .ok_or_else(|| Error::value(format!("DiLoCo state dict has no \"{key}\"")))
        };
        let (inner, outer) = (field("inner_optimizer")?, field("outer_optimizer")?);
        let local_step = field("local_step")?.as_u64().ok_or_else(|| {
            Error::value(format!(
                "\"local_step\" must be a non-negative integer, got {}",
                state_dict["local_step"]
            ))
        })?;
        let original = field("original_parameters")?
            .as_array()
            .ok_or_else(|| Error::value("\"original_parameters\" must be a list of tensors"))?;
        if original.len() != self.params {
            return Err(Error::value(format!(
                "\"original_parameters\" has {} tensors, the model has {} parameters",
                original.len(),
                self.params
            )));
        }
        let mut tensors = Vec::with_capacity(original.len());
        for (j, value) in original.iter().enumerate() {
            let tensor = tensor_from_json(value, &format!("original_parameters[{j}]"))?;
            let slot = &replicas.slots[j];
            if tensor.dtype() != slot.dtype || tensor.shape() != slot.shape.as_slice() {
                return Err(Error::value(format!(
                    "original_parameters[{j}] is {} {}, the parameter is {} {}",
                    tensor.dtype(),
                    crate::tensor::format_shape(tensor.shape()),
                    slot.dtype,
                    crate::tensor::format_shape(&slot.shape)
                )));
            }
            tensors.push(tensor);
        }
        self.inner.load_state_dict(replicas, rank, inner)?;
        self.outer.load_state_dict(replicas, rank, outer)?;
        for (j, tensor) in tensors.iter().enumerate() {
            let slot = &replicas.slots[j];
            write_state(&mut self.backups[slot.group], slot, rank, tensor)?;
        }
        self.local_step = local_step;
        Ok(())
    }
}
