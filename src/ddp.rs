//! `torch.nn.parallel.DistributedDataParallel`'s gradient synchronization over replicas: after
//! every rank's backward pass (here: once each rank's local gradients are set), every
//! gradient is multiplied by `fl(1/D)` and summed over the ranks (DDP's reducer), and DDP is a
//! [`Joinable`]: with uneven inputs, joined ranks shadow the all-reduce with zeros and keep
//! their own gradients, and at the end the final model is broadcast from the last joiner.

use std::sync::Arc;

use crate::backend::{Backend, BackendInfo};
use crate::comm::{AllReduceScaledSumArgs, Communicator, all_gather_f64};
use crate::error::{Error, RankErrors, Result};
use crate::join::{JoinConfig, JoinHook, JoinOptions, Joinable, ProcessGroup, notify_join_context};
use crate::replicas::{Replicas, Values};

/// The `ValueError` of `_find_common_rank` when no rank qualifies.
pub const NO_COMMON_RANK: &str = "BUG! Expected rank_cond to be true for at least one process. This indicates a bug in PyTorch, please report an issue.";

/// DDP over the local ranks of `world` (the model is the [`Replicas`] passed to each call).
#[derive(Debug)]
pub struct DistributedDataParallel {
    world: Arc<dyn Communicator>,
    backend: Arc<dyn Backend>,
    divide_by_initial_world_size: bool,
    join_config: JoinConfig,
}

impl DistributedDataParallel {
    /// Wraps the model held by `replicas` (one replica per local rank of `world`) and, as
    /// DDP's constructor does, broadcasts rank 0's parameters to every rank.
    ///
    /// # Errors
    /// A `ValueError` when `replicas` does not hold one replica per local rank of `world`; the
    /// broadcast's errors ([`Communicator::broadcast`]: a `RuntimeError` for a GPU error or a lost
    /// device).
    pub fn new(
        world: Arc<dyn Communicator>,
        replicas: &mut Replicas,
    ) -> Result<DistributedDataParallel> {
        replicas.check_local_ranks(world.as_ref())?;
        replicas.broadcast_params(world.as_ref(), 0)?;
        Ok(DistributedDataParallel {
            world,
            backend: replicas.backend().clone(),
            divide_by_initial_world_size: true,
            join_config: JoinConfig::default(),
        })
    }

    /// The world.
    pub fn world(&self) -> &Arc<dyn Communicator> {
        &self.world
    }

    /// Whether a join context divides the gradient sum by the initial world size (its
    /// `divide_by_initial_world_size`; `true` outside a context).
    pub fn divide_by_initial_world_size(&self) -> bool {
        self.divide_by_initial_world_size
    }

    fn check(&self, replicas: &Replicas) -> Result<()> {
        if replicas.ranks() != self.world.local_ranks().len() {
            return Err(Error::value(format!(
                "this DistributedDataParallel holds {} ranks, the replicas {}",
                self.world.local_ranks().len(),
                replicas.ranks()
            )));
        }
        Ok(())
    }

    /// The gradient synchronization of the backward pass, for every local rank at once; call
    /// it once the ranks' local gradients are set. Every rank with inputs gets, for every
    /// parameter, `Σ_r fl(G_r · fl(1/D))` over the ranks with inputs (an absent gradient
    /// counts as zeros, and afterwards every such rank has every gradient), where `D` is the
    /// world size, or, in a join context with `divide_by_initial_world_size=False` of which
    /// DDP is the first joinable, the number of ranks with inputs. In a join context the
    /// local ranks that have joined run DDP's main hook instead: they contribute zeros and
    /// keep their own gradients. Errors are each rank's (with `throw_on_early_termination`
    /// they differ between active and joined ranks).
    ///
    /// # Errors
    /// Per local rank: a `ValueError` on every rank when `replicas` does not hold the local ranks;
    /// in a join context, a `RuntimeError` on every rank when the context has ended, and with
    /// `throw_on_early_termination`, once some rank has run out of inputs, the `RuntimeError`s of
    /// [`notify_join_context`] ([`crate::join::EARLY_TERMINATION`] on the ranks with inputs,
    /// [`crate::join::exhausted_message`] on the joined ones); the collectives' and the backend's
    /// errors on every rank (a `RuntimeError` for a GPU error or a lost device).
    pub fn synchronize_gradients(&mut self, replicas: &mut Replicas) -> Result<(), RankErrors> {
        let local = self.world.local_ranks();
        let all = |e: Error| RankErrors::all(local.clone(), e);
        self.check(replicas).map_err(all)?;
        // The forward pass: `Join.notify_join_context(self)`.
        let active = notify_join_context(&self.join_config)?;
        let joined = self.join_config.joined(local.len());
        if self.join_config.enable {
            // `_check_global_requires_backward_grad_sync`: every rank with inputs syncs.
            let flags: Vec<Vec<f32>> = joined
                .iter()
                .map(|&j| vec![if j { 0.0 } else { 1.0 }])
                .collect();
            let syncing = self.world.all_reduce_sum_f32(&flags).map_err(all)?[0];
            if syncing == 0.0 {
                return Ok(());
            }
        }
        let divisor = match active {
            Some(active) if !self.divide_by_initial_world_size => active,
            _ => self.world.world_size(),
        };
        self.all_reduce(replicas, &joined, divisor).map_err(all)
    }

    /// The bucket all-reduce: the ranks not `joined` contribute their gradients times
    /// `1/divisor` and receive the sum; the joined ones contribute zeros.
    fn all_reduce(&self, replicas: &mut Replicas, joined: &[bool], divisor: usize) -> Result<()> {
        // The reducer multiplies by the double `1 / div_factor`; the kernel takes it in the
        // compute precision, as `mul_out` of a float tensor and a wrapped double does.
        let scale = 1.0 / divisor.max(1) as f64;
        let scales: Vec<Option<f64>> = joined.iter().map(|&j| (!j).then_some(scale)).collect();
        let ranks = replicas.ranks();
        let backend = self.backend.clone();
        let present: Vec<Vec<bool>> = replicas
            .buckets()
            .iter()
            .map(|bucket| {
                (0..ranks)
                    .flat_map(|rank| bucket.members().iter().map(move |&j| (rank, j)))
                    .map(|(rank, j)| replicas.has_grad(rank, j))
                    .collect()
            })
            .collect();
        let bytes: Vec<u64> = replicas
            .buckets()
            .iter()
            .map(|b| {
                b.members()
                    .iter()
                    .map(|&j| (replicas.numel(j) * replicas.dtype(j).size_bytes()) as u64)
                    .sum()
            })
            .collect();
        for ((bucket, present), bytes) in replicas.buckets_mut().iter_mut().zip(present).zip(bytes)
        {
            let reduced = vec![true; bucket.members().len()];
            // The bucket's dtype is the parameters': its products and sums round to it.
            let arith = bucket.format();
            let (arena, starts) = bucket.arena_with_starts(Values::Grads);
            self.world.all_reduce_scaled_sum(
                backend.as_ref(),
                arena,
                AllReduceScaledSumArgs {
                    arith,
                    starts,
                    reduced: &reduced,
                    scales: &scales,
                    present: &present,
                    bytes_per_rank: bytes,
                },
            )?;
        }
        // The reducer writes every bucket view back into `.grad` on the ranks that synced.
        for (rank, _) in joined.iter().enumerate().filter(|(_, j)| !**j) {
            for j in 0..replicas.len() {
                replicas.set_has_grad(rank, j, true);
            }
        }
        Ok(())
    }

    /// `_sync_final_model`: the largest rank among the last joiners broadcasts the model.
    fn sync_final_model(&self, replicas: &mut Replicas, is_last_joiner: &[bool]) -> Result<()> {
        let first = self.world.local_ranks().start;
        let candidates: Vec<Vec<f64>> = is_last_joiner
            .iter()
            .enumerate()
            .map(|(i, &last)| vec![if last { (first + i) as f64 } else { -1.0 }])
            .collect();
        let all = all_gather_f64(self.world.as_ref(), &candidates)?;
        let root = all.iter().flatten().copied().fold(-1.0, f64::max);
        if root < 0.0 {
            return Err(Error::value(NO_COMMON_RANK));
        }
        replicas.broadcast_params(self.world.as_ref(), root as usize)
    }
}

/// DDP's join hook (`_DDPJoinHook`).
struct DdpJoinHook<'a> {
    ddp: &'a mut DistributedDataParallel,
}

impl JoinHook for DdpJoinHook<'_> {
    /// Shadows the forward pass's all-reduce (whether the active ranks sync) and, if they do,
    /// the gradient all-reduce with zeros.
    fn main_hook(&mut self, replicas: &mut Replicas) -> Result<()> {
        self.ddp.check(replicas)?;
        let local = replicas.ranks();
        let syncing = self
            .ddp
            .world
            .all_reduce_sum_f32(&vec![vec![0f32]; local])?[0];
        if syncing == 0.0 {
            return Ok(());
        }
        self.ddp.all_reduce(replicas, &vec![true; local], 1)
    }

    fn post_hook(&mut self, replicas: &mut Replicas, is_last_joiner: &[bool]) -> Result<()> {
        self.ddp.check(replicas)?;
        self.ddp.sync_final_model(replicas, is_last_joiner)
    }
}

impl Joinable for DistributedDataParallel {
    /// Records `divide_by_initial_world_size`.
    fn join_hook(&mut self, options: &JoinOptions) -> Box<dyn JoinHook + '_> {
        self.divide_by_initial_world_size = options.divide_by_initial_world_size;
        Box::new(DdpJoinHook { ddp: self })
    }

    fn join_device(&self) -> BackendInfo {
        self.backend.info().clone()
    }

    fn join_process_group(&self) -> ProcessGroup {
        ProcessGroup::world(self.world.clone())
    }

    fn join_config(&self) -> &JoinConfig {
        &self.join_config
    }

    fn set_join_config(&mut self, config: JoinConfig) {
        self.join_config = config;
    }
}
