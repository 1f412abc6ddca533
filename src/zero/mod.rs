//! `ZeroRedundancyOptimizer`: optimizer state sharded over the ranks. Parameters are assigned
//! to ranks by PyTorch's sorted-greedy partition; each rank's local optimizer holds state only
//! for the parameters it owns (its own, 1/W-sized arenas), updates them from that rank's own
//! gradients, and the updated parameters are then broadcast from their owners to every rank.

pub mod args;
mod join;
mod partition;

use std::sync::Arc;

use serde_json::{Map, Value, json};

pub use partition::{Partition, partition};

use crate::backend::Backend;
use crate::comm::{BroadcastRegion, Communicator, local_index};
use crate::error::{Error, ErrorKind, RankErrors, Result};
use crate::join::{JoinConfig, notify_join_context};
use crate::optim::{self, LocalOptimizer, OptimizerKind, OptionMap};
use crate::replicas::{Replicas, Values, check_param_index};
use crate::warnings::{self, Warning};
use args::{ParamsArg, TensorArg};

/// The optimizer classes ZeRO knows by name, with PyTorch's class repr.
fn class_repr(name: &str) -> String {
    if let Ok(kind) = name.parse::<OptimizerKind>() {
        return format!("<class '{}'>", kind.class_path());
    }
    let path = match name {
        "NAdam" => "torch.optim.nadam.NAdam",
        "RAdam" => "torch.optim.radam.RAdam",
        "Adagrad" => "torch.optim.adagrad.Adagrad",
        "RMSprop" => "torch.optim.rmsprop.RMSprop",
        "_FunctionalSGD" => "torch.distributed.optim.functional_sgd._FunctionalSGD",
        "_FunctionalAdam" => "torch.distributed.optim.functional_adam._FunctionalAdam",
        "_FunctionalAdamW" => "torch.distributed.optim.functional_adamw._FunctionalAdamW",
        other => return format!("<class '{other}'>"),
    };
    format!("<class '{path}'>")
}

/// The message of `step()` with `overlap_with_ddp=True`.
pub const OVERLAP_STEP_WARNING: &str =
    "`step()` should not be included in the training loop when `overlap_with_ddp=True`";
/// The message of `parameters_as_bucket_view` with `overlap_with_ddp=True`.
pub const OVERLAP_BUCKET_WARNING: &str = "`parameters_as_bucket_view=True` will be ignored since `overlap_with_ddp=True`; instead, a different bucketing strategy will be used";
/// The message of a step after a parameter's `requires_grad` changed.
pub const TRAINABILITY_WARNING: &str = "ZeroRedundancyOptimizer detected that the trainable parameters changed; rebuilding the parameter buckets if enabled";

fn not_initialized() -> Error {
    Error::runtime(
        "This method should not be called until this ZeroRedundancyOptimizer instance has been fully initialized",
    )
}

fn not_consolidated(rank: usize) -> Error {
    Error::runtime(format!(
        "Optimizer state has not been consolidated on this rank. Please call `consolidate_state_dict(to={rank})` on all ranks beforehand if you meant to save the global state."
    ))
}

/// Construction options beyond the parameters and the local optimizer. Build them with
/// `ZeroOptions::default().with_…(..)` (the struct may gain fields).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZeroOptions {
    /// Pack each rank's parameters into one flat bucket, broadcast as one transfer.
    pub parameters_as_bucket_view: bool,
    /// Overlap the optimizer with DDP's backward (needs DDP buckets; without DDP the instance
    /// never finishes initializing, as in PyTorch).
    pub overlap_with_ddp: bool,
}

impl ZeroOptions {
    /// With `parameters_as_bucket_view` set to `on`.
    pub fn with_parameters_as_bucket_view(mut self, on: bool) -> Self {
        self.parameters_as_bucket_view = on;
        self
    }

    /// With `overlap_with_ddp` set to `on`.
    pub fn with_overlap_with_ddp(mut self, on: bool) -> Self {
        self.overlap_with_ddp = on;
        self
    }
}

/// One rank's shard: the parameters it owns (its [`Ownership`]), packed in a one-rank arena
/// (its bucket), and its local optimizer over them.
#[derive(Debug)]
struct Shard {
    params: Replicas,
    optim: Box<dyn LocalOptimizer>,
}

/// The local optimizer's class (a functional optimizer computes as its class does), after
/// PyTorch's checks of a functional optimizer against `overlap_with_ddp`.
fn local_class(optimizer: &str, options: ZeroOptions) -> Result<OptimizerKind> {
    let functional = optimizer.starts_with("_Functional");
    if !options.overlap_with_ddp && functional {
        return Err(Error::value(format!(
            "Passing in a functional optimizer {} when `overlap_with_ddp=False`",
            class_repr(optimizer)
        )));
    }
    if options.overlap_with_ddp && !functional && optimizer.parse::<OptimizerKind>().is_err() {
        return Err(Error::value(format!(
            "Using `ddp_with_overlap=True` requires using a functional optimizer, but there is no supported functional optimizer equivalent for {}",
            class_repr(optimizer)
        )));
    }
    optimizer
        .strip_prefix("_Functional")
        .unwrap_or(optimizer)
        .parse()
}

/// Rank `rank`'s local optimizer's warning for each group in `groups` that holds a tensor
/// twice (PyTorch's `add_param_group` warns once per group).
fn warn_duplicates(rank: usize, groups: &[usize]) {
    for _ in groups {
        warnings::emit(Warning::user(args::DUPLICATE_WARNING).on_ranks([rank]));
    }
}

/// What one rank owns: its parameters (global indices, distinct, in `params_per_rank` order;
/// the `k`-th is parameter `k` of its shard). Known for every rank of the world, so that a
/// process can take part in the broadcast of a shard it does not hold.
#[derive(Debug, Clone)]
struct Ownership {
    global: Vec<usize>,
}

/// `torch.distributed.optim.ZeroRedundancyOptimizer` over a world of ranks: the shards of the
/// ranks this process holds (all of them in the simulated world, its own over MPI).
#[derive(Debug)]
pub struct ZeroRedundancyOptimizer {
    world: Arc<dyn Communicator>,
    /// The backend of the replicas it was built for (the join device).
    backend: Arc<dyn Backend>,
    /// The local optimizers' class.
    optimizer: OptimizerKind,
    defaults: OptionMap,
    options: ZeroOptions,
    /// Global parameter groups: replica indices and each group's full options.
    groups: Vec<(Vec<usize>, OptionMap)>,
    /// Every parameter's replica index, by global index.
    global: Vec<usize>,
    partition: Option<Partition>,
    /// Every world rank's parameters.
    ownership: Vec<Ownership>,
    /// The shards of the local ranks, in local rank order: local rank i's is owned by world
    /// rank `local_ranks().start + i`.
    shards: Vec<Shard>,
    /// `requires_grad` by replica index, and the mask the buckets were built for.
    trainable: Vec<bool>,
    bucket_trainable: Vec<bool>,
    /// The rank holding the consolidated state dict, and the dict.
    consolidated: Option<(usize, Value)>,
    /// Set by a join context (`_join_config`).
    join_config: JoinConfig,
}

impl ZeroRedundancyOptimizer {
    /// ZeRO over `groups` (replica indices of `replicas`, each with its own options over
    /// `defaults`), with local optimizers of class `optimizer` (`"SGD"`, `"Adam"`, `"AdamW"`).
    /// Its warnings are every local rank's.
    ///
    /// # Errors
    /// A `ValueError` when a parameter is in two groups, `replicas` does not hold the world's local
    /// ranks, every group is empty, the parameters differ in dtype, or the optimizer does not suit
    /// `overlap_with_ddp` (a `_Functional…` class without it, a class with no functional form with
    /// it); an `IndexError` for an index outside the replicas; the local optimizers' constructor
    /// errors ([`optim::build`]: a `ValueError` for an unknown class or an invalid hyper-parameter,
    /// a `TypeError` for an unknown keyword); a `RuntimeError` when a shard does not fit the memory
    /// budget or the backend fails.
    pub fn new(
        world: Arc<dyn Communicator>,
        replicas: &Replicas,
        groups: Vec<(Vec<usize>, OptionMap)>,
        optimizer: &str,
        defaults: &OptionMap,
        options: ZeroOptions,
    ) -> Result<Self> {
        let local = world.local_ranks();
        warnings::with_ranks(local, || {
            // `Optimizer.add_param_group`'s checks, group by group, as `from_params` makes
            // them through `args::validate`.
            let mut seen: Vec<usize> = Vec::new();
            for (params, _) in &groups {
                let mut unique = params.clone();
                unique.sort_unstable();
                unique.dedup();
                if unique.len() != params.len() {
                    warnings::warn(optim::DUPLICATE_WARNING);
                }
                if unique.iter().any(|j| seen.contains(j)) {
                    return Err(Error::value(
                        "some parameters appear in more than one parameter group",
                    ));
                }
                seen.extend(unique);
            }
            Self::construct(world, replicas, groups, optimizer, defaults, options)
        })
    }

    /// `ZeroRedundancyOptimizer(params, optimizer_class, …)` with `params` as a dynamic front
    /// end passes it: PyTorch's checks of the argument (with its errors and its duplicate
    /// parameter warning), then the construction. `resolve` gives the replica index of each
    /// tensor of `params` (`None` for a tensor that is not one of the replicas' parameters,
    /// such as a meta or sparse tensor). A failure is every local rank's, as every rank runs
    /// the constructor.
    ///
    /// # Errors
    /// On every local rank, the same: the `TypeError`s and `ValueError`s of [`args::validate`], a
    /// `ValueError` for a tensor `resolve` does not know, then the errors of
    /// [`ZeroRedundancyOptimizer::new`] after its duplicate check.
    pub fn from_params(
        world: Arc<dyn Communicator>,
        replicas: &Replicas,
        params: &ParamsArg,
        resolve: &dyn Fn(&TensorArg) -> Option<usize>,
        optimizer: &str,
        defaults: &OptionMap,
        options: ZeroOptions,
    ) -> Result<Self, RankErrors> {
        let local = world.local_ranks();
        warnings::with_ranks(local.clone(), || {
            let groups = args::validate(params)?
                .into_iter()
                .map(|(tensors, group_options)| {
                    let indices = tensors
                        .iter()
                        .map(|t| {
                            resolve(t).ok_or_else(|| {
                                // PyTorch takes a meta tensor; distopt has no data to give
                                // it, and says so once PyTorch's own checks have passed.
                                Self::check_local_optimizer(replicas, optimizer, defaults, options)
                                    .err()
                                    .unwrap_or_else(|| Error::value(format!(
                                        "tensor {} ({}) is not a parameter of the replicas: it has no data to optimize",
                                        t.id,
                                        t.typename()
                                    )))
                            })
                        })
                        .collect::<Result<Vec<usize>>>()?;
                    Ok((indices, group_options))
                })
                .collect::<Result<Vec<_>>>()?;
            Self::construct(world, replicas, groups, optimizer, defaults, options)
        })
        .map_err(|e| RankErrors::all(local, e))
    }

    fn construct(
        world: Arc<dyn Communicator>,
        replicas: &Replicas,
        groups: Vec<(Vec<usize>, OptionMap)>,
        optimizer: &str,
        defaults: &OptionMap,
        options: ZeroOptions,
    ) -> Result<Self> {
        replicas.check_local_ranks(world.as_ref())?;
        if groups.iter().all(|(g, _)| g.is_empty()) {
            return Err(Error::value(
                "ZeroRedundancyOptimizer got an empty parameter list",
            ));
        }
        for &j in groups.iter().flat_map(|(g, _)| g) {
            check_param_index(j, replicas.len())?;
        }
        let dtype = replicas.dtype(
            groups
                .iter()
                .flat_map(|(g, _)| g)
                .copied()
                .next()
                .unwrap_or(0),
        );
        for &j in groups.iter().flat_map(|(g, _)| g) {
            if replicas.dtype(j) != dtype {
                return Err(args::mixed_dense_types(dtype, replicas.dtype(j)));
            }
        }
        let kind = local_class(optimizer, options)?;
        let global: Vec<usize> = groups.iter().flat_map(|(g, _)| g.iter().copied()).collect();
        let mut zero = ZeroRedundancyOptimizer {
            world,
            backend: replicas.backend().clone(),
            optimizer: kind,
            defaults: defaults.clone(),
            options,
            groups,
            global,
            partition: None,
            ownership: Vec::new(),
            shards: Vec::new(),
            trainable: vec![true; replicas.len()],
            bucket_trainable: vec![true; replicas.len()],
            consolidated: None,
            join_config: JoinConfig::default(),
        };
        if options.overlap_with_ddp {
            if options.parameters_as_bucket_view {
                warnings::emit(Warning::logged(OVERLAP_BUCKET_WARNING));
            }
        } else {
            zero.build_shards(replicas, Vec::new(), 0)?;
        }
        Ok(zero)
    }

    /// What PyTorch's constructor raises after its parameter checks: [`local_class`]'s errors,
    /// then (without `overlap_with_ddp`) the local optimizer's own checks of `defaults`.
    fn check_local_optimizer(
        replicas: &Replicas,
        optimizer: &str,
        defaults: &OptionMap,
        options: ZeroOptions,
    ) -> Result<()> {
        let kind = local_class(optimizer, options)?;
        if !options.overlap_with_ddp {
            optim::build(
                kind,
                replicas,
                vec![(Vec::new(), OptionMap::new())],
                defaults,
            )?;
        }
        Ok(())
    }

    fn initialized(&self) -> Result<&Partition> {
        self.partition.as_ref().ok_or_else(not_initialized)
    }

    /// Partitions the parameters and creates every local rank's shard and local optimizer.
    /// Shards that already exist keep their state (parameters keep their ranks when groups are
    /// added). `saved[i]` is local rank i's optimizer state dict to carry over. The groups from
    /// index `new_groups` on are new: only their duplicate parameters warn (PyTorch's
    /// `add_param_group` hands its local optimizer the new group alone).
    fn build_shards(
        &mut self,
        replicas: &Replicas,
        saved: Vec<Option<Value>>,
        new_groups: usize,
    ) -> Result<()> {
        let numels: Vec<Vec<usize>> = self
            .groups
            .iter()
            .map(|(g, _)| g.iter().map(|&j| replicas.numel(j)).collect())
            .collect();
        let partition = partition(self.world.world_size(), &numels);
        let local = self.world.local_ranks();
        let mut shards = Vec::with_capacity(local.len());
        let mut ownership = Vec::with_capacity(partition.params_per_rank.len());
        for (rank, per_group) in partition.params_per_rank_per_group.iter().enumerate() {
            let mut global: Vec<usize> = Vec::new();
            let mut local_groups: Vec<Vec<usize>> = Vec::new();
            // The new groups with a tensor twice on this rank: its local optimizer warns once
            // for each, after checking its options (PyTorch's constructor checks them before
            // `add_param_group`).
            let mut duplicates_in: Vec<usize> = Vec::new();
            for (g, group) in per_group.iter().enumerate() {
                let mut local = Vec::new();
                for &i in group {
                    // A parameter passed twice is one tensor: one slot in the shard, and the
                    // local optimizer warns about the duplicate as PyTorch's does.
                    let k = match global
                        .iter()
                        .position(|&g| self.global[g] == self.global[i])
                    {
                        Some(k) => k,
                        None => {
                            global.push(i);
                            global.len() - 1
                        }
                    };
                    if local.contains(&k) {
                        if g >= new_groups && !duplicates_in.contains(&g) {
                            duplicates_in.push(g);
                        }
                    } else {
                        local.push(k);
                    }
                }
                local_groups.push(local);
            }
            ownership.push(Ownership {
                global: global.clone(),
            });
            let Some(index) = local_index(self.world.as_ref(), rank) else {
                continue;
            };
            // Values are gathered from the rank's replica at every step; zeros will do here.
            let templates: Vec<crate::Tensor> = global
                .iter()
                .map(|&i| {
                    let j = self.global[i];
                    crate::Tensor::from_f64(
                        replicas.dtype(j),
                        replicas.shape(j),
                        &vec![0.0; replicas.numel(j)],
                    )
                })
                .collect::<Result<_>>()?;
            let params = Replicas::replicate(replicas.backend().clone(), 1, &templates)?;
            let previous = self
                .shards
                .get(index)
                .zip(self.ownership.get(rank))
                .zip(saved.get(index).cloned().flatten());
            let optim = match previous {
                Some(((old, owned), saved))
                    if owned.global.len() <= global.len()
                        && owned.global[..] == global[..owned.global.len()] =>
                {
                    // Same leading parameters: migrate the old optimizer's state.
                    let old_groups = old.optim.param_groups().len();
                    let mut optim = optim::build(
                        self.optimizer,
                        &params,
                        local_groups[..old_groups]
                            .iter()
                            .zip(&self.groups)
                            .map(|(g, (_, o))| (g.clone(), o.clone()))
                            .collect(),
                        &self.defaults,
                    )?;
                    let mut params_mut = params;
                    optim.load_state_dict(&mut params_mut, 0, &saved)?;
                    for (g, (_, o)) in local_groups.iter().zip(&self.groups).skip(old_groups) {
                        optim.add_param_group(g.clone(), o)?;
                    }
                    warn_duplicates(rank, &duplicates_in);
                    shards.push(Shard {
                        params: params_mut,
                        optim,
                    });
                    continue;
                }
                _ => optim::build(
                    self.optimizer,
                    &params,
                    local_groups
                        .iter()
                        .zip(&self.groups)
                        .map(|(g, (_, o))| (g.clone(), o.clone()))
                        .collect(),
                    &self.defaults,
                )?,
            };
            warn_duplicates(rank, &duplicates_in);
            shards.push(Shard { params, optim });
        }
        self.shards = shards;
        self.ownership = ownership;
        self.partition = Some(partition);
        Ok(())
    }

    /// The partition (`None` until initialized, i.e. with `overlap_with_ddp`).
    pub fn partition(&self) -> Option<&Partition> {
        self.partition.as_ref()
    }

    /// The owner of each replica parameter that ZeRO optimizes (`None` for the others). A
    /// parameter passed more than once goes to the highest rank holding a copy: PyTorch's
    /// `_param_to_rank` is filled rank by rank from the partition, the last write winning.
    pub fn rank_of_replica_param(&self, replicas: &Replicas) -> Vec<Option<usize>> {
        let mut out: Vec<Option<usize>> = vec![None; replicas.len()];
        if let Some(p) = &self.partition {
            for (i, &rank) in p.rank_of_param.iter().enumerate() {
                let owner = &mut out[self.global[i]];
                *owner = Some(owner.map_or(rank, |r| r.max(rank)));
            }
        }
        out
    }

    /// The global parameter groups (replica indices).
    pub fn param_groups(&self) -> Vec<Vec<usize>> {
        self.groups.iter().map(|(g, _)| g.clone()).collect()
    }

    /// Sets `requires_grad` of replica parameter `j`. With `parameters_as_bucket_view`, frozen
    /// parameters are left out of the buckets from the next step on (and not broadcast).
    pub fn set_requires_grad(&mut self, j: usize, requires_grad: bool) {
        if let Some(t) = self.trainable.get_mut(j) {
            *t = requires_grad;
        }
    }

    /// `zero_grad(set_to_none=True)`.
    pub fn zero_grad(&self, replicas: &mut Replicas) {
        replicas.zero_grad();
    }

    /// One ZeRO step: every local rank's optimizer updates the parameters it owns from its own
    /// gradients, then each rank's updated parameters are broadcast to every rank (one
    /// transfer per rank with `parameters_as_bucket_view`, one per parameter otherwise), with
    /// each local rank's error (`?` turns it into the lowest local rank's). In a join context of
    /// which ZeRO is the first joinable it notifies the context first; local ranks that have
    /// joined run ZeRO's main hook, which is this same step (their broadcasts pair with the
    /// active ranks'), with the gradients they still hold.
    ///
    /// # Errors
    /// Per local rank: the join notification's errors ([`notify_join_context`]: a `RuntimeError`
    /// when the context has ended, and with `throw_on_early_termination` each rank's `RuntimeError`
    /// once a rank has run out of inputs); then, the same on every rank: a `ValueError` when
    /// `replicas` has other ranks or parameters than ZeRO was built for, the local optimizers'
    /// errors ([`LocalOptimizer::step`]), and the copies' and broadcasts' errors (a `RuntimeError`
    /// for a GPU error or a lost device). With `overlap_with_ddp` it only warns.
    pub fn step(&mut self, replicas: &mut Replicas) -> Result<(), RankErrors> {
        let local = self.world.local_ranks();
        if self.options.overlap_with_ddp {
            warnings::emit(Warning::logged(OVERLAP_STEP_WARNING).on_ranks(local));
            return Ok(());
        }
        notify_join_context(&self.join_config)?;
        warnings::with_ranks(local.clone(), || self.local_step(replicas))
            .map_err(|e| RankErrors::all(local, e))
    }

    /// The step after the join notification (`_local_step` and `_sync_params`).
    fn local_step(&mut self, replicas: &mut Replicas) -> Result<()> {
        if self.options.overlap_with_ddp {
            warnings::emit(Warning::logged(OVERLAP_STEP_WARNING));
            return Ok(());
        }
        if self.trainable != self.bucket_trainable {
            warnings::emit(Warning::logged(TRAINABILITY_WARNING));
            self.bucket_trainable = self.trainable.clone();
        }
        self.initialized()?;
        if replicas.ranks() != self.world.local_ranks().len()
            || replicas.len() != self.trainable.len()
        {
            return Err(Error::value(format!(
                "this ZeroRedundancyOptimizer was built for {} ranks of {} parameters, not {} ranks of {}",
                self.world.local_ranks().len(),
                self.trainable.len(),
                replicas.ranks(),
                replicas.len()
            )));
        }
        let first = self.world.local_ranks().start;
        for (index, shard) in self.shards.iter_mut().enumerate() {
            let owned = &self.ownership[first + index].global;
            if owned.is_empty() {
                continue;
            }
            // Gather this rank's own copy of its parameters and gradients into its shard.
            let pairs: Vec<(usize, usize)> = owned
                .iter()
                .enumerate()
                .map(|(k, &i)| (self.global[i], k))
                .collect();
            replicas.copy_to(Values::Params, index, &mut shard.params, 0, &pairs)?;
            replicas.copy_to(Values::Grads, index, &mut shard.params, 0, &pairs)?;
            for (k, &i) in owned.iter().enumerate() {
                let has = replicas.has_grad(index, self.global[i]);
                shard.params.set_has_grad(0, k, has);
            }
            shard.optim.step(&mut shard.params)?;
        }
        self.sync_params(replicas)
    }

    /// `step(closure)`: calls `closure` once (it may recompute gradients), then steps; returns
    /// the closure's loss.
    ///
    /// # Errors
    /// The closure's error (before any step), then as [`ZeroRedundancyOptimizer::step`]. With
    /// `overlap_with_ddp` the closure is not called and nothing fails.
    pub fn step_with_closure(
        &mut self,
        replicas: &mut Replicas,
        closure: impl FnOnce(&mut Replicas) -> Result<f64>,
    ) -> Result<Option<f64>> {
        if self.options.overlap_with_ddp {
            let local = self.world.local_ranks();
            warnings::emit(Warning::logged(OVERLAP_STEP_WARNING).on_ranks(local));
            return Ok(None);
        }
        let loss = closure(replicas)?;
        self.step(replicas)?;
        Ok(Some(loss))
    }

    /// Writes every local rank's updated parameters back to its own replica, then broadcasts
    /// every rank's to the other ranks (with bucket view: its trainable parameters as one
    /// bucket). Each process takes part in every broadcast, as sender or receiver.
    fn sync_params(&self, replicas: &mut Replicas) -> Result<()> {
        let backend = replicas.backend().clone();
        for (rank, owner) in self.ownership.iter().enumerate() {
            let shard = local_index(self.world.as_ref(), rank).map(|i| (i, &self.shards[i]));
            let owned: Vec<(usize, usize)> = owner
                .global
                .iter()
                .enumerate()
                .map(|(k, &i)| (k, self.global[i]))
                .collect();
            if let Some((index, shard)) = shard {
                // The owner's own parameters are the ones its optimizer updated: no transfer.
                shard
                    .params
                    .copy_to(Values::Params, 0, replicas, index, &owned)?;
            }
            let sent: Vec<(usize, usize)> = owned
                .into_iter()
                .filter(|&(_, j)| {
                    !self.options.parameters_as_bucket_view || self.bucket_trainable[j]
                })
                .collect();
            // One transfer per parameter, or with the bucket view one per storage format (a
            // single one: the bucket view holds one dtype). A group added later may bring
            // another dtype; each parameter travels in its own format's arenas.
            let mut transfers: Vec<Vec<(usize, usize)>> = Vec::new();
            for (k, j) in sent {
                let format = replicas.place(j).bucket;
                match transfers.iter_mut().find(|t| {
                    self.options.parameters_as_bucket_view
                        && replicas.place(t[0].1).bucket == format
                }) {
                    Some(transfer) => transfer.push((k, j)),
                    None => transfers.push(vec![(k, j)]),
                }
            }
            for transfer in transfers {
                let bucket = replicas.place(transfer[0].1).bucket;
                // The sender's shard holds the same formats in its own layout.
                let src = shard.map(|(_, shard)| {
                    let k = transfer[0].0;
                    shard.params.buckets()[shard.params.place(k).bucket].arena(Values::Params)
                });
                let regions: Vec<BroadcastRegion> = transfer
                    .iter()
                    .map(|&(k, j)| BroadcastRegion {
                        src_rank: 0,
                        src_offset: shard.map_or(0, |(_, shard)| shard.params.place(k).offset),
                        dst_offset: replicas.place(j).offset,
                        len: replicas.numel(j),
                    })
                    .collect();
                self.world.broadcast_regions(
                    backend.as_ref(),
                    src,
                    replicas.buckets_mut()[bucket].arena_mut(Values::Params),
                    rank,
                    &regions,
                )?;
            }
        }
        Ok(())
    }

    /// [`ZeroRedundancyOptimizer::add_param_group`] with one error for all the local ranks.
    async fn add_param_group_here(
        &mut self,
        replicas: &Replicas,
        params: Vec<usize>,
        options: &OptionMap,
    ) -> Result<()> {
        if self.options.overlap_with_ddp {
            return Err(Error::runtime(
                "ZeroRedundancyOptimizer with `overlap_with_ddp=True` only supports a single parameter group",
            ));
        }
        for &j in &params {
            check_param_index(j, replicas.len())?;
            if self.global.contains(&j) {
                return Err(Error::value(
                    "some parameters appear in more than one parameter group",
                ));
            }
            // PyTorch checks dtypes only in its constructor; its bucket view then silently
            // casts each rank's parameters to the dtype of the last one. distopt keeps every
            // parameter's dtype, so a bucket (one flat tensor) cannot take another dtype.
            let dtype = replicas.dtype(self.global[0]);
            if self.options.parameters_as_bucket_view && replicas.dtype(j) != dtype {
                return Err(args::mixed_dense_types(dtype, replicas.dtype(j)));
            }
        }
        let mut merged = self.defaults.clone();
        for (k, v) in options {
            merged.insert(k.clone(), v.clone());
        }
        let mut saved = Vec::with_capacity(self.shards.len());
        for shard in &self.shards {
            saved.push(Some(shard.optim.state_dict(&shard.params, 0).await?));
        }
        let (old_global, old_groups) = (self.global.len(), self.groups.len());
        self.global.extend(params.iter().copied());
        self.groups.push((params, merged));
        // `build_shards` replaces the shards only once every one is built: a failure (an
        // unknown option, the memory budget) leaves the optimizer as it was.
        if let Err(e) = self.build_shards(replicas, saved, old_groups) {
            self.global.truncate(old_global);
            self.groups.truncate(old_groups);
            return Err(e);
        }
        // The consolidated state is kept, as PyTorch keeps `_all_state_dicts`: it no longer
        // matches the groups, which `state_dict` says.
        Ok(())
    }

    /// `add_param_group`: a new group of replica indices with its own options. The partition
    /// is recomputed; earlier parameters keep their ranks (the algorithm is deterministic and
    /// processes groups in order), and every rank's local optimizer gets the new group.
    ///
    /// # Errors
    /// A `RuntimeError` with `overlap_with_ddp` (one group only); an `IndexError` for an index
    /// outside the replicas; a `ValueError` for a parameter already in a group, or with
    /// `parameters_as_bucket_view` for one of another dtype than the others (PyTorch's
    /// constructor text; PyTorch itself would cast the rank's bucket); a `RuntimeError`
    /// when a local optimizer's state cannot be read back. Then, with the group already recorded
    /// (it is kept), the errors of rebuilding the shards: a `TypeError` for an unknown keyword or
    /// an option of the wrong type, a `RuntimeError` for an arena over the memory budget or a
    /// backend failure.
    ///
    /// Every local rank calls it and gets the error (they all run the same checks); `?` turns
    /// it into the lowest local rank's.
    pub async fn add_param_group(
        &mut self,
        replicas: &Replicas,
        params: Vec<usize>,
        options: &OptionMap,
    ) -> Result<(), RankErrors> {
        let local = self.world.local_ranks();
        self.add_param_group_here(replicas, params, options)
            .await
            .map_err(|e| RankErrors::all(local, e))
    }

    /// [`ZeroRedundancyOptimizer::consolidate_state_dict`] with one error for all the local ranks.
    async fn consolidate_state_dict_here(&mut self, replicas: &Replicas, to: i64) -> Result<()> {
        self.initialized()?;
        let _ = replicas;
        // Each local rank's state, keyed by global parameter index.
        let mut per_local_rank = Vec::with_capacity(self.shards.len());
        for (shard, owner) in self
            .shards
            .iter()
            .zip(&self.ownership[self.world.local_ranks()])
        {
            let local = shard.optim.state_dict(&shard.params, 0).await?;
            let entries = local
                .get("state")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            // Local state is keyed by the position in the local groups' order.
            let order: Vec<usize> = shard.optim.param_groups().into_iter().flatten().collect();
            let mut state = Map::new();
            for (key, value) in entries {
                let local_index: usize = key
                    .parse()
                    .map_err(|_| Error::runtime("bad local state key"))?;
                let k = order[local_index];
                let global_index = owner.global[k];
                for (i, &r) in self.global.iter().enumerate() {
                    if r == self.global[global_index] {
                        state.insert(i.to_string(), value.clone());
                    }
                }
            }
            per_local_rank.push(Value::Object(state).to_string().into_bytes());
        }
        let world = self.world.world_size() as i64;
        self.consolidated = None;
        if !(0..world).contains(&to) {
            return Ok(());
        }
        let Some(gathered) = self.world.gather_bytes(to as usize, per_local_rank)? else {
            return Ok(());
        };
        let mut state = Map::new();
        for bytes in gathered {
            let shard: Value = serde_json::from_slice(&bytes)
                .map_err(|e| Error::runtime(format!("a rank sent a malformed state: {e}")))?;
            if let Value::Object(entries) = shard {
                state.extend(entries);
            }
        }
        let mut index = 0;
        let param_groups: Vec<Value> = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, (params, map))| {
                let mut group = self.full_options(g, map);
                group.insert(
                    "params".into(),
                    json!((index..index + params.len()).collect::<Vec<_>>()),
                );
                index += params.len();
                Value::Object(group)
            })
            .collect();
        self.consolidated = Some((
            to as usize,
            json!({"state": state, "param_groups": param_groups}),
        ));
        Ok(())
    }

    /// Gathers every rank's shard of the optimizer state to rank `to` (a collective: every
    /// rank calls it). A `to` outside the world does not fail, but nobody keeps the state (as
    /// in PyTorch).
    ///
    /// # Errors
    /// A `RuntimeError` when the optimizer is not initialized (`overlap_with_ddp`); a
    /// `RuntimeError` when a state readback fails or a rank sends a malformed state; the gather's
    /// errors ([`Communicator::gather_bytes`]).
    ///
    /// Every local rank calls it and gets the error (they all run the same checks); `?` turns
    /// it into the lowest local rank's.
    pub async fn consolidate_state_dict(
        &mut self,
        replicas: &Replicas,
        to: i64,
    ) -> Result<(), RankErrors> {
        let local = self.world.local_ranks();
        self.consolidate_state_dict_here(replicas, to)
            .await
            .map_err(|e| RankErrors::all(local, e))
    }

    /// Group `g`'s options as the local optimizers report them (their defaults filled in).
    fn full_options(&self, g: usize, map: &OptionMap) -> OptionMap {
        self.shards
            .first()
            .and_then(|s| s.optim.group_options().get(g).cloned())
            .unwrap_or_else(|| map.clone())
    }

    /// `state_dict()` as seen on rank `rank`: the consolidated global state dict, in the layout
    /// of a plain optimizer, on the rank it was consolidated to; a `RuntimeError` elsewhere.
    ///
    /// # Errors
    /// A `RuntimeError` unless the state was consolidated to `rank` by the last
    /// [`ZeroRedundancyOptimizer::consolidate_state_dict`], or when the optimizer is not
    /// initialized (`overlap_with_ddp`); PyTorch's `AssertionError` that the groups do not
    /// match when a group was added since the consolidation.
    pub fn state_dict(&self, rank: usize) -> Result<Value> {
        if self.options.overlap_with_ddp {
            return Err(not_initialized());
        }
        match &self.consolidated {
            Some((to, state)) if *to == rank => {
                let groups = state["param_groups"].as_array().map_or(0, Vec::len);
                if groups != self.groups.len() {
                    return Err(Error::new(
                        ErrorKind::AssertionError,
                        "Mismatch between number of local and global parameter groups",
                    ));
                }
                Ok(state.clone())
            }
            _ => Err(not_consolidated(rank)),
        }
    }

    /// [`ZeroRedundancyOptimizer::load_state_dict`] with one error for all the local ranks.
    fn load_state_dict_here(&mut self, replicas: &Replicas, state_dict: &Value) -> Result<()> {
        self.initialized()?;
        let _ = replicas;
        let state = state_dict
            .get("state")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for key in state.keys() {
            let index: usize = key.parse().map_err(|_| {
                Error::new(
                    ErrorKind::TypeError,
                    format!("state key {key:?} is not an index"),
                )
            })?;
            if index >= self.global.len() {
                return Err(Error::new(ErrorKind::IndexError, "list index out of range"));
            }
        }
        let groups = optim::loaded_param_groups(state_dict, self.groups.len())?;
        for (group, (mine, _)) in groups.iter().zip(&self.groups) {
            optim::check_loaded_group_size(group.get("params"), mine.len())?;
        }
        // The saved hyper-parameters replace ours. Every local optimizer checks its part
        // before any of them (or ZeRO's groups) changes.
        let mut new_groups = self.groups.clone();
        for ((_, map), saved) in new_groups.iter_mut().zip(groups) {
            if let Some(saved) = saved.as_object() {
                for (k, v) in saved {
                    if k != "params" {
                        map.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        let local = self.world.local_ranks();
        let mut locals = Vec::with_capacity(self.shards.len());
        for (shard, owner) in self.shards.iter().zip(&self.ownership[local]) {
            let order: Vec<usize> = shard.optim.param_groups().into_iter().flatten().collect();
            let mut local_state = Map::new();
            for (local_index, &k) in order.iter().enumerate() {
                let global_index = owner.global[k];
                if let Some(value) = state.get(&global_index.to_string()) {
                    local_state.insert(local_index.to_string(), value.clone());
                }
            }
            let local_groups: Vec<Value> = shard
                .optim
                .param_groups()
                .iter()
                .zip(&new_groups)
                .map(|(params, (_, options))| {
                    let mut group = options.clone();
                    group.insert("params".into(), json!(params));
                    Value::Object(group)
                })
                .collect();
            let local = json!({"state": local_state, "param_groups": local_groups});
            shard.optim.check_state_dict(&shard.params, 0, &local)?;
            locals.push(local);
        }
        for (shard, local) in self.shards.iter_mut().zip(locals) {
            shard.optim.load_state_dict(&mut shard.params, 0, &local)?;
        }
        self.groups = new_groups;
        Ok(())
    }

    /// `load_state_dict(state_dict)` on every rank: each rank keeps the state of the parameters
    /// it owns in the current partition (whatever world size the dict was saved with).
    ///
    /// # Errors
    /// A `RuntimeError` when the optimizer is not initialized (`overlap_with_ddp`); a `TypeError`
    /// for a `state` key that is not an index; an `IndexError` for an index beyond the parameters;
    /// a `ValueError` when `param_groups` is missing or its groups differ in number or size from
    /// ZeRO's; the local optimizers' errors ([`LocalOptimizer::check_state_dict`]), checked on
    /// every shard before any changes; a `RuntimeError` when a state arena does not fit the memory
    /// budget.
    ///
    /// Every local rank calls it and gets the error (they all run the same checks); `?` turns
    /// it into the lowest local rank's.
    pub fn load_state_dict(
        &mut self,
        replicas: &Replicas,
        state_dict: &Value,
    ) -> Result<(), RankErrors> {
        let local = self.world.local_ranks();
        self.load_state_dict_here(replicas, state_dict)
            .map_err(|e| RankErrors::all(local, e))
    }

    /// `state_dict()` on every local rank, each with its own outcome (the consolidated dict on
    /// the rank it was consolidated to, the `RuntimeError` naming the rank elsewhere).
    pub fn state_dict_on_ranks(&self) -> Vec<(usize, Result<Value>)> {
        self.world
            .local_ranks()
            .map(|rank| (rank, self.state_dict(rank)))
            .collect()
    }

    /// Per local rank: the parameter groups of its local optimizer (`zero.optim.param_groups`
    /// as read on that rank), each as the global indices of its parameters; `None` before
    /// the optimizer is initialized (`overlap_with_ddp` without DDP). Every rank has one local
    /// group per global group, possibly empty.
    pub fn local_optimizer_param_groups(&self) -> Option<Vec<Vec<Vec<usize>>>> {
        self.partition.as_ref()?;
        let first = self.world.local_ranks().start;
        Some(
            self.shards
                .iter()
                .enumerate()
                .map(|(index, shard)| {
                    let owner = &self.ownership[first + index];
                    shard
                        .optim
                        .param_groups()
                        .into_iter()
                        .map(|group| group.into_iter().map(|k| owner.global[k]).collect())
                        .collect()
                })
                .collect(),
        )
    }

    /// Per local rank (see [`Communicator::local_ranks`]): how many parameters have non-empty
    /// optimizer state.
    pub fn local_state_sizes(&self) -> Vec<usize> {
        self.shards.iter().map(|s| s.optim.state_len(0)).collect()
    }

    /// Per local rank: bytes of optimizer state allocated (its shard only).
    pub fn state_bytes_per_rank(&self) -> Vec<usize> {
        self.shards
            .iter()
            .map(|s| s.optim.state_bytes_per_rank())
            .collect()
    }
}
