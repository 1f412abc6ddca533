//! The [`Trainer`]: R replicas of a [`Task`]'s model trained step by step, and the
//! algorithms that keep them together.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::task::Task;
use crate::averaging::{HierarchicalModelAverager, PeriodicModelAverager};
use crate::backend::Backend;
use crate::comm::{CommStats, Communicator, SimulatedWorld};
use crate::diloco::{Compression, DiLoCo, DiLoCoOptions, split_fragments};
use crate::error::{Error, Result};
use crate::optim::{LocalOptimizer, Sgd, SgdOptions};
use crate::post_local_sgd::{PostLocalSgdOptimizer, PostLocalSgdState};
use crate::replicas::Replicas;
use crate::rng::{SplitMix64, mix};
use crate::tensor::{HostData, Tensor};
use crate::zero::{ZeroOptions, ZeroRedundancyOptimizer};

/// How the replicas are kept together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Algorithm {
    /// Synchronous data-parallel SGD: gradients all-reduced over the world at every step (the
    /// post-local-SGD hook with `start_localSGD_iter` = ∞); the replicas never differ.
    SyncSgd,
    /// Post-local SGD with a `PeriodicModelAverager`: world gradient all-reduce for `warmup`
    /// steps, then purely local steps with the parameters averaged over the world every
    /// `period` steps.
    PostLocalPeriodic {
        /// Averaging period (≥ 1).
        period: u64,
        /// Warm-up steps of synchronous SGD.
        warmup: u64,
    },
    /// Post-local SGD with a `HierarchicalModelAverager`: world gradient all-reduce for
    /// `warmup` steps; then local steps (with the gradients all-reduced within subgroups of
    /// `subgroup_size` ranks, when given) and parameters averaged within groups of
    /// `group_size` ranks every `period` steps, the largest matching period winning.
    PostLocalHierarchical {
        /// `(period, group size)` pairs in ascending order of period; the last group size
        /// must be the world size.
        levels: Vec<(u64, usize)>,
        /// Warm-up steps of synchronous SGD.
        warmup: u64,
        /// Gradient all-reduce group after warm-up (`None`: no gradient all-reduce).
        subgroup_size: Option<usize>,
    },
    /// Synchronous data-parallel SGD (gradients all-reduced over the world at every step)
    /// whose optimizer is a `ZeroRedundancyOptimizer` over SGD with momentum: each rank keeps
    /// the momentum of only the parameters it owns and broadcasts them after its update. The
    /// replicas never differ; the optimizer state per rank shrinks to about 1/R.
    Zero,
    /// DiLoCo: local SGD steps (no gradient all-reduce), and every `sync_every` steps the
    /// world's mean pseudo-gradient applied by the outer optimizer of the paper
    /// (SGD, lr 0.7, Nesterov momentum 0.9); with `fragments` > 1, Streaming DiLoCo: the
    /// parameters split into that many runs, syncing on a staggered schedule.
    #[serde(rename = "diloco")]
    DiLoCo {
        /// Inner steps between a fragment's syncs (≥ 1, ≥ `fragments`).
        sync_every: u64,
        /// Fragments (1: plain DiLoCo).
        fragments: usize,
        /// The pseudo-gradients' wire precision (absent from the settings when none).
        #[serde(default, skip_serializing_if = "Compression::is_none")]
        compress: Compression,
        /// torchft's `fragment_sync_delay`: a fragment's all-reduce starts this many inner
        /// steps before its outer step (absent from the settings when 0).
        #[serde(default, skip_serializing_if = "is_zero_u64")]
        fragment_sync_delay: u64,
        /// torchft's `fragment_update_alpha`: the local parameters' weight in the mix after an
        /// outer step (absent from the settings when not given: no mix).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fragment_update_alpha: Option<f64>,
    },
}

/// Serde's "leave out the default" test for a delay.
fn is_zero_u64(value: &u64) -> bool {
    *value == 0
}

/// The outer optimizer of the DiLoCo paper, `(lr, momentum)`: SGD with Nesterov momentum.
pub const DILOCO_OUTER: (f64, f64) = (0.7, 0.9);

impl Algorithm {
    /// `sync`, `periodic`, `hierarchical` or `zero`.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::SyncSgd => "sync",
            Algorithm::PostLocalPeriodic { .. } => "periodic",
            Algorithm::PostLocalHierarchical { .. } => "hierarchical",
            Algorithm::Zero => "zero",
            Algorithm::DiLoCo { .. } => "diloco",
        }
    }

    /// A one-line description with the settings, e.g. `post-local SGD, periodic (period 8,
    /// warm-up 20)`.
    pub fn describe(&self) -> String {
        match self {
            Algorithm::SyncSgd => "synchronous SGD".into(),
            Algorithm::Zero => {
                "ZeRO: synchronous SGD, optimizer state sharded over the ranks".into()
            }
            Algorithm::DiLoCo {
                sync_every,
                fragments,
                compress,
                fragment_sync_delay,
                fragment_update_alpha,
            } => {
                let (lr, momentum) = DILOCO_OUTER;
                let mut wire = match compress {
                    Compression::None => String::new(),
                    c => format!("; pseudo-gradients in {}", c.name()),
                };
                if *fragment_sync_delay > 0 {
                    wire.push_str(&format!("; fragment_sync_delay {fragment_sync_delay}"));
                }
                if let Some(alpha) = fragment_update_alpha {
                    wire.push_str(&format!(
                        "; fragment_update_alpha {}",
                        crate::pyfmt::float_repr(*alpha)
                    ));
                }
                let streaming = if *fragments > 1 {
                    format!("Streaming DiLoCo ({fragments} fragments")
                } else {
                    "DiLoCo (".to_string()
                };
                let sep = if *fragments > 1 { ", " } else { "" };
                format!(
                    "{streaming}{sep}sync every {sync_every} steps; outer SGD lr {lr}, Nesterov momentum {momentum}{wire})"
                )
            }
            Algorithm::PostLocalPeriodic { period, warmup } => {
                format!("post-local SGD, periodic averaging (period {period}, warm-up {warmup})")
            }
            Algorithm::PostLocalHierarchical {
                levels,
                warmup,
                subgroup_size,
            } => {
                let levels: Vec<String> = levels
                    .iter()
                    .map(|(p, g)| format!("every {p} steps over {g} ranks"))
                    .collect();
                let grads = match subgroup_size {
                    Some(s) => format!(", gradients all-reduced over {s} ranks"),
                    None => String::new(),
                };
                format!(
                    "post-local SGD, hierarchical averaging ({}; warm-up {warmup}{grads})",
                    levels.join(", ")
                )
            }
        }
    }

    /// The default hierarchy for `ranks` ranks with world-level period `period`: starting
    /// from `(period, ranks)`, the period and the group size are halved while the period is
    /// at least 2 and the group splits into even halves of two or more ranks. 8 ranks and
    /// period 8 give `[(2, 2), (4, 4), (8, 8)]`.
    pub fn default_hierarchy(period: u64, ranks: usize) -> Vec<(u64, usize)> {
        let mut levels = vec![(period, ranks)];
        let (mut p, mut g) = (period, ranks);
        while p >= 2 && g.is_multiple_of(2) && g >= 4 {
            p /= 2;
            g /= 2;
            levels.insert(0, (p, g));
        }
        levels
    }
}

/// How a [`Trainer`] trains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainConfig {
    /// The data-parallel algorithm (default synchronous SGD).
    pub algorithm: Algorithm,
    /// SGD learning rate (default 0.05).
    pub lr: f64,
    /// SGD momentum (default 0.9).
    pub momentum: f64,
    /// Samples per rank per step, drawn with replacement from the rank's shard; a batch at
    /// least as large as the shard is the whole shard (default 32).
    pub batch_size: usize,
    /// Seed of the mini-batch sampling (default 0).
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            algorithm: Algorithm::SyncSgd,
            lr: 0.05,
            momentum: 0.9,
            batch_size: 32,
            seed: 0,
        }
    }
}

/// What one [`Trainer::step`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepReport {
    /// Steps completed, this one included (1 after the first step).
    pub step: u64,
    /// Each rank's mini-batch loss, at the parameters the rank computed its gradient at (NaN
    /// for a rank that left an elastic run of processes).
    pub loss_per_rank: Vec<f64>,
    /// The mean of `loss_per_rank` over the ranks present.
    pub mean_loss: f64,
    /// After the step: the largest L2 distance of a replica's parameters (all of them, as
    /// one vector) from the mean of the replicas present. Exactly 0 when every replica is
    /// identical.
    pub divergence: f64,
    /// Bytes each rank has sent through collectives since the trainer was made (cumulative).
    pub bytes_communicated_per_rank: u64,
    /// The group size the gradients were all-reduced over this step, or `None`.
    pub gradients_reduced: Option<usize>,
    /// The group size the parameters were averaged over this step, or `None`.
    pub averaged: Option<usize>,
    /// Bytes of optimizer state (momentum buffers) each rank holds after the step: the whole
    /// model's for a local SGD, the rank's shard for ZeRO.
    pub optimizer_state_bytes_per_rank: Vec<u64>,
}

/// The model quality of the replicas on the task's evaluation samples: the held-out test
/// split of a [`DatasetTask`](super::DatasetTask), every shard of a
/// [`SyntheticTask`](super::SyntheticTask).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evaluation {
    /// Loss of the mean of the replicas' parameters (the model a final world average gives).
    pub mean_model_loss: f64,
    /// Accuracy of the mean of the replicas' parameters.
    pub mean_model_accuracy: f64,
    /// Each replica's own loss.
    pub loss_per_rank: Vec<f64>,
    /// Whether the samples measured are held out (no rank trains on them).
    pub held_out: bool,
    /// Samples measured.
    pub samples: usize,
}

/// The local step behind the gradient hook.
#[derive(Debug)]
enum Driver {
    Sync(Sgd),
    PostLocal(PostLocalSgdOptimizer),
    Zero(Box<ZeroRedundancyOptimizer>),
    DiLoCo(Box<DiLoCo>),
}

/// R replicas of a [`Task`]'s model, trained one step at a time.
#[derive(Debug)]
pub struct Trainer {
    task: Arc<dyn Task>,
    config: TrainConfig,
    world: Arc<dyn Communicator>,
    /// The local ranks' replicas (all of them in a simulated world).
    replicas: Replicas,
    hook: PostLocalSgdState,
    driver: Driver,
    steps: u64,
    /// Every world rank's parameters, as read back (and gathered): `[rank][param][element]`.
    host_params: Option<Vec<Vec<Vec<f64>>>>,
    /// Every world rank's optimizer state bytes, as of the last step.
    state_bytes: Vec<u64>,
    /// The world ranks the reports still hear from: every rank, until one leaves an elastic
    /// run of processes ([`Communicator::all_gather_bytes_present`]); a rank that left stays
    /// out of the reports (its parameters are empty in `host_params`).
    present: Vec<bool>,
    /// What the world's counters held when this trainer started, plus what the reports' own
    /// gathers added since: not this training's traffic.
    excluded: CommStats,
}

fn to_i64(value: u64, what: &str) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::value(format!("{what} {value} is too large")))
}

impl Trainer {
    /// Replicates the task's initial parameters on `backend`, one replica per shard, and sets
    /// up the gradient hook, the local SGD and the averager of `config.algorithm`. Invalid
    /// settings (a negative or non-finite learning rate, a zero period, group sizes that do
    /// not divide the world, …) are errors.
    ///
    /// # Errors
    /// A `ValueError` when the task has no shard (an empty world); otherwise as
    /// [`Trainer::with_world`].
    pub fn new(
        backend: Arc<dyn Backend>,
        task: Arc<dyn Task>,
        config: TrainConfig,
    ) -> Result<Trainer> {
        let world = Arc::new(SimulatedWorld::new(task.ranks())?);
        Trainer::with_world(backend, task, config, world)
    }

    /// [`Trainer::new`] over any world: this process trains the shards of its local ranks
    /// (see [`Communicator::local_ranks`]). The task must have one shard per world rank.
    /// Every process of the world must make the same calls.
    ///
    /// # Errors
    /// A `ValueError` when the task's shards are not the world's ranks, the learning rate or
    /// momentum is negative or not finite, the batch size is 0, or the algorithm's settings are
    /// invalid (PyTorch's averager and subgroup errors, a `sync_every` below 1 or below the number
    /// of fragments, fragments that are 0 or more than the parameters, a value beyond `i64`); the
    /// task's errors ([`Task::initial_params`]); a `RuntimeError` when the replicas do not fit the
    /// memory budget or the backend or the world fails.
    pub fn with_world(
        backend: Arc<dyn Backend>,
        task: Arc<dyn Task>,
        config: TrainConfig,
        world: Arc<dyn Communicator>,
    ) -> Result<Trainer> {
        let mut trainer = Trainer::unreported(backend, task, config, world)?;
        trainer.state_bytes = trainer.gather_state_bytes()?;
        Ok(trainer)
    }

    /// A trainer for a process that joins a running run of processes (`distopt train
    /// --join`): [`Trainer::with_world`] without its first report's gather (the live ranks made
    /// theirs at their start), to be taken in with [`Trainer::admit`] before its first step.
    ///
    /// # Errors
    /// Those of [`Trainer::with_world`].
    pub fn joining(
        backend: Arc<dyn Backend>,
        task: Arc<dyn Task>,
        config: TrainConfig,
        world: Arc<dyn Communicator>,
    ) -> Result<Trainer> {
        Trainer::unreported(backend, task, config, world)
    }

    /// [`Trainer::with_world`] but the gather of the optimizer state's sizes.
    fn unreported(
        backend: Arc<dyn Backend>,
        task: Arc<dyn Task>,
        config: TrainConfig,
        world: Arc<dyn Communicator>,
    ) -> Result<Trainer> {
        if task.ranks() != world.world_size() {
            return Err(Error::value(format!(
                "the task has {} shards, the world {} ranks",
                task.ranks(),
                world.world_size()
            )));
        }
        if !config.lr.is_finite() || !config.momentum.is_finite() {
            return Err(Error::value(format!(
                "learning rate and momentum must be finite, got {} and {}",
                config.lr, config.momentum
            )));
        }
        if config.batch_size == 0 {
            return Err(Error::value("the batch size must be positive"));
        }
        let comm = world.clone();
        let replicas =
            Replicas::replicate(backend, world.local_ranks().len(), &task.initial_params()?)?;
        let sgd = Sgd::new(
            &replicas,
            SgdOptions {
                lr: config.lr,
                momentum: config.momentum,
                ..SgdOptions::default()
            },
        )?;
        let (hook, driver) = match &config.algorithm {
            Algorithm::SyncSgd => (
                PostLocalSgdState::new(comm, None, u64::MAX, true)?,
                Driver::Sync(sgd),
            ),
            Algorithm::Zero => {
                let mut defaults = crate::optim::OptionMap::new();
                defaults.insert("lr".into(), serde_json::Value::from(config.lr));
                defaults.insert("momentum".into(), serde_json::Value::from(config.momentum));
                let zero = ZeroRedundancyOptimizer::new(
                    comm.clone(),
                    &replicas,
                    vec![(
                        (0..replicas.len()).collect(),
                        crate::optim::OptionMap::new(),
                    )],
                    "SGD",
                    &defaults,
                    ZeroOptions::default(),
                )?;
                (
                    PostLocalSgdState::new(comm, None, u64::MAX, true)?,
                    Driver::Zero(Box::new(zero)),
                )
            }
            Algorithm::DiLoCo {
                sync_every,
                fragments,
                compress,
                fragment_sync_delay,
                fragment_update_alpha,
            } => {
                let (lr, momentum) = DILOCO_OUTER;
                let outer = Sgd::new(
                    &replicas,
                    SgdOptions {
                        lr,
                        momentum,
                        nesterov: true,
                        ..SgdOptions::default()
                    },
                )?;
                let options = DiLoCoOptions {
                    compression: *compress,
                    fragments: Some(split_fragments(replicas.len(), *fragments)?),
                    fragment_sync_delay: to_i64(*fragment_sync_delay, "fragment_sync_delay")?,
                    fragment_update_alpha: *fragment_update_alpha,
                };
                let diloco = DiLoCo::with_options(
                    &replicas,
                    Box::new(sgd),
                    Box::new(outer),
                    to_i64(*sync_every, "sync_every")?,
                    comm.clone(),
                    options,
                )?;
                (
                    // Never any gradient all-reduce: the ranks meet only at syncs.
                    PostLocalSgdState::new(comm, None, 0, false)?,
                    Driver::DiLoCo(Box::new(diloco)),
                )
            }
            Algorithm::PostLocalPeriodic { period, warmup } => {
                let averager = PeriodicModelAverager::new(
                    to_i64(*period, "period")?,
                    to_i64(*warmup, "warm-up")?,
                    comm.clone(),
                )?;
                (
                    PostLocalSgdState::new(comm, None, *warmup, false)?,
                    Driver::PostLocal(PostLocalSgdOptimizer::new(
                        Box::new(sgd),
                        Box::new(averager),
                    )),
                )
            }
            Algorithm::PostLocalHierarchical {
                levels,
                warmup,
                subgroup_size,
            } => {
                let mut dict = Vec::with_capacity(levels.len());
                for &(period, size) in levels {
                    dict.push((
                        to_i64(period, "period")?,
                        to_i64(size as u64, "group size")?,
                    ));
                }
                let averager = HierarchicalModelAverager::new(
                    &dict,
                    to_i64(*warmup, "warm-up")?,
                    comm.clone(),
                )?;
                let subgroup = subgroup_size
                    .map(|s| to_i64(s as u64, "subgroup size"))
                    .transpose()?;
                (
                    PostLocalSgdState::new(comm, subgroup, *warmup, subgroup.is_some())?,
                    Driver::PostLocal(PostLocalSgdOptimizer::new(
                        Box::new(sgd),
                        Box::new(averager),
                    )),
                )
            }
        };
        let present = vec![true; world.world_size()];
        let mut trainer = Trainer {
            task,
            config,
            world,
            replicas,
            hook,
            driver,
            steps: 0,
            host_params: None,
            state_bytes: Vec::new(),
            present,
            excluded: CommStats::default(),
        };
        trainer.excluded = trainer.world.stats();
        Ok(trainer)
    }

    /// The world this trainer communicates in.
    pub fn world(&self) -> &Arc<dyn Communicator> {
        &self.world
    }

    /// Runs a gather for a report, keeping its bytes out of the training traffic.
    fn reporting<T>(&mut self, gather: impl FnOnce(&dyn Communicator) -> Result<T>) -> Result<T> {
        let before = self.world.stats();
        let result = gather(self.world.as_ref());
        let after = self.world.stats();
        self.excluded.gather_bytes += after.gather_bytes - before.gather_bytes;
        self.excluded.collectives += after.collectives - before.collectives;
        result
    }

    /// Every rank's `f64` values from the local ranks', `None` for a rank not present (which
    /// then stays out of the reports).
    fn gather_present(&mut self, local: &[Vec<f64>]) -> Result<Vec<Option<Vec<f64>>>> {
        let mut all = self.reporting(|world| crate::comm::all_gather_f64_present(world, local))?;
        for (values, present) in all.iter_mut().zip(self.present.iter_mut()) {
            *present &= values.is_some();
            if !*present {
                *values = None;
            }
        }
        Ok(all)
    }

    /// The world ranks still present in the reports (all of them unless ranks left an
    /// elastic run of processes).
    pub fn present_ranks(&self) -> Vec<usize> {
        (0..self.present.len())
            .filter(|&r| self.present[r])
            .collect()
    }

    fn gather_state_bytes(&mut self) -> Result<Vec<u64>> {
        let local: Vec<Vec<f64>> = match &self.driver {
            Driver::Sync(sgd) => {
                vec![vec![sgd.state_bytes_per_rank() as f64]; self.replicas.ranks()]
            }
            Driver::PostLocal(opt) => {
                vec![vec![opt.optim().state_bytes_per_rank() as f64]; self.replicas.ranks()]
            }
            Driver::DiLoCo(diloco) => {
                let bytes =
                    diloco.inner().state_bytes_per_rank() + diloco.outer().state_bytes_per_rank();
                vec![vec![bytes as f64]; self.replicas.ranks()]
            }
            Driver::Zero(zero) => zero
                .state_bytes_per_rank()
                .into_iter()
                .map(|b| vec![b as f64])
                .collect(),
        };
        let all = self.gather_present(&local)?;
        Ok(all
            .iter()
            .map(|v| v.as_ref().and_then(|v| v.first()).copied().unwrap_or(0.0) as u64)
            .collect())
    }

    /// The task being learned.
    pub fn task(&self) -> &Arc<dyn Task> {
        &self.task
    }

    /// The training configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Steps completed.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The replicas (parameters and gradients on the backend).
    pub fn replicas(&self) -> &Replicas {
        &self.replicas
    }

    /// Bytes of optimizer state each rank holds: with a local SGD every rank keeps momentum
    /// for the whole model; with ZeRO only for the parameters it owns.
    /// (Every world rank, as of the last step.)
    pub fn optimizer_state_bytes_per_rank(&self) -> Vec<u64> {
        self.state_bytes.clone()
    }

    /// Bytes communicated by training so far, by kind of collective (this process's ranks;
    /// the gathers behind the reports are not counted).
    pub fn comm_stats(&self) -> CommStats {
        self.world.stats().since(&self.excluded)
    }

    /// Every world rank's parameters on the host, read back (and gathered from the other
    /// processes) when the cache is empty.
    async fn host_params(&mut self) -> Result<&Vec<Vec<Vec<f64>>>> {
        if self.host_params.is_none() {
            let local = read_params(&self.replicas).await?;
            let shapes = self.task.param_shapes();
            let all = self.gather_per_rank(&local, &shapes)?;
            self.host_params = Some(all);
        }
        self.host_params
            .as_ref()
            .ok_or_else(|| Error::runtime("parameters were not read back"))
    }

    /// Every world rank's `[param][element]` values from the local ranks' (no exchange when
    /// this process holds the whole world); no parameters for a rank not present.
    fn gather_per_rank(
        &mut self,
        local: &[Vec<Vec<f64>>],
        shapes: &[Vec<usize>],
    ) -> Result<Vec<Vec<Vec<f64>>>> {
        if self.world.local_ranks().len() == self.world.world_size() {
            return Ok(local.to_vec());
        }
        let flat: Vec<Vec<f64>> = local.iter().map(|rank| rank.concat()).collect();
        let all = self.gather_present(&flat)?;
        let numels: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
        all.into_iter()
            .map(|values| {
                let Some(values) = values else {
                    return Ok(Vec::new());
                };
                if values.len() != numels.iter().sum::<usize>() {
                    return Err(Error::runtime(format!(
                        "a rank sent {} values, the model has {}",
                        values.len(),
                        numels.iter().sum::<usize>()
                    )));
                }
                let mut at = 0;
                Ok(numels
                    .iter()
                    .map(|&n| {
                        at += n;
                        values[at - n..at].to_vec()
                    })
                    .collect())
            })
            .collect()
    }

    /// The parameters of the ranks present, as read back by [`Trainer::host_params`].
    fn present_params(&self) -> Vec<&[Vec<f64>]> {
        let Some(all) = &self.host_params else {
            return Vec::new();
        };
        (0..all.len())
            .filter(|&r| self.present[r])
            .map(|r| all[r].as_slice())
            .collect()
    }

    /// Rank `rank`'s mini-batch for the coming step: indices into its shard.
    fn batch(&self, rank: usize) -> Vec<usize> {
        let len = self.task.shard_len(rank);
        if self.config.batch_size >= len {
            return (0..len).collect();
        }
        let mut rng = SplitMix64::new(self.config.seed, mix(mix(3, rank as u64), self.steps));
        (0..self.config.batch_size)
            .map(|_| rng.below(len))
            .collect()
    }

    /// One iteration on every rank: mini-batch gradients on the host, the gradient hook, the
    /// local SGD step and (post-local SGD) the averager. Returns what happened.
    ///
    /// # Errors
    /// The task's errors ([`Task::loss_and_grad`]: a `ValueError` for an empty shard); the errors
    /// of the gradient hook, the optimizer and the averager (a `RuntimeError` for a GPU error, a
    /// lost device or an arena over the memory budget); the world's errors. A failed step is not
    /// counted, but the replicas may have changed.
    pub async fn step(&mut self) -> Result<StepReport> {
        let local = self.world.local_ranks();
        let batches: Vec<Vec<usize>> = local.clone().map(|r| self.batch(r)).collect();
        let task = self.task.clone();
        let params = self.host_params().await?;
        let mut local_losses = Vec::with_capacity(local.len());
        let mut all_grads = Vec::with_capacity(local.len());
        for (rank, batch) in local.clone().zip(&batches) {
            let (loss, grads) = task.loss_and_grad(&params[rank], rank, batch)?;
            local_losses.push(vec![loss]);
            all_grads.push(grads);
        }
        let loss_per_rank: Vec<f64> = self
            .gather_present(&local_losses)?
            .into_iter()
            .map(|l| l.and_then(|l| l.first().copied()).unwrap_or(f64::NAN))
            .collect();
        // The ranks whose losses these are (a rank healed at this step's end has none).
        let losing = self.present_ranks();
        let (gradients_reduced, averaged) = self.apply(all_grads)?;
        self.host_params().await?;
        let divergence = divergence(&self.present_params());
        self.state_bytes = self.gather_state_bytes()?;
        let mean_loss = losing.iter().map(|&r| loss_per_rank[r]).sum::<f64>() / losing.len() as f64;
        Ok(StepReport {
            step: self.steps,
            loss_per_rank,
            mean_loss,
            divergence,
            bytes_communicated_per_rank: self.comm_stats().total_bytes(),
            gradients_reduced,
            averaged,
            optimizer_state_bytes_per_rank: self.optimizer_state_bytes_per_rank(),
        })
    }

    /// `steps` iterations with no report: each local rank's gradient from its own parameters
    /// (read back alone), then the gradient hook and the algorithm's step, as
    /// [`Trainer::step`] takes them; nothing is gathered for a report (losses, divergence,
    /// state sizes), so the only traffic is the algorithm's. For a run of processes that
    /// reports at its end only, and for timing an algorithm's communication against its
    /// computation (`distopt bench overlap`).
    ///
    /// # Errors
    /// Those of [`Trainer::step`]; the steps before a failed one count.
    pub async fn train_unreported(&mut self, steps: u64) -> Result<()> {
        let local = self.world.local_ranks();
        let task = self.task.clone();
        for _ in 0..steps {
            let batches: Vec<Vec<usize>> = local.clone().map(|r| self.batch(r)).collect();
            let params = read_params(&self.replicas).await?;
            let mut all_grads = Vec::with_capacity(local.len());
            for ((rank, batch), params) in local.clone().zip(&batches).zip(&params) {
                all_grads.push(task.loss_and_grad(params, rank, batch)?.1);
            }
            self.apply(all_grads)?;
        }
        Ok(())
    }

    /// The local ranks' gradients `all_grads` written, synchronized by the gradient hook and
    /// stepped by the algorithm; the step counted and the ranks admitted healed. Returns the
    /// report's `gradients_reduced` and `averaged`.
    fn apply(&mut self, all_grads: Vec<Vec<Vec<f64>>>) -> Result<(Option<usize>, Option<usize>)> {
        let shapes = self.task.param_shapes();
        for (rank, grads) in all_grads.into_iter().enumerate() {
            let tensors = grads
                .iter()
                .zip(&shapes)
                .map(|(g, shape)| {
                    Tensor::new(shape, HostData::from_f64(crate::DType::Float32, g)).map(Some)
                })
                .collect::<Result<Vec<_>>>()?;
            self.replicas.set_grads(rank, &tensors)?;
        }
        // The parameters change below: whatever happens next, the cache is stale.
        self.host_params = None;
        let gradients_reduced = self.hook.synchronize_gradients(&mut self.replicas)?;
        let averaged = match &mut self.driver {
            Driver::Sync(sgd) => {
                sgd.step(&mut self.replicas)?;
                None
            }
            Driver::PostLocal(opt) => opt.step(&mut self.replicas)?,
            Driver::Zero(zero) => {
                zero.step(&mut self.replicas)?;
                None
            }
            Driver::DiLoCo(diloco) => diloco
                .step(&mut self.replicas)?
                .then_some(self.world.world_size()),
        };
        self.steps += 1;
        let healed = self.healed();
        self.heal_counters(&healed)?;
        Ok((gradients_reduced, averaged))
    }

    /// Takes this process's ranks into a running run of processes (`distopt train --join`):
    /// the elastic algorithm admits them at the run's next sync point and heals them from a
    /// live rank ([`DiLoCo::admit`], [`PostLocalSgdOptimizer::admit`]), then the trainer takes
    /// that rank's step count, gradient hook's iteration and ranks present in the reports, and
    /// reads back the healed parameters with the live ranks, as they do at the end of that
    /// step. The next [`Trainer::step`] is the live ranks' next step.
    ///
    /// # Errors
    /// A `ValueError` for an algorithm that is not elastic (synchronous SGD, ZeRO: every step
    /// is a collective of every rank); those of the algorithm's `admit` and of the world.
    pub async fn admit(&mut self) -> Result<()> {
        match &mut self.driver {
            Driver::DiLoCo(diloco) => diloco.admit(&mut self.replicas)?,
            Driver::PostLocal(opt) => opt.admit(&mut self.replicas)?,
            Driver::Sync(_) | Driver::Zero(_) => {
                return Err(Error::value(format!(
                    "joining a running run needs an elastic algorithm (diloco, periodic or hierarchical), not '{}': their sync points admit and heal a joining rank",
                    self.config.algorithm.name()
                )));
            }
        }
        let healed = self.healed();
        self.heal_counters(&healed)?;
        self.host_params = None;
        self.host_params().await?;
        self.state_bytes = self.gather_state_bytes()?;
        Ok(())
    }

    /// The `(joiner, source)` ranks the algorithm's last step (or admission) healed.
    fn healed(&self) -> Vec<(usize, usize)> {
        match &self.driver {
            Driver::DiLoCo(diloco) => diloco.healed().to_vec(),
            Driver::PostLocal(opt) => opt.averager().healed().to_vec(),
            Driver::Sync(_) | Driver::Zero(_) => Vec::new(),
        }
    }

    /// Heals the trainer's own counters of each `(joiner, source)` its algorithm healed: the
    /// step count, the gradient hook's iteration and the ranks present in the reports (the
    /// joiner among them from now on).
    fn heal_counters(&mut self, healed: &[(usize, usize)]) -> Result<()> {
        let local = self.world.local_ranks();
        for &(joiner, source) in healed {
            let mut mine = self.steps.to_le_bytes().to_vec();
            mine.extend(self.hook.iter().to_le_bytes());
            mine.extend(self.present.iter().map(|&p| u8::from(p)));
            let theirs = self.world.heal_bytes(source, joiner, mine)?;
            if local.contains(&joiner) && !local.contains(&source) {
                if theirs.len() != 16 + self.present.len() {
                    return Err(Error::runtime(format!(
                        "rank {source} heals rank {joiner} with {} bytes of trainer counters, not {}",
                        theirs.len(),
                        16 + self.present.len()
                    )));
                }
                let word = |i: usize| {
                    u64::from_le_bytes(theirs[8 * i..8 * i + 8].try_into().expect("8 bytes"))
                };
                self.steps = word(0);
                self.hook.set_iter(word(1));
                self.present = theirs[16..].iter().map(|&p| p != 0).collect();
            }
            if let Some(present) = self.present.get_mut(joiner) {
                *present = true;
            }
        }
        Ok(())
    }

    /// The loss of each replica and of their mean (and the mean's accuracy) on the task's
    /// evaluation samples ([`Task::evaluate`]: the held-out split of a data set).
    ///
    /// # Errors
    /// The task's errors ([`Task::evaluate`]); a `RuntimeError` when reading the parameters back
    /// fails (a GPU error, a lost device) or another process sends another number of values; the
    /// world's errors.
    pub async fn evaluate(&mut self) -> Result<Evaluation> {
        let task = self.task.clone();
        self.host_params().await?;
        let present = self.present_params();
        let mut loss_per_rank = vec![f64::NAN; self.present.len()];
        for (rank, p) in self.present_ranks().into_iter().zip(&present) {
            loss_per_rank[rank] = task.evaluate(p)?.0;
        }
        let (mean_model_loss, mean_model_accuracy) = task.evaluate(&mean_params(&present))?;
        Ok(Evaluation {
            mean_model_loss,
            mean_model_accuracy,
            loss_per_rank,
            held_out: task.held_out(),
            samples: task.evaluation_len(),
        })
    }
}

async fn read_params(replicas: &Replicas) -> Result<Vec<Vec<Vec<f64>>>> {
    replicas
        .all_params()
        .await?
        .iter()
        .map(|rank| rank.iter().map(Tensor::values_f64).collect())
        .collect()
}

/// The mean of the replicas, as rank 0's values plus the mean deviation from them, so that
/// identical replicas have exactly their common value as mean.
fn mean_params(params: &[&[Vec<f64>]]) -> Vec<Vec<f64>> {
    let Some(first) = params.first() else {
        return Vec::new();
    };
    let ranks = params.len() as f64;
    first
        .iter()
        .enumerate()
        .map(|(j, base)| {
            base.iter()
                .enumerate()
                .map(|(i, &x0)| x0 + params.iter().map(|p| p[j][i] - x0).sum::<f64>() / ranks)
                .collect()
        })
        .collect()
}

/// The largest L2 distance of a replica from the mean of the replicas.
fn divergence(params: &[&[Vec<f64>]]) -> f64 {
    let mean = mean_params(params);
    params
        .iter()
        .map(|p| {
            p.iter()
                .zip(&mean)
                .flat_map(|(a, m)| a.iter().zip(m).map(|(a, m)| (a - m) * (a - m)))
                .sum::<f64>()
                .sqrt()
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::super::{SyntheticTask, TaskConfig};
    use super::*;

    #[test]
    fn divergence_of_identical_replicas_is_zero() {
        let p = vec![vec![0.1, 0.7, -3.3], vec![1.0 / 3.0]];
        assert_eq!(divergence(&[p.as_slice(); 3]), 0.0);
        let q = vec![vec![0.1, 0.7, -3.3], vec![1.0 / 3.0 + 2.0]];
        assert!((divergence(&[&p, &q]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn hierarchy() {
        assert_eq!(
            Algorithm::default_hierarchy(8, 8),
            vec![(2, 2), (4, 4), (8, 8)]
        );
        assert_eq!(Algorithm::default_hierarchy(8, 6), vec![(4, 3), (8, 6)]);
        assert_eq!(Algorithm::default_hierarchy(1, 8), vec![(1, 8)]);
        assert_eq!(Algorithm::default_hierarchy(8, 2), vec![(8, 2)]);
    }

    #[test]
    fn bad_configurations_are_errors() {
        let bad = |config: TaskConfig, ranks| SyntheticTask::new(config, ranks).unwrap_err();
        bad(TaskConfig::default(), 0);
        bad(
            TaskConfig {
                classes: 1,
                ..TaskConfig::default()
            },
            2,
        );
        bad(
            TaskConfig {
                samples: 3,
                ..TaskConfig::default()
            },
            4,
        );
        bad(
            TaskConfig {
                heterogeneity: 1.5,
                ..TaskConfig::default()
            },
            4,
        );
        bad(
            TaskConfig {
                features: usize::MAX,
                ..TaskConfig::default()
            },
            4,
        );
        bad(
            TaskConfig {
                hidden: usize::MAX / 2,
                ..TaskConfig::default()
            },
            4,
        );
        let task = Arc::new(
            SyntheticTask::new(
                TaskConfig {
                    samples: 64,
                    ..TaskConfig::default()
                },
                4,
            )
            .unwrap(),
        );
        let backend: Arc<dyn Backend> = Arc::new(crate::CpuBackend::new());
        let make = |config: TrainConfig| Trainer::new(backend.clone(), task.clone(), config);
        assert!(
            make(TrainConfig {
                lr: f64::NAN,
                ..TrainConfig::default()
            })
            .is_err()
        );
        assert!(
            make(TrainConfig {
                lr: -1.0,
                ..TrainConfig::default()
            })
            .is_err()
        );
        assert!(
            make(TrainConfig {
                batch_size: 0,
                ..TrainConfig::default()
            })
            .is_err()
        );
        let algorithm = |algorithm| TrainConfig {
            algorithm,
            ..TrainConfig::default()
        };
        assert!(
            make(algorithm(Algorithm::PostLocalPeriodic {
                period: 0,
                warmup: 0
            }))
            .is_err()
        );
        assert!(
            make(algorithm(Algorithm::PostLocalPeriodic {
                period: u64::MAX,
                warmup: 0
            }))
            .is_err()
        );
        assert!(
            make(algorithm(Algorithm::PostLocalHierarchical {
                levels: vec![(2, 3), (4, 4)],
                warmup: 0,
                subgroup_size: None
            }))
            .is_err()
        );
        assert!(
            make(algorithm(Algorithm::PostLocalHierarchical {
                levels: vec![],
                warmup: 0,
                subgroup_size: None
            }))
            .is_err()
        );
        assert!(
            make(algorithm(Algorithm::PostLocalHierarchical {
                levels: vec![(4, 4)],
                warmup: 0,
                subgroup_size: Some(3)
            }))
            .is_err()
        );
    }
}
