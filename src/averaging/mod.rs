//! Model averagers: `PeriodicModelAverager` and `HierarchicalModelAverager`, with PyTorch's
//! schedules, validation errors and warnings. Averaging runs as one all-reduce-mean per arena
//! over every group of the chosen partition at once. Averaging is elastic: each averaging is a
//! sync point of the world's membership (see [`average_parameters`]).

mod heal;
mod hierarchical;
mod periodic;

pub use hierarchical::HierarchicalModelAverager;
pub use periodic::PeriodicModelAverager;

use crate::comm::{Communicator, Membership, Subgroups};
use crate::dtype::{DType, StorageFormat};
use crate::error::{Error, Result};
use crate::replicas::{Replicas, Values, check_param_index};

/// The common surface of the averagers (PyTorch's `ModelAverager`).
pub trait ModelAverager: crate::backend::MaybeSendSync + std::fmt::Debug {
    /// The step counter: calls of `average_parameters` so far.
    fn step(&self) -> u64;

    /// Sets the step counter (used when loading a checkpoint).
    fn set_step(&mut self, step: u64);

    /// Averages, if the schedule says so, the parameters in `params` (all when `None`) that
    /// have a gradient; advances the step counter. Returns the group size used, or `None` when
    /// this step did not average.
    ///
    /// # Errors
    /// On a step that averages, those of [`average_parameters`]: an `IndexError` for an index
    /// in `params` out of range, a `ValueError` when no selected parameter has a gradient on
    /// rank 0 or the group partition or `replicas` do not fit the averager's world, a
    /// `RuntimeError` from the backend (a GPU error, a lost device). A
    /// [`HierarchicalModelAverager`] whose schedule reaches a period of 0 raises a
    /// `ZeroDivisionError`. The step counter advances only on success: a failed call leaves it
    /// as it was, so the same step is attempted again by the next call. What a failed
    /// collective leaves in the parameters: with parameters of several storage formats, one
    /// all-reduce runs per format, and the formats averaged before the failure keep their means
    /// (the others are untouched); an error found by the checks (every error above but a
    /// backend's or transport's) changes nothing.
    fn average_parameters(
        &mut self,
        replicas: &mut Replicas,
        params: Option<&[usize]>,
    ) -> Result<Option<usize>>;

    /// Checks, changing nothing, that the next [`ModelAverager::average_parameters`] with these
    /// arguments would pass its checks: on a step that averages, every error of
    /// `average_parameters` but a backend's or transport's failure during the collective. The
    /// default accepts everything (an averager of another crate may check nothing).
    /// `PostLocalSgdOptimizer::step` calls it before its local step, so that a call the
    /// averager would refuse changes nothing.
    ///
    /// # Errors
    /// As [`ModelAverager::average_parameters`], without the collective's runtime failures.
    fn check_average(&self, replicas: &Replicas, params: Option<&[usize]>) -> Result<()> {
        let _ = (replicas, params);
        Ok(())
    }

    /// The ranks the last averaging (or [`ModelAverager::admit`]) healed, `(joining rank,
    /// source rank)` as world ranks (see [`average_parameters`]); empty when it healed none or
    /// did not average. The default heals none.
    fn healed(&self) -> &[(usize, usize)] {
        &[]
    }

    /// The world this averager averages over, where its heals cross ([`ModelAverager::healed`]
    /// names its ranks). The default has none (and heals nothing).
    fn world(&self) -> Option<&dyn Communicator> {
        None
    }

    /// Takes this process's ranks into a running run of processes at the sync point that
    /// admits them (a process that joins, `distopt train --join`): heals them as the live
    /// ranks heal them at the end of that point's averaging, the step counter first (so that
    /// this averager's next call is the live ranks' next one), then the parameters. The heals
    /// are then [`ModelAverager::healed`].
    ///
    /// # Errors
    /// A `RuntimeError` when the world's next membership admits none of this process's ranks,
    /// or (the default) when this averager cannot admit ranks; the world's errors (its
    /// membership, the heal's transfers).
    fn admit(&mut self, replicas: &mut Replicas) -> Result<()> {
        let _ = replicas;
        Err(Error::runtime(
            "this averager cannot take a joining rank into a running run",
        ))
    }
}

/// [`ModelAverager::admit`] for an averager whose sync point at step counter `step - 1` (the
/// counter it has once healed is `step`) averages within `groups_at(step - 1)`: the admitting
/// membership, the healed counter, and the heals of the parameters.
fn admit_at(
    world: &dyn Communicator,
    replicas: &mut Replicas,
    step: u64,
    groups_at: impl FnOnce(u64) -> Result<Subgroups>,
) -> Result<(u64, Vec<(usize, usize)>)> {
    let membership = heal::admission(world)?;
    let step = heal::step(world, &membership, step)?;
    let groups = groups_at(step.saturating_sub(1))?;
    let plan = heal::plan(groups, &membership);
    heal::params(world, replicas, &plan)?;
    Ok((step, plan))
}

/// PyTorch's type promotion of the dtypes `torch.cat` flattens together.
pub fn promoted_format(dtypes: impl IntoIterator<Item = DType>) -> Option<StorageFormat> {
    let mut result: Option<DType> = None;
    for dtype in dtypes {
        result = Some(match (result, dtype) {
            (None, d) => d,
            (Some(a), b) if a == b => a,
            (Some(DType::Float64), _) | (_, DType::Float64) => DType::Float64,
            _ => DType::Float32,
        });
    }
    result.map(DType::storage)
}

/// `utils.average_parameters_or_parameter_groups`: all-reduce-mean of the parameters (all, or
/// those listed) that have a gradient, within every group of `groups`. The gradient test uses
/// rank 0's gradients (PyTorch requires every rank to pass the same list).
///
/// # Errors
/// An `IndexError` for an index in `params` out of range; a `ValueError` when none of the
/// selected parameters has a gradient on rank 0 (PyTorch's `torch.cat()` error), when `groups`
/// partitions another world size than `world`'s, or when `replicas` does not hold the world's
/// local ranks (all checked before any collective: see [`check_average_parameters`]); a
/// `RuntimeError` from the backend or the transport (a GPU error, a lost device), in which case
/// the storage formats averaged before the failure keep their means.
///
/// **Elastic**: each call is one sync point of the world's membership
/// ([`Communicator::membership`]). Within every group the mean is over the group's live ranks
/// (a group with none is skipped; the other ranks keep their parameters), and each rank that
/// joins after this point gets its parameters from a live peer: the lowest live rank of its
/// group, or of the world when its group has none. Returns those heals, `(joining rank, source
/// rank)` as world ranks, so that a caller holding more state (post-local SGD's optimizer)
/// heals it too. Over a world whose membership is fixed, every rank is live and nobody joins.
///
/// A `RuntimeError` also when a joining rank and its source are held by different processes
/// of a world that cannot heal across processes (MPI's; see [`Communicator::heal_rows`]).
pub fn average_parameters(
    world: &dyn Communicator,
    replicas: &mut Replicas,
    groups: Subgroups,
    params: Option<&[usize]>,
) -> Result<Vec<(usize, usize)>> {
    let membership = mean_over_live(world, replicas, groups, params)?;
    let plan = heal::plan(groups, &membership);
    heal::params(world, replicas, &plan)?;
    Ok(plan)
}

/// [`average_parameters`] without its heals: the sync point's membership and the mean over
/// its live ranks. Returns the membership.
fn mean_over_live(
    world: &dyn Communicator,
    replicas: &mut Replicas,
    groups: Subgroups,
    params: Option<&[usize]>,
) -> Result<Membership> {
    let (wanted, arith) = plan_average(world, replicas, groups, params)?;
    let membership = world.membership()?;
    replicas.all_reduce_mean_live(
        world,
        Values::Params,
        groups,
        &membership.live,
        &wanted,
        Some(arith),
    )?;
    Ok(membership)
}

/// [`ModelAverager::average_parameters`] for an averager whose step counter is `step` and
/// whose schedule averages within `groups` at it (`None`: this call does not average). A
/// call that averages is a sync point on the live ranks: the mean over them
/// ([`average_parameters`]), then the heals of the ranks it admits, the step counter first,
/// then the parameters; `step` becomes the counter this process's ranks now have and `healed`
/// the `(joiner, source)` heals. A call that does not average only counts. Either way `step`
/// changes only once the call has succeeded. Returns the group size used, or `None`.
fn average_at(
    world: &dyn Communicator,
    replicas: &mut Replicas,
    groups: Option<Subgroups>,
    params: Option<&[usize]>,
    (step, healed): (&mut u64, &mut Vec<(usize, usize)>),
) -> Result<Option<usize>> {
    let Some(groups) = groups else {
        // Counted only once the call has succeeded.
        *step += 1;
        return Ok(None);
    };
    let membership = mean_over_live(world, replicas, groups, params)?;
    let next = heal::step(world, &membership, *step + 1)?;
    let plan = heal::plan(groups, &membership);
    heal::params(world, replicas, &plan)?;
    (*step, *healed) = (next, plan);
    Ok(Some(groups.group_size()))
}

/// The checks of [`average_parameters`], changing nothing.
///
/// # Errors
/// Those of [`average_parameters`] but the backend's and the transport's.
pub fn check_average_parameters(
    world: &dyn Communicator,
    replicas: &Replicas,
    groups: Subgroups,
    params: Option<&[usize]>,
) -> Result<()> {
    plan_average(world, replicas, groups, params).map(|_| ())
}

/// Which parameters [`average_parameters`] averages and in which precision, after its checks.
fn plan_average(
    world: &dyn Communicator,
    replicas: &Replicas,
    groups: Subgroups,
    params: Option<&[usize]>,
) -> Result<(Vec<bool>, StorageFormat)> {
    let selected: Vec<usize> = match params {
        Some(list) => list.to_vec(),
        None => (0..replicas.len()).collect(),
    };
    for &j in &selected {
        check_param_index(j, replicas.len())?;
    }
    let averaged: Vec<usize> = selected
        .into_iter()
        .filter(|&j| replicas.has_grad(0, j))
        .collect();
    let Some(arith) = promoted_format(averaged.iter().map(|&j| replicas.dtype(j))) else {
        return Err(Error::value(
            "torch.cat(): expected a non-empty list of Tensors",
        ));
    };
    // What the collective would refuse, refused before it starts.
    let world_size = world.world_size();
    if groups.world_size() != world_size {
        return Err(Error::value(format!(
            "averaging groups of {} ranks partition a world of {} ranks, this world has {world_size}",
            groups.group_size(),
            groups.world_size()
        )));
    }
    let local = world.local_ranks().len();
    if replicas.ranks() != local {
        return Err(Error::value(format!(
            "{} ranks' parameters passed to a world whose process holds {local} of its {world_size} ranks",
            replicas.ranks()
        )));
    }
    let mut wanted = vec![false; replicas.len()];
    for &j in &averaged {
        wanted[j] = true;
    }
    Ok((wanted, arith))
}

/// The warning PyTorch emits for a period of 1.
pub(crate) const PERIOD_ONE_WARNING: &str = "When period is 1, no need to use model averaging because the communication cost of all-reducing parameters will be no less than the cost of all-reducing gradients by DistributedDataParallel in the backward pass. Therefore, only DistributedDataParallel should be used for this case.";

/// The warning PyTorch emits when the last period of a hierarchy is 1.
pub(crate) const MAX_PERIOD_ONE_WARNING: &str = "When the maximum period in arg ``period_group_size_dict`` is 1, no need to use model averaging because the communication cost of all-reducing parameters will be no less than the cost of all-reducing gradients by DistributedDataParallel in the backward pass. Therefore, only DistributedDataParallel should be used for this case.";

/// The `warmup_steps` error shared by both averagers.
pub(crate) fn warmup_error() -> Error {
    Error::value("Arg ``warmup_steps`` must be a non-negative number.")
}
