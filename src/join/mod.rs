//! `torch.distributed.algorithms.Join`: training with uneven inputs. A rank that runs out of
//! inputs *joins*: it leaves its training loop and, until every rank has joined, runs the
//! *main hooks* of the participating [`Joinable`]s, which shadow the collectives of the ranks
//! that still train (so nobody waits forever in a collective); once all have joined, every
//! joinable's *post-hook* runs (DDP's broadcasts the final model from the last joiner).
//!
//! PyTorch runs one process per rank. Here one process may hold several ranks (the simulated
//! world holds them all), so the context runs in *lock-step*: at every global iteration the
//! caller tells the [`Join`] which of its local ranks still have an input
//! ([`Join::iteration`]); each joinable's per-iteration call (for example
//! [`DistributedDataParallel::synchronize_gradients`](crate::ddp::DistributedDataParallel::synchronize_gradients)
//! or [`ZeroRedundancyOptimizer::step`](crate::zero::ZeroRedundancyOptimizer::step)) then makes
//! one collective for all local ranks, in which the active ranks do their own work and the
//! joined ones run their main hook: the same pairing of collectives as in PyTorch, where the
//! two sides are different processes. [`Join::exit`] is the end of the `with` block: over a
//! one-rank-per-process world it runs the remaining shadow iterations until every process has
//! joined, then the post-hooks.
//!
//! ```
//! use distopt::BlockOn;
//! use std::sync::Arc;
//! use distopt::comm::SimulatedWorld;
//! use distopt::ddp::DistributedDataParallel;
//! use distopt::join::{Join, JoinOptions, Joinable};
//! use distopt::replicas::Replicas;
//! use distopt::{CpuBackend, Tensor};
//!
//! let world = Arc::new(SimulatedWorld::new(2).unwrap());
//! let p = Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap();
//! let mut model = Replicas::replicate(Arc::new(CpuBackend::new()), 2, &[p]).unwrap();
//! let mut ddp = DistributedDataParallel::new(world, &mut model).unwrap();
//! let mut join = Join::new(&mut [&mut ddp as &mut dyn Joinable], JoinOptions::default()).unwrap();
//! // Rank 0 has one input, rank 1 two.
//! for t in 0..2 {
//!     join.iteration(&[t < 1, true]).unwrap();
//!     for rank in 0..2 {
//!         if !join.joined()[rank] {
//!             let g = Tensor::from_f32(&[2], vec![4.0, 8.0]).unwrap();
//!             model.set_grads(rank, &[Some(g)]).unwrap();
//!         }
//!     }
//!     ddp.synchronize_gradients(&mut model).unwrap();
//! }
//! join.exit(&mut [&mut ddp as &mut dyn Joinable], &mut model).unwrap();
//! // At the second iteration rank 0 had joined: it contributed zeros, and the sum is still
//! // divided by the initial world size.
//! let g = model.all_grads().block_on().unwrap()[1][0].clone().unwrap();
//! assert_eq!(g.values_f64().unwrap(), vec![2.0, 4.0]);
//! ```

mod context;
mod manager;
mod messages;
mod options;

use std::sync::Arc;

pub(crate) use context::JoinContext;
pub use manager::Join;
pub use messages::{
    EARLY_TERMINATION, MULTIPLE_PROCESS_GROUPS, NO_JOINABLES, WARN_THRESHOLD, exhausted_message,
    skew_warning,
};
pub use options::JoinOptions;

use crate::backend::BackendInfo;
use crate::comm::{Communicator, Subgroups};
use crate::error::{RankErrors, Result};
use crate::replicas::Replicas;

/// The process group a joinable's collectives run on: a world and a partition of it (the
/// context needs the whole world).
#[derive(Debug, Clone)]
pub struct ProcessGroup {
    /// The world.
    pub world: Arc<dyn Communicator>,
    /// Its groups.
    pub groups: Subgroups,
}

impl ProcessGroup {
    /// The whole of `world` as one group.
    pub fn world(world: Arc<dyn Communicator>) -> ProcessGroup {
        let groups = Subgroups::world(world.world_size());
        ProcessGroup { world, groups }
    }
}

impl PartialEq for ProcessGroup {
    fn eq(&self, other: &ProcessGroup) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.world), Arc::as_ptr(&other.world))
            && self.groups == other.groups
    }
}

/// `_JoinConfig`: what a [`Join`] tells each of its joinables (the default is PyTorch's
/// `construct_disabled_join_config()`: outside any context).
#[derive(Debug, Clone, Default)]
pub struct JoinConfig {
    /// The context is enabled.
    pub enable: bool,
    /// The context raises when a rank runs out of inputs.
    pub throw_on_early_termination: bool,
    /// This joinable is the first one: its per-iteration call notifies the context.
    pub is_first_joinable: bool,
    /// The lock-step state shared by the context's joinables.
    pub(crate) context: Option<Arc<JoinContext>>,
}

impl JoinConfig {
    /// Per local rank: whether it has joined (always `false` outside an enabled context).
    pub fn joined(&self, local_ranks: usize) -> Vec<bool> {
        match &self.context {
            Some(context) if self.enable => context.joined(),
            _ => vec![false; local_ranks],
        }
    }
}

/// `JoinHook`: the two entry points a joinable gives the context. Both run for all local
/// ranks of a process at once.
pub trait JoinHook {
    /// One shadow iteration of ranks that have all joined: the collectives that pair with one
    /// training iteration of the ranks (in other processes) that still have inputs.
    ///
    /// # Errors
    /// The errors of the iteration it shadows (DDP's gradient all-reduce, ZeRO's step): a
    /// `ValueError` when `replicas` does not hold the local ranks, the collectives' and the
    /// backend's errors (a `RuntimeError` for a GPU error or a lost device). [`Join::exit`] reports
    /// them on every local rank.
    fn main_hook(&mut self, replicas: &mut Replicas) -> Result<()>;

    /// Runs once every rank has joined; `is_last_joiner[i]` says whether local rank i was
    /// among the last to join (it never shadowed an iteration).
    ///
    /// # Errors
    /// DDP's: a `ValueError` when `replicas` does not hold the local ranks or when no rank was
    /// among the last joiners ([`NO_COMMON_RANK`](crate::ddp::NO_COMMON_RANK)), and the errors of
    /// the final broadcast; ZeRO's never fails. [`Join::exit`] reports them on every local rank.
    fn post_hook(&mut self, replicas: &mut Replicas, is_last_joiner: &[bool]) -> Result<()>;
}

/// `Joinable`: a class whose per-iteration collectives a [`Join`] can shadow.
pub trait Joinable {
    /// `join_hook(**kwargs)`: this joinable's hook, configured by the context's options
    /// (every joinable of a context gets the same ones).
    fn join_hook(&mut self, options: &JoinOptions) -> Box<dyn JoinHook + '_>;

    /// `join_device`: where the context's own collectives run.
    fn join_device(&self) -> BackendInfo;

    /// `join_process_group`: the group of the context's own collectives.
    fn join_process_group(&self) -> ProcessGroup;

    /// The configuration the context set (`_join_config`).
    fn join_config(&self) -> &JoinConfig;

    /// Sets the configuration (called by [`Join::new`]).
    fn set_join_config(&mut self, config: JoinConfig);
}

/// `Join.notify_join_context(joinable)`: a joinable's per-iteration call runs this first.
/// Only the first joinable of an enabled context communicates: the all-reduce in which each
/// local rank that still has inputs counts itself (and the joined ranks, at the top of their
/// shadow loop, count nothing), and with `throw_on_early_termination` the all-reduce that
/// makes every rank raise once one has run out of inputs. Returns the number of ranks with
/// inputs (the world's), or `None` when this joinable does not communicate.
///
/// # Errors
/// Only for the first joinable of an enabled context, per local rank: a `RuntimeError` on every
/// rank when the context has ended, and the all-reduce's errors on every rank; with
/// `throw_on_early_termination`, once some rank has run out of inputs, [`EARLY_TERMINATION`] on the
/// local ranks with inputs and [`exhausted_message`] on the joined ones (the context ends).
pub fn notify_join_context(config: &JoinConfig) -> Result<Option<usize>, RankErrors> {
    if !config.is_first_joinable || !config.enable {
        return Ok(None);
    }
    match &config.context {
        Some(context) => context.notify().map(Some),
        None => Ok(None),
    }
}
