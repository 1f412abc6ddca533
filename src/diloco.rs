//! DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
//! Models", 2023) as torchft's `DiLoCo` runs it: every rank takes `sync_every` inner optimizer
//! steps on its own, then the ranks all-reduce the *pseudo-gradient* (the parameters at the
//! last sync minus the current ones, averaged over the world), reset the parameters to the
//! last sync's values and take one outer optimizer step with that gradient.
//!
//! Inner and outer optimizer are any [`LocalOptimizer`] built over the same [`Replicas`] (as
//! torchft builds both over the model's parameters). The parameters at the last sync are kept
//! in backup arenas on the backend, laid out like the parameters (on the device with the GPU
//! backend); a sync is a pseudo-gradient (two dispatches, the parameters untouched), one
//! all-reduce per storage format, the restore of the parameters, the outer step, and one
//! device copy back into the backup.
//!
//! *Streaming DiLoCo* (Douillard et al., "Streaming DiLoCo with overlapping communication",
//! 2025) splits the parameters into fragments that sync on a staggered schedule. With `F`
//! fragments and `H = sync_every`, fragment `f` syncs after local step `(f+1)·H/F` (mod `H`)
//! of every period, so each parameter still syncs once per `H` inner steps while the traffic
//! is spread over the period. This is torchft 0.2's schedule (`torchft/local_sgd.py`,
//! `DiLoCo._step_post_hook`): torchft counts `H/F` inner steps and then syncs fragment
//! `manager.current_step() % F`, which is fragment 0 first, then 1, ..., one per `H/F` steps.
//! torchft requires `F` to divide `H`; distopt also accepts other `H ≥ F`, with the offsets
//! rounded down. One fragment is plain DiLoCo.
//!
//! Two of torchft's Streaming DiLoCo options are supported (see [`DiLoCoOptions`]):
//!
//! * `fragment_sync_delay` `d` (the paper's τ): fragment `f`'s pseudo-gradient is computed and
//!   its all-reduce *started* after local step `offset_f - d`, and its outer step *applied*
//!   `d` inner steps later, at `offset_f`, so that communication overlaps those inner steps
//!   (which keep updating every parameter, the fragment's included). `d < H / F` (integer
//!   division, torchft's bound), so at most one fragment is in flight. With the synchronous
//!   [`Communicator`] the all-reduce runs to completion at the start point and its result is
//!   held (per format bucket, in an arena laid out like the parameters) until the apply
//!   point; the split of a sync into a start phase (pseudo-gradient and all-reduce) and a
//!   finish phase (outer step and mix) is where a networked communicator can overlap it.
//! * `fragment_update_alpha` `α` in `[0, 1]`: at the apply point the fragment's current
//!   ("local") parameters are saved, the parameters go back to the last sync's, the outer
//!   optimizer steps them ("global"), the global values become the new backup, and the
//!   parameters become `lerp(global, local, α)` (torch's `global.lerp_(local, α)`: α = 0 keeps
//!   the outer step's result and drops the local progress, α = 1 keeps the local parameters).
//!   A given α mixes at every sync, at 0 too, as torchft does (there lerp turns a value that is
//!   not finite into NaN); without one there is no mix, as in the golden `diloco` kind.
//!
//! torchft's `should_quantize` (an fp8 all-reduce that needs CUDA and Triton) is not
//! supported; [`Compression`] is distopt's own, different 16-bit wire format.
//!
//! **Elastic.** Each fragment's all-reduce start is a sync point of the world's membership
//! ([`Communicator::membership`]): the pseudo-gradients are averaged over that point's live
//! ranks only ([`Communicator::all_reduce_mean_live`]), a rank outside it keeps its own
//! pseudo-gradient (it goes on alone), and each rank that joins after the point is healed at
//! the end of the step: the lowest live rank's parameters, backups, in-flight pseudo-gradient
//! and both optimizers' states are copied over its own, so it takes part in the next sync from
//! where the live ranks are. With a world whose membership never changes nothing of this
//! happens; [`crate::comm::SimulatedWorld::with_schedule`] replays a membership schedule.
use std::sync::Arc;

use serde_json::{Value, json};

use crate::backend::kernels::{ConvertArgs, LerpArgs, SgdArgs, SgdScalars};
use crate::backend::{Arena, Backend, CopyRegion, CpuBackend};
use crate::comm::{
    AllReduceMeanArgs, Communicator, InFlightMean, InFlightMembership, MeanOrder, Subgroups,
};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};
use crate::json::{tensor_from_json, tensor_to_json};
use crate::optim::{LocalOptimizer, check_same_model};
use crate::replicas::{Replicas, StateArenas};
use crate::transfer;

/// The precision DiLoCo sends its pseudo-gradients in (OpenDiLoCo's compressed all-reduce).
///
/// With a 16-bit wire format, each rank's pseudo-gradient (computed in the parameter's dtype)
/// is rounded to the wire format (round to nearest even, as c10 does), the mean over the world
/// is computed *in the wire format* as torchft's all-reduce of a 16-bit tensor over gloo does:
/// summed with every addition rounded to the wire format (in rank order when one process holds
/// the world, in the transport's order over MPI, whose 16-bit all-reduce rounds every addition
/// the same way), then divided by the world size and rounded, and the mean is converted back
/// to the parameter's dtype before the outer step (exactly for float32/float64 parameters;
/// between bfloat16 and float16 it rounds once, to nearest even). `CommStats` counts the all-reduce
/// at the wire format's element size. Parameters already in the wire format are unchanged by
/// the conversions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Compression {
    /// Pseudo-gradients travel in each parameter's own dtype (the reference behaviour).
    #[default]
    #[serde(rename = "none")]
    None,
    /// bfloat16 on the wire.
    #[serde(rename = "bf16")]
    BFloat16,
    /// IEEE float16 on the wire.
    #[serde(rename = "f16")]
    Float16,
}

impl Compression {
    /// Parses `"none"`, `"bf16"`/`"bfloat16"` or `"f16"`/`"fp16"`/`"float16"`; a `ValueError`
    /// naming the accepted values otherwise.
    ///
    /// # Errors
    /// A `ValueError` for any other name.
    pub fn parse(name: &str) -> Result<Compression> {
        match name {
            "none" => Ok(Compression::None),
            "bf16" | "bfloat16" => Ok(Compression::BFloat16),
            "f16" | "fp16" | "float16" => Ok(Compression::Float16),
            other => Err(Error::value(format!(
                "compression must be one of 'none', 'bf16', 'f16', got '{other}'"
            ))),
        }
    }

    /// The compression of a front end's DiLoCo options object (`{"compress": "bf16"}`; `null`
    /// or a missing key: none). A `TypeError` for an options value that is not an object, an
    /// unknown option or a `compress` that is not a string; a `ValueError` for an unknown
    /// format.
    ///
    /// # Errors
    /// A `TypeError` when `options` is neither `null` nor an object, has a key other than
    /// `compress`, or its `compress` is neither `null` nor a string; a `ValueError` for a format
    /// [`Compression::parse`] does not know.
    pub fn from_options(options: &Value) -> Result<Compression> {
        let map = match options {
            Value::Null => return Ok(Compression::None),
            Value::Object(map) => map,
            other => {
                return Err(Error::type_error(format!(
                    "DiLoCo options must be an object, got {other}"
                )));
            }
        };
        if let Some(key) = map.keys().find(|k| k.as_str() != "compress") {
            return Err(Error::type_error(format!(
                "DiLoCo got an unexpected keyword argument '{key}'"
            )));
        }
        match map.get("compress") {
            None | Some(Value::Null) => Ok(Compression::None),
            Some(Value::String(name)) => Compression::parse(name),
            Some(other) => Err(Error::type_error(format!(
                "compress must be a string ('none', 'bf16' or 'f16'), got {other}"
            ))),
        }
    }

    /// The canonical name: `"none"`, `"bf16"` or `"f16"`.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::BFloat16 => "bf16",
            Compression::Float16 => "f16",
        }
    }

    /// Whether this is [`Compression::None`].
    pub fn is_none(&self) -> bool {
        *self == Compression::None
    }

    /// The wire storage format, `None` without compression.
    pub fn wire_format(self) -> Option<StorageFormat> {
        match self {
            Compression::None => None,
            Compression::BFloat16 => Some(StorageFormat::BF16),
            Compression::Float16 => Some(StorageFormat::F16),
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = crate::error::Error;

    /// As [`Compression::parse`].
    fn from_str(name: &str) -> crate::error::Result<Compression> {
        Compression::parse(name)
    }
}

/// A front end's DiLoCo options: the wire format, the fragments of Streaming DiLoCo and
/// torchft's two Streaming DiLoCo knobs (see the module documentation).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DiLoCoOptions {
    /// The pseudo-gradients' wire precision.
    pub compression: Compression,
    /// The fragments' global parameter indices; `None`: one fragment of every parameter.
    pub fragments: Option<Vec<Vec<usize>>>,
    /// torchft's `fragment_sync_delay`: inner steps between a fragment's all-reduce start and
    /// its outer step (0: both at the sync point).
    pub fragment_sync_delay: i64,
    /// torchft's `fragment_update_alpha`: the weight of the local parameters when the outer
    /// step's result is mixed with them, `global.lerp_(local, α)`. `None` (the default): no
    /// mix, the outer step's result as it is (the paper's DiLoCo; the `diloco` golden kind).
    /// `Some(α)`: torchft's mix, which it makes even at `α = 0`, where it keeps the outer
    /// step's result but turns every value that is not finite in either into NaN.
    pub fragment_update_alpha: Option<f64>,
}

impl DiLoCoOptions {
    /// The options of a front end's DiLoCo options object: `{"compress": "bf16", "fragments":
    /// [[0, 1], [2]], "fragmentSyncDelay": 1, "fragmentUpdateAlpha": 0.5}` (every key optional,
    /// `null` for its default; `null` options: all defaults).
    ///
    /// # Errors
    /// A `TypeError` when `options` is neither `null` nor an object, has an unknown key, or a
    /// value of the wrong type (`compress` not a string, `fragments` not a list of lists of
    /// non-negative integers, `fragmentSyncDelay` not an integer, `fragmentUpdateAlpha` not a
    /// number); a `ValueError` for an unknown wire format, and for `shouldQuantize` (torchft's
    /// fp8 all-reduce, which distopt does not support). The values themselves are checked by
    /// [`DiLoCoOptions::check`].
    pub fn from_options(options: &Value) -> Result<DiLoCoOptions> {
        let map = match options {
            Value::Null => return Ok(DiLoCoOptions::default()),
            Value::Object(map) => map,
            other => {
                return Err(Error::type_error(format!(
                    "DiLoCo options must be an object, got {other}"
                )));
            }
        };
        const KEYS: [&str; 4] = [
            "compress",
            "fragments",
            "fragmentSyncDelay",
            "fragmentUpdateAlpha",
        ];
        for key in map.keys() {
            if key == "shouldQuantize" || key == "should_quantize" {
                return Err(Error::value(
                    "shouldQuantize (torchft's fp8 quantized all-reduce, CUDA and Triton only) is \
                     not supported; compress: 'bf16' or 'f16' sends the pseudo-gradients in 16 bits",
                ));
            }
            if !KEYS.contains(&key.as_str()) {
                return Err(Error::type_error(format!(
                    "DiLoCo got an unexpected keyword argument '{key}'"
                )));
            }
        }
        let compression = match map.get("compress") {
            None | Some(Value::Null) => Compression::None,
            Some(Value::String(name)) => Compression::parse(name)?,
            Some(other) => {
                return Err(Error::type_error(format!(
                    "compress must be a string ('none', 'bf16' or 'f16'), got {other}"
                )));
            }
        };
        let fragments = match map.get("fragments") {
            None | Some(Value::Null) => None,
            Some(value) => Some(fragments_of(value)?),
        };
        let fragment_sync_delay = match map.get("fragmentSyncDelay") {
            None | Some(Value::Null) => 0,
            Some(value) => value.as_i64().ok_or_else(|| {
                Error::type_error(format!("fragmentSyncDelay must be an integer, got {value}"))
            })?,
        };
        let fragment_update_alpha = match map.get("fragmentUpdateAlpha") {
            None | Some(Value::Null) => None,
            Some(value) => Some(value.as_f64().ok_or_else(|| {
                Error::type_error(format!("fragmentUpdateAlpha must be a number, got {value}"))
            })?),
        };
        Ok(DiLoCoOptions {
            compression,
            fragments,
            fragment_sync_delay,
            fragment_update_alpha,
        })
    }

    /// The checks DiLoCo makes on these options before it builds anything, for a model of
    /// `params` parameters syncing every `sync_every` inner steps (as
    /// [`DiLoCo::with_options`]).
    ///
    /// # Errors
    /// The fragments' errors (see [`DiLoCo::streaming`]); a `ValueError` when
    /// `fragment_sync_delay` is negative or not smaller than `sync_every / F` (integer division,
    /// torchft's bound: a fragment's all-reduce must be applied before the next one starts), or
    /// `fragment_update_alpha` is not in `[0, 1]` (NaN included).
    pub fn check(&self, params: usize, sync_every: i64) -> Result<()> {
        let count = match &self.fragments {
            Some(fragments) => {
                check_fragments(params, fragments, sync_every.max(1) as u64)?;
                fragments.len()
            }
            None => 1,
        };
        check_streaming(
            sync_every.max(1) as u64,
            count,
            self.fragment_sync_delay,
            self.fragment_update_alpha,
        )
    }
}

/// A list of lists of parameter indices (a `TypeError` otherwise).
fn fragments_of(value: &Value) -> Result<Vec<Vec<usize>>> {
    let bad = || {
        Error::type_error(format!(
            "fragments must be a list of lists of parameter indices, got {value}"
        ))
    };
    value
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|f| {
            f.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|j| j.as_u64().map(|j| j as usize).ok_or_else(bad))
                .collect()
        })
        .collect()
}

/// torchft's checks of `fragment_sync_delay` and `fragment_update_alpha`.
fn check_streaming(
    sync_every: u64,
    fragments: usize,
    delay: i64,
    alpha: Option<f64>,
) -> Result<()> {
    if delay < 0 {
        return Err(Error::value(format!(
            "fragment_sync_delay must be a non-negative integer, got {delay}"
        )));
    }
    let window = sync_every / fragments.max(1) as u64;
    if delay as u64 >= window {
        return Err(Error::value(format!(
            "Fragment must be synced before it is reduced another time: fragment_sync_delay \
             ({delay}) must be smaller than sync_every // fragments ({sync_every} // {fragments} \
             = {window})"
        )));
    }
    if let Some(alpha) = alpha.filter(|alpha| !(0.0..=1.0).contains(alpha)) {
        return Err(Error::value(format!(
            "fragment_update_alpha must be between 0 and 1, got {}",
            crate::pyfmt::float_repr(alpha)
        )));
    }
    Ok(())
}

/// Where a sync's pseudo-gradient is computed and all-reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The replicas' gradient arenas (no delay: the outer step follows at once).
    Grads,
    /// DiLoCo's scratch arenas, held there until the apply point (a delay).
    Scratch,
}

/// The mean of `arena` over the live ranks of a sync point's `membership`: for a delayed
/// fragment ([`Target::Scratch`]) started, and `Some` while it travels (a world of processes);
/// otherwise taken now, over the membership agreed at once.
///
/// # Errors
/// The world's (those of [`Communicator::all_reduce_mean_live`]).
fn mean_of(
    world: &dyn Communicator,
    backend: &dyn Backend,
    arena: &mut Arena,
    membership: &InFlightMembership,
    target: Target,
    mean: AllReduceMeanArgs<'_>,
) -> Result<Option<InFlightMean>> {
    if target == Target::Scratch {
        let mean = world.start_all_reduce_mean_in(backend, arena, membership, mean)?;
        return Ok((!mean.is_done()).then_some(mean));
    }
    let live = membership.agreed().map_or(&[][..], |m| m.live.as_slice());
    world.all_reduce_mean_live(backend, arena, live, mean)?;
    Ok(None)
}

/// One bucket's all-reduce of the fragment in flight, still travelling (a world of processes
/// moves it while the inner steps run: [`Communicator::start_all_reduce_mean_in`]).
#[derive(Debug)]
struct Travelling {
    bucket: usize,
    /// The bucket's members in the fragment.
    active: Vec<bool>,
    /// Whether the mean travels in the bucket's wire arena (compressed), to be widened into the
    /// scratch arena once it arrives.
    compressed: bool,
    mean: InFlightMean,
}

/// DiLoCo: inner steps on every rank, and every `sync_every` of them an outer step with the
/// world's mean pseudo-gradient.
///
/// ```
/// use distopt::BlockOn;
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
/// assert_eq!(model.param(1, 0).block_on().unwrap().values_f64().unwrap(), vec![-0.5]);
/// ```
#[derive(Debug)]
pub struct DiLoCo {
    inner: Box<dyn LocalOptimizer>,
    outer: Box<dyn LocalOptimizer>,
    world: Arc<dyn Communicator>,
    sync_every: u64,
    /// Inner steps since the start of the current period, in `0..sync_every`.
    local_step: u64,
    /// The global parameter indices of each fragment (every parameter in exactly one).
    fragments: Vec<Vec<usize>>,
    /// Fragment `f`'s outer step is applied when `local_step` becomes `offsets[f]`.
    offsets: Vec<u64>,
    /// Every local rank's parameters at their fragment's last sync (laid out like the
    /// parameters, one arena per format bucket).
    backups: StateArenas,
    /// The pseudo-gradients' wire precision.
    compression: Compression,
    /// Per format bucket, the wire-format arena of the compressed all-reduce (created on the
    /// first compressed sync of a bucket whose format differs from the wire format).
    wire: Vec<Option<Arena>>,
    /// torchft's `fragment_sync_delay`.
    delay: u64,
    /// torchft's `fragment_update_alpha` (`None`: no mix).
    alpha: Option<f64>,
    /// Laid out like the parameters, created on first use: the in-flight fragment's
    /// all-reduced pseudo-gradient during its delay window, then (an α given) the fragment's
    /// local parameters while the outer step runs.
    scratch: StateArenas,
    /// The fragment whose all-reduce has started and whose outer step is not applied yet.
    pending: Option<usize>,
    /// The pending fragment's all-reduces still travelling, per bucket (empty once they
    /// arrived in the scratch arenas: always, in a world that reduces at once).
    travelling: Vec<Travelling>,
    /// The membership of the pending fragment's sync point, until its outer step: the ranks
    /// it admits are healed then.
    agreeing: Option<InFlightMembership>,
    /// The ranks admitted by this step's sync points, with the rank each is healed from at the
    /// step's end.
    joining: Vec<(usize, usize)>,
    /// The `(joiner, source)` pairs the last step (or sync, or admission) healed.
    healed: Vec<(usize, usize)>,
    ranks: usize,
    params: usize,
}

impl DiLoCo {
    /// Wraps an inner and an outer optimizer built over `replicas` (this process's ranks of
    /// `world`), syncing every `sync_every` inner steps. The current parameters become the
    /// first sync point. A `ValueError` when `sync_every < 1` or when `replicas` does not hold
    /// the world's local ranks.
    ///
    /// # Errors
    /// As [`DiLoCo::streaming`] with one fragment of every parameter: a `ValueError` when
    /// `sync_every < 1`, when `replicas` does not hold the world's local ranks, or when the model
    /// has no parameters (an empty fragment); a `RuntimeError` when the backup of the parameters
    /// does not fit the memory budget or the backend fails (a GPU error, a lost device).
    pub fn new(
        replicas: &Replicas,
        inner: Box<dyn LocalOptimizer>,
        outer: Box<dyn LocalOptimizer>,
        sync_every: i64,
        world: Arc<dyn Communicator>,
    ) -> Result<DiLoCo> {
        let all = (0..replicas.len()).collect();
        Self::streaming(replicas, inner, outer, sync_every, vec![all], world)
    }

    /// Streaming DiLoCo: as [`DiLoCo::new`], with the parameters split into `fragments`
    /// (global parameter indices; every parameter in exactly one) that sync on a staggered
    /// schedule (see the module documentation). A `ValueError` for a list that is not such a
    /// partition, or when `sync_every` is smaller than the number of fragments.
    ///
    /// # Errors
    /// The `ValueError`s of [`DiLoCo::check_arguments`]; a `ValueError` when `fragments` or one of
    /// them is empty, a parameter is in two fragments or in none, or there are more fragments than
    /// `sync_every`; an `IndexError` for a parameter index out of range; a `RuntimeError` when the
    /// backup of the parameters does not fit the memory budget or the backend fails (a GPU error, a
    /// lost device).
    pub fn streaming(
        replicas: &Replicas,
        inner: Box<dyn LocalOptimizer>,
        outer: Box<dyn LocalOptimizer>,
        sync_every: i64,
        fragments: Vec<Vec<usize>>,
        world: Arc<dyn Communicator>,
    ) -> Result<DiLoCo> {
        let options = DiLoCoOptions {
            fragments: Some(fragments),
            ..DiLoCoOptions::default()
        };
        Self::with_options(replicas, inner, outer, sync_every, world, options)
    }

    /// DiLoCo with every option: the wire format, the fragments (`None`: one of every
    /// parameter), `fragment_sync_delay` and `fragment_update_alpha` (see the module
    /// documentation).
    ///
    /// # Errors
    /// The `ValueError`s of [`DiLoCo::check_arguments`] and [`DiLoCoOptions::check`] (and its
    /// `IndexError` for a parameter index out of range); a `RuntimeError` when the backup of the
    /// parameters does not fit the memory budget or the backend fails (a GPU error, a lost
    /// device).
    pub fn with_options(
        replicas: &Replicas,
        inner: Box<dyn LocalOptimizer>,
        outer: Box<dyn LocalOptimizer>,
        sync_every: i64,
        world: Arc<dyn Communicator>,
        options: DiLoCoOptions,
    ) -> Result<DiLoCo> {
        Self::check_arguments(replicas, sync_every, world.as_ref())?;
        options.check(replicas.len(), sync_every)?;
        let fragments = options
            .fragments
            .unwrap_or_else(|| vec![(0..replicas.len()).collect()]);
        check_fragments(replicas.len(), &fragments, sync_every as u64)?;
        let backups = StateArenas::copy_of_params(replicas)?;
        let h = sync_every as u64;
        let count = fragments.len() as u64;
        let offsets = (0..count).map(|f| (f + 1) * h / count % h).collect();
        Ok(DiLoCo {
            inner,
            outer,
            world,
            sync_every: h,
            local_step: 0,
            fragments,
            offsets,
            wire: replicas.buckets().iter().map(|_| None).collect(),
            backups,
            compression: options.compression,
            delay: options.fragment_sync_delay as u64,
            alpha: options.fragment_update_alpha,
            scratch: StateArenas::empty(replicas.buckets().len()),
            pending: None,
            travelling: Vec::new(),
            agreeing: None,
            joining: Vec::new(),
            healed: Vec::new(),
            ranks: replicas.ranks(),
            params: replicas.len(),
        })
    }

    /// The checks [`DiLoCo::new`] makes before it builds anything: `sync_every >= 1`, and
    /// `replicas` holds `world`'s local ranks. A front end that must keep the optimizers when
    /// construction fails calls it (and [`DiLoCoOptions::check`]) before handing them over.
    ///
    /// # Errors
    /// A `ValueError` when `sync_every < 1` or `replicas` does not hold one replica per local rank
    /// of `world`.
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

    /// Sends the pseudo-gradients in `compression`'s wire format from the next sync on (see
    /// [`Compression`]); every rank must choose the same. A fragment already in flight keeps
    /// the result of its all-reduce.
    pub fn set_compression(&mut self, compression: Compression) {
        self.compression = compression;
    }

    /// [`DiLoCo::set_compression`], by value.
    pub fn with_compression(mut self, compression: Compression) -> DiLoCo {
        self.set_compression(compression);
        self
    }

    /// The pseudo-gradients' wire precision.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// torchft's `fragment_sync_delay`: inner steps between a fragment's all-reduce start and
    /// its outer step.
    pub fn fragment_sync_delay(&self) -> u64 {
        self.delay
    }

    /// torchft's `fragment_update_alpha`: the local parameters' weight in the mix after an
    /// outer step (`None`: no mix, see [`DiLoCoOptions::fragment_update_alpha`]).
    pub fn fragment_update_alpha(&self) -> Option<f64> {
        self.alpha
    }

    /// The fragment whose all-reduce has started and whose outer step waits (inside its delay
    /// window), if any.
    pub fn pending_fragment(&self) -> Option<usize> {
        self.pending
    }

    /// The inner optimizer.
    pub fn inner(&self) -> &(dyn LocalOptimizer + 'static) {
        self.inner.as_ref()
    }

    /// The outer optimizer.
    pub fn outer(&self) -> &(dyn LocalOptimizer + 'static) {
        self.outer.as_ref()
    }

    /// Inner steps between syncs.
    pub fn sync_every(&self) -> u64 {
        self.sync_every
    }

    /// Inner steps since the start of the current period (for plain DiLoCo: since the last
    /// sync), in `0..sync_every`.
    pub fn local_step(&self) -> u64 {
        self.local_step
    }

    /// The fragments' global parameter indices.
    pub fn fragments(&self) -> &[Vec<usize>] {
        &self.fragments
    }

    /// For each fragment, the value of [`DiLoCo::local_step`] at which its outer step is
    /// applied (right after the inner step that brings the counter there).
    pub fn sync_schedule(&self) -> &[u64] {
        &self.offsets
    }

    /// For each fragment, the value of [`DiLoCo::local_step`] at which its pseudo-gradient's
    /// all-reduce starts: `fragment_sync_delay` steps before its [`DiLoCo::sync_schedule`]
    /// point (mod `sync_every`), the same point without a delay.
    pub fn start_schedule(&self) -> Vec<u64> {
        let h = self.sync_every;
        self.offsets
            .iter()
            .map(|&o| (o + h - self.delay) % h)
            .collect()
    }

    /// The fragment in flight at counter value `local_step`: the one whose start point lies
    /// 1 to `delay` steps before it (mod `sync_every`).
    fn in_window(&self, local_step: u64) -> Option<usize> {
        let h = self.sync_every;
        (self.delay > 0)
            .then(|| {
                self.offsets.iter().position(|&o| {
                    let ahead = (o + h - local_step) % h;
                    (1..=self.delay).contains(&ahead)
                })
            })
            .flatten()
    }

    /// The inner optimizer's `zero_grad(set_to_none=True)`.
    pub fn zero_grad(&self, replicas: &mut Replicas) {
        self.inner.zero_grad(replicas);
    }

    /// One inner step on every rank (parameters without a gradient skipped), then the sync
    /// work due at this step, if any: the outer step of the fragment whose sync point this is
    /// (for plain DiLoCo: every `sync_every` inner steps), and, with a `fragment_sync_delay`,
    /// the start of the next fragment's all-reduce. Returns whether an outer step was applied.
    ///
    /// # Errors
    /// As [`DiLoCo::step_fragments`].
    pub fn step(&mut self, replicas: &mut Replicas) -> Result<bool> {
        Ok(!self.step_fragments(replicas)?.is_empty())
    }

    /// [`DiLoCo::step`], returning the fragments whose outer step was applied.
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than DiLoCo was built for; the
    /// inner optimizer's errors ([`LocalOptimizer::step`]); when sync work is due, its errors (the
    /// backend's, the world's and the outer optimizer's).
    ///
    /// A failed step does not count: the step counter stays where it was, so the next step
    /// reaches the same sync point again. The inner step has been taken (its parameters and
    /// inner state stay updated). When the all-reduce fails (or the backend before it), the
    /// parameters, their backup, the outer optimizer and any fragment in flight are as before
    /// the step's sync; without a delay, the syncing fragment's gradients, overwritten by the
    /// pseudo-gradient, are cleared (`None`). A failure after the all-reduce (the outer
    /// optimizer's or the backend's, at the apply point) leaves the fragment's parameters
    /// partly synced.
    pub fn step_fragments(&mut self, replicas: &mut Replicas) -> Result<Vec<usize>> {
        check_same_model(replicas, self.ranks, self.params)?;
        self.joining.clear();
        self.healed.clear();
        self.inner.step(replicas)?;
        if let Some(membership) = &self.agreeing {
            // A world with no thread to agree on moves the sync point in flight on here.
            self.world.progress_membership(membership);
        }
        let next = (self.local_step + 1) % self.sync_every;
        let mut applied = Vec::new();
        for f in 0..self.fragments.len() {
            if self.offsets[f] != next {
                continue;
            }
            if self.pending != Some(f) {
                // No delay (or none started: the start and apply points coincide).
                self.start(replicas, f, Target::Grads)?;
            }
            self.finish(replicas, f)?;
            applied.push(f);
        }
        if self.delay > 0 {
            let h = self.sync_every;
            if let Some(f) =
                (0..self.fragments.len()).find(|&f| (self.offsets[f] + h - self.delay) % h == next)
            {
                self.start(replicas, f, Target::Scratch)?;
                self.pending = Some(f);
            }
        }
        self.heal(replicas, next)?;
        self.local_step = next;
        Ok(applied)
    }

    /// The outer step now, for every fragment, and a new period from here. A fragment in
    /// flight is applied with its all-reduce's result; the others compute, all-reduce and
    /// apply their pseudo-gradient now.
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than DiLoCo was built for; the
    /// backend's and the world's errors (a `RuntimeError` for a GPU error, a lost device, or a wire
    /// arena over the memory budget); the outer optimizer's errors ([`LocalOptimizer::step`]).
    /// Fragments synced before a failure stay synced; the counter is reset only on success.
    pub fn sync(&mut self, replicas: &mut Replicas) -> Result<()> {
        check_same_model(replicas, self.ranks, self.params)?;
        self.joining.clear();
        self.healed.clear();
        let in_flight = self.pending;
        if let Some(f) = in_flight {
            self.finish(replicas, f)?;
        }
        for f in 0..self.fragments.len() {
            if Some(f) == in_flight {
                continue;
            }
            self.start(replicas, f, Target::Grads)?;
            self.finish(replicas, f)?;
        }
        self.pending = None;
        self.heal(replicas, 0)?;
        self.local_step = 0;
        Ok(())
    }

    /// Takes this process's rank into a running run (a process started to join an elastic
    /// run, `distopt train --join`): waits for the sync point of the world that admits it (a
    /// membership with this rank joining) and is healed there from that point's lowest live
    /// rank, as the live ranks heal it at the end of that step: parameters, backups, in-flight
    /// pseudo-gradient, inner and outer optimizer states and the schedule's counters. The next
    /// [`DiLoCo::step`] is then the live ranks' next step.
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than DiLoCo was built for;
    /// a `RuntimeError` when the world's next membership does not admit this process's ranks;
    /// the world's errors (its membership, the heal's transfers).
    pub fn admit(&mut self, replicas: &mut Replicas) -> Result<()> {
        check_same_model(replicas, self.ranks, self.params)?;
        self.joining.clear();
        self.healed.clear();
        let membership = self.world.membership()?;
        let local = self.world.local_ranks();
        let source = membership.source();
        match source {
            Some(source) if membership.joining.iter().any(|r| local.contains(r)) => {
                self.joining = membership.joining.iter().map(|&r| (r, source)).collect();
            }
            _ => {
                return Err(Error::runtime(format!(
                    "sync point {} did not admit this process's ranks ({}..{}): it holds no joining rank",
                    membership.epoch, local.start, local.end
                )));
            }
        }
        self.heal(replicas, self.local_step)
    }

    /// The `(joiner, source)` ranks the last step, sync or admission healed (a caller holding
    /// more state, such as the trainer's counters, heals it too).
    pub fn healed(&self) -> &[(usize, usize)] {
        &self.healed
    }

    /// Heals the ranks this step's sync points admitted: each gets its source rank's
    /// parameters, backups, in-flight pseudo-gradient, inner and outer optimizer states and
    /// the schedule's counters (`local_step`, the step's local step once it is over, and the
    /// fragment in flight), so that it starts the next period exactly where the live ranks
    /// are. Across processes the world transfers them (`Communicator::heal_rows`).
    ///
    /// # Errors
    /// The world's errors (a `RuntimeError` when it cannot heal across processes and the two
    /// ranks are in different ones); the backend's errors.
    fn heal(&mut self, replicas: &mut Replicas, local_step: u64) -> Result<()> {
        if !self.joining.is_empty() {
            // A joiner is healed with the fragment in flight's mean: it must have arrived.
            self.settle(replicas)?;
        }
        let world = self.world.clone();
        let local = world.local_ranks();
        for (joiner, source) in std::mem::take(&mut self.joining) {
            replicas.heal_params(world.as_ref(), source, joiner)?;
            self.backups
                .heal(world.as_ref(), replicas, source, joiner)?;
            self.scratch
                .heal(world.as_ref(), replicas, source, joiner)?;
            self.inner
                .heal_rank_state(world.as_ref(), replicas, source, joiner)?;
            self.outer
                .heal_rank_state(world.as_ref(), replicas, source, joiner)?;
            let pending = self.pending.map_or(u64::MAX, |f| f as u64);
            let counters = [local_step.to_le_bytes(), pending.to_le_bytes()].concat();
            let counters = world.heal_bytes(source, joiner, counters)?;
            if local.contains(&joiner) && !local.contains(&source) {
                let word = |i: usize| {
                    counters
                        .get(8 * i..8 * i + 8)
                        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                };
                let (Some(step), Some(pending)) = (word(0), word(1)) else {
                    return Err(Error::runtime(format!(
                        "rank {source} heals rank {joiner} with {} bytes of DiLoCo counters, not 16",
                        counters.len()
                    )));
                };
                if step >= self.sync_every
                    || (pending != u64::MAX && pending >= self.fragments.len() as u64)
                {
                    return Err(Error::runtime(format!(
                        "rank {source} heals rank {joiner} with local step {step} and fragment {pending} in flight, outside this DiLoCo's {} steps and {} fragments",
                        self.sync_every,
                        self.fragments.len()
                    )));
                }
                self.local_step = step;
                self.pending = (pending != u64::MAX).then_some(pending as usize);
            }
            self.healed.push((joiner, source));
        }
        Ok(())
    }

    /// Fragment `f`'s members as a per-parameter mask.
    fn member_mask(&self, f: usize) -> Vec<bool> {
        let mut member = vec![false; self.params];
        for &j in &self.fragments[f] {
            member[j] = true;
        }
        member
    }

    /// Every rank's copy regions of the members of bucket `b` flagged in `member` (the same
    /// offsets in both arenas).
    fn regions(replicas: &Replicas, b: usize, member: &[bool]) -> Vec<CopyRegion> {
        let members: Vec<usize> = replicas.buckets()[b]
            .members()
            .iter()
            .copied()
            .filter(|&j| member[j])
            .collect();
        replicas.same_place_regions(&members)
    }

    /// SGD settings (every rank, every member of a bucket) that make `Backend::sgd` compute
    /// `p - g` for the `active` members: `backup - params` rounded once to the format, as the
    /// pseudo-gradient is.
    fn sgd_scalars(ranks: usize, active: &[bool]) -> Vec<SgdScalars> {
        (0..ranks)
            .flat_map(|_| active.iter())
            .map(|&active| SgdScalars {
                active,
                lr: 1.0,
                one_minus_dampening: 1.0,
                ..SgdScalars::default()
            })
            .collect()
    }

    /// The start of fragment `f`'s sync: every rank's pseudo-gradient `backup - params` of the
    /// fragment (in the parameter's dtype; the parameters are not changed) into `target`,
    /// all-reduced to the world's mean (in the wire format when compressed).
    ///
    /// On an error the parameters, the backups and the pending fragment are unchanged; with
    /// [`Target::Grads`] the fragment's gradients are cleared (their values are gone).
    fn start(&mut self, replicas: &mut Replicas, f: usize, target: Target) -> Result<()> {
        let member = self.member_mask(f);
        let result = self.start_inner(replicas, &member, target);
        if result.is_err() && target == Target::Grads {
            for rank in 0..self.ranks {
                for &j in &self.fragments[f] {
                    replicas.set_has_grad(rank, j, false);
                }
            }
        }
        result
    }

    fn start_inner(
        &mut self,
        replicas: &mut Replicas,
        member: &[bool],
        target: Target,
    ) -> Result<()> {
        let backend = replicas.backend().clone();
        let subgroups = Subgroups::world(self.world.world_size());
        // A delayed fragment's sync point is agreed on while the inner steps run.
        let membership = match target {
            Target::Scratch => self.world.start_membership()?,
            Target::Grads => InFlightMembership::done(self.world.membership()?),
        };
        let wire = self.compression.wire_format();
        let plans: Vec<(Vec<bool>, u64, Vec<CopyRegion>)> = (0..replicas.buckets().len())
            .map(|b| {
                let bucket = &replicas.buckets()[b];
                let bytes = bucket
                    .members()
                    .iter()
                    .filter(|&&j| member[j])
                    .map(|&j| {
                        let size =
                            wire.map_or(replicas.dtype(j).size_bytes(), |w| w.element_bytes());
                        (replicas.numel(j) * size) as u64
                    })
                    .sum();
                (
                    bucket.mask(member),
                    bytes,
                    Self::regions(replicas, b, member),
                )
            })
            .collect();
        if target == Target::Scratch {
            for (b, (active, _, _)) in plans.iter().enumerate() {
                if active.contains(&true) {
                    self.scratch.ensure(replicas, b)?;
                }
            }
        }
        let ranks = self.ranks;
        // Dropped (abandoned) unless every bucket starts.
        let mut travelling = Vec::new();
        for (b, (bucket, (active, bytes, regions))) in
            replicas.buckets_mut().iter_mut().zip(&plans).enumerate()
        {
            if !active.contains(&true) {
                continue;
            }
            let format = bucket.format();
            let (rank_len, chunk_len) = (bucket.rank_len(), bucket.chunk_len());
            let (params, grads, starts) = bucket.arenas_mut();
            let backup = self.backups.get(b).expect("every bucket has its backup");
            let out: &mut Arena = match target {
                Target::Grads => grads,
                Target::Scratch => self.scratch.get_mut(b).expect("ensured above"),
            };
            // out = backup, then out = backup - 1·params: the pseudo-gradient, rounded once to
            // the format (as `backup - params`), the parameters untouched.
            if !regions.is_empty() {
                backend.copy_regions(backup, out, regions)?;
            }
            let scalars = Self::sgd_scalars(ranks, active);
            backend.sgd(SgdArgs {
                params: out,
                grads: params,
                momentum: None,
                starts,
                scalars: &scalars,
            })?;
            if let Some(wire) = wire.filter(|&w| w != format) {
                // Compressed: round to the wire format, average in it, widen back.
                let wire_arena = &mut self.wire[b];
                if wire_arena.is_none() {
                    // A host bucket (float64 on a GPU backend) gets a host wire arena.
                    let maker: &dyn Backend = if params.is_on_device() {
                        backend.as_ref()
                    } else {
                        &CpuBackend::with_threads(1)
                    };
                    *wire_arena =
                        Some(maker.create_arena(wire, params.ranks(), rank_len, chunk_len)?);
                }
                let arena = wire_arena.as_mut().expect("created above");
                backend.convert(ConvertArgs {
                    src: out,
                    dst: arena,
                    starts,
                    active,
                })?;
                let mean = AllReduceMeanArgs {
                    groups: subgroups,
                    arith: wire,
                    starts,
                    active,
                    bytes_per_rank: *bytes,
                    order: MeanOrder::SumThenDivide,
                };
                let world = self.world.as_ref();
                if let Some(mean) =
                    mean_of(world, backend.as_ref(), arena, &membership, target, mean)?
                {
                    travelling.push(Travelling {
                        bucket: b,
                        active: active.clone(),
                        compressed: true,
                        mean,
                    });
                    continue;
                }
                backend.convert(ConvertArgs {
                    src: arena,
                    dst: out,
                    starts,
                    active,
                })?;
                continue;
            }
            // The reference all-reduces each pseudo-gradient in its own dtype.
            let mean = AllReduceMeanArgs {
                groups: subgroups,
                arith: format,
                starts,
                active,
                bytes_per_rank: *bytes,
                // torchft's `Manager.allreduce`: SUM, then `tensor /= num_participants`.
                order: MeanOrder::SumThenDivide,
            };
            let world = self.world.as_ref();
            if let Some(mean) = mean_of(world, backend.as_ref(), out, &membership, target, mean)? {
                travelling.push(Travelling {
                    bucket: b,
                    active: active.clone(),
                    compressed: false,
                    mean,
                });
            }
        }
        self.travelling = travelling;
        if target == Target::Scratch {
            // Its joiners are healed at the fragment's outer step (`settle`).
            self.agreeing = Some(membership);
            return Ok(());
        }
        if let Some(agreed) = membership.agreed() {
            self.admit_joining(agreed);
        }
        Ok(())
    }

    /// The ranks `membership` admits, to heal at this step's end from its source.
    fn admit_joining(&mut self, membership: &crate::comm::Membership) {
        if let Some(source) = membership.source() {
            self.joining
                .extend(membership.joining.iter().map(|&rank| (rank, source)));
        }
    }

    /// Waits for the pending fragment's sync point: its membership, whose joiners are healed
    /// at this step's end, and its all-reduces still travelling, whose means go to the scratch
    /// arenas (widened from the wire format when compressed), where a world that reduces at
    /// once left them at the start.
    ///
    /// # Errors
    /// The world's errors (those of [`Communicator::membership`] and
    /// [`Communicator::all_reduce_mean_live`]) and the backend's. The means that did not
    /// arrive are abandoned.
    fn settle(&mut self, replicas: &mut Replicas) -> Result<()> {
        if let Some(membership) = self.agreeing.take() {
            let agreed = self.world.finish_membership(membership)?;
            self.admit_joining(&agreed);
        }
        let backend = replicas.backend().clone();
        for t in std::mem::take(&mut self.travelling) {
            let bucket = &mut replicas.buckets_mut()[t.bucket];
            let (_, _, starts) = bucket.arenas_mut();
            let out = self.scratch.get_mut(t.bucket).expect("started in flight");
            if !t.compressed {
                self.world
                    .finish_all_reduce_mean_live(backend.as_ref(), out, t.mean)?;
                continue;
            }
            let arena = self.wire[t.bucket].as_mut().expect("started in flight");
            self.world
                .finish_all_reduce_mean_live(backend.as_ref(), arena, t.mean)?;
            backend.convert(ConvertArgs {
                src: arena,
                dst: out,
                starts,
                active: &t.active,
            })?;
        }
        Ok(())
    }

    /// The end of fragment `f`'s sync (torchft's `perform_sync`), its all-reduced
    /// pseudo-gradient in the gradients (no delay) or held in the scratch arenas (`f` pending):
    /// the fragment's parameters are saved as the local ones (an α given), go back to the backup,
    /// the outer optimizer steps them with the pseudo-gradient as their gradient (the other
    /// parameters have none, so it skips them), the result becomes their new backup, the
    /// parameters become `lerp(global, local, α)`, and every gradient is cleared
    /// (`set_to_none`).
    fn finish(&mut self, replicas: &mut Replicas, f: usize) -> Result<()> {
        let member = self.member_mask(f);
        let held = self.pending == Some(f);
        if held {
            self.settle(replicas)?;
        }
        let mix = self.alpha;
        let backend = replicas.backend().clone();
        let plans: Vec<(Vec<bool>, Vec<CopyRegion>)> = (0..replicas.buckets().len())
            .map(|b| {
                (
                    replicas.buckets()[b].mask(&member),
                    Self::regions(replicas, b, &member),
                )
            })
            .collect();
        if mix.is_some() {
            for (b, (active, _)) in plans.iter().enumerate() {
                if active.contains(&true) {
                    self.scratch.ensure(replicas, b)?;
                }
            }
        }
        for (b, (bucket, (active, regions))) in
            replicas.buckets_mut().iter_mut().zip(&plans).enumerate()
        {
            if !active.contains(&true) || regions.is_empty() {
                continue;
            }
            let (params, grads, _) = bucket.arenas_mut();
            if held {
                let scratch = self.scratch.get(b).expect("held in flight");
                backend.copy_regions(scratch, grads, regions)?;
            }
            if mix.is_some() {
                let scratch = self.scratch.get_mut(b).expect("ensured above");
                backend.copy_regions(params, scratch, regions)?;
            }
            let backup = self.backups.get(b).expect("every bucket has its backup");
            backend.copy_regions(backup, params, regions)?;
        }
        for rank in 0..self.ranks {
            for (j, &m) in member.iter().enumerate() {
                replicas.set_has_grad(rank, j, m);
            }
        }
        self.outer.step(replicas)?;
        self.backups.copy_params(replicas, &self.fragments[f])?;
        if let Some(alpha) = mix {
            self.merge(replicas, &plans, alpha)?;
        }
        self.outer.zero_grad(replicas);
        if held {
            self.pending = None;
        }
        Ok(())
    }

    /// torch's `global.lerp_(local, α)` over the fragment (`plans`' active members), the
    /// global values in the parameters and the local ones in the scratch arenas
    /// ([`Backend::lerp`](crate::backend::Backend::lerp): one fused multiply-add in the
    /// compute precision, rounded once to the format).
    fn merge(
        &mut self,
        replicas: &mut Replicas,
        plans: &[(Vec<bool>, Vec<CopyRegion>)],
        alpha: f64,
    ) -> Result<()> {
        let backend = replicas.backend().clone();
        for (b, (bucket, (active, _))) in replicas.buckets_mut().iter_mut().zip(plans).enumerate() {
            if !active.contains(&true) {
                continue;
            }
            let (params, _, starts) = bucket.arenas_mut();
            let local = self.scratch.get(b).expect("saved before the outer step");
            backend.lerp(LerpArgs {
                params,
                end: local,
                starts,
                active,
                weight: alpha,
            })?;
        }
        Ok(())
    }

    /// The fragment in flight whose sync point is still travelling over a world of processes
    /// (its membership or a mean not yet known), if any.
    fn travelling_fragment(&self) -> Option<usize> {
        self.pending.filter(|_| {
            !self.travelling.is_empty()
                || self.agreeing.as_ref().is_some_and(|m| m.agreed().is_none())
        })
    }

    /// Rank `rank`'s (a local index) state: `{"inner_optimizer", "outer_optimizer",
    /// "local_step", "original_parameters", "pending"}` — both optimizers' `state_dict()`s, the
    /// inner steps since the start of the period, the parameters at their fragment's last sync,
    /// and the fragment in flight: `null`, or inside a `fragment_sync_delay` window
    /// `{"fragment": f, "pseudo_gradients": [...]}` with the all-reduced pseudo-gradient held
    /// for each of fragment `f`'s parameters (in the fragment's order; the same on every
    /// rank), so that a run resumes exactly where it stopped, mid-delay included (the model's
    /// current parameters are saved separately, as with any optimizer).
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than DiLoCo was built for; an
    /// `IndexError` when `rank` is out of range (from the optimizers' `state_dict`); a
    /// `RuntimeError` when a readback fails (a GPU error, a lost device), or while the fragment
    /// in flight's all-reduce is still travelling over a world of processes (its mean is not
    /// known yet: step to its apply point, or `sync`, first).
    pub async fn state_dict(&self, replicas: &Replicas, rank: usize) -> Result<Value> {
        check_same_model(replicas, self.ranks, self.params)?;
        if let Some(f) = self.travelling_fragment() {
            return Err(Error::runtime(format!(
                "fragment {f}'s all-reduce is still in flight: its mean is not known before its outer step (step to it, or call sync(), first)"
            )));
        }
        let inner = self.inner.state_dict(replicas, rank).await?;
        let outer = self.outer.state_dict(replicas, rank).await?;
        let original = held_tensors_json(
            &self.backups,
            replicas,
            rank,
            0..self.params,
            "every bucket has its backup",
        )
        .await?;
        let pending = match self.pending {
            None => Value::Null,
            Some(f) => {
                let held = held_tensors_json(
                    &self.scratch,
                    replicas,
                    rank,
                    self.fragments[f].iter().copied(),
                    "a fragment in flight holds its pseudo-gradient",
                )
                .await?;
                json!({"fragment": f, "pseudo_gradients": held})
            }
        };
        Ok(json!({
            "inner_optimizer": inner,
            "outer_optimizer": outer,
            "local_step": self.local_step,
            "original_parameters": original,
            "pending": pending,
        }))
    }

    /// Loads rank `rank`'s (a local index) state saved by [`DiLoCo::state_dict`]: both
    /// optimizers, the local step counter, the parameters at the last sync and the fragment in
    /// flight (`pending`; a missing key reads as `null`, as in a state saved before the key
    /// existed).
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than DiLoCo was built for; an
    /// `IndexError` when `rank` is out of range; a `ValueError` when a key is missing, `local_step`
    /// is not a non-negative integer below `sync_every`, or `original_parameters` is not a list of
    /// one tensor per parameter in its dtype and shape, or `pending` is not the in-flight fragment
    /// that `local_step` implies (`null` outside a `fragment_sync_delay` window) with one tensor
    /// per parameter of that fragment in its dtype and shape; the optimizers' `ValueError`s and
    /// `TypeError`s ([`LocalOptimizer::check_state_dict`]), checked before either optimizer
    /// changes; a `RuntimeError` when a loaded tensor or a state arena does not fit the memory
    /// budget or the backend fails, or while the fragment in flight's sync point is still
    /// travelling over a world of processes (its ranks would wait for this one's part of it).
    pub fn load_state_dict(
        &mut self,
        replicas: &mut Replicas,
        rank: usize,
        state_dict: &Value,
    ) -> Result<()> {
        check_same_model(replicas, self.ranks, self.params)?;
        if let Some(f) = self.travelling_fragment() {
            // Its ranks are still reducing it with this one: replacing the state would leave
            // them waiting for this rank's part of the sync point.
            return Err(Error::runtime(format!(
                "fragment {f}'s all-reduce is still in flight: a state dict cannot be loaded before its outer step (step to it, or call sync(), first)"
            )));
        }
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
        if local_step >= self.sync_every {
            return Err(Error::value(format!(
                "\"local_step\" ({local_step}) must be smaller than sync_every ({})",
                self.sync_every
            )));
        }
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
            let what = format!("original_parameters[{j}]");
            tensors.push(loaded_words(replicas, j, value, &what, "the parameter")?);
        }
        let pending = self.pending_of(replicas, state_dict, local_step)?;
        // Both optimizers check their parts before either changes.
        self.inner.check_state_dict(replicas, rank, inner)?;
        self.outer.check_state_dict(replicas, rank, outer)?;
        self.inner.load_state_dict(replicas, rank, inner)?;
        self.outer.load_state_dict(replicas, rank, outer)?;
        for (j, words) in tensors.iter().enumerate() {
            self.backups.write_words(replicas, rank, j, words)?;
        }
        if let Some((f, held)) = &pending {
            for (&j, words) in self.fragments[*f].iter().zip(held) {
                self.scratch.write_words(replicas, rank, j, words)?;
            }
        }
        self.pending = pending.map(|(f, _)| f);
        // The sync point the replaced state had started (its means already known: one still
        // travelling refuses the load above) is the loaded state's now.
        self.travelling.clear();
        self.agreeing = None;
        self.local_step = local_step;
        Ok(())
    }

    /// The checked `pending` entry of a state dict at counter `local_step`: the fragment and
    /// its held pseudo-gradients, encoded for the arenas.
    fn pending_of(
        &self,
        replicas: &Replicas,
        state_dict: &Value,
        local_step: u64,
    ) -> Result<Option<(usize, Vec<Vec<u32>>)>> {
        let expected = self.in_window(local_step);
        let given = state_dict.get("pending").unwrap_or(&Value::Null);
        let Some(f) = expected else {
            if given.is_null() {
                return Ok(None);
            }
            return Err(Error::value(format!(
                "\"pending\" must be null at local_step {local_step} (no fragment in flight), got {given}"
            )));
        };
        let wrong = || {
            Error::value(format!(
                "\"pending\" must be {{\"fragment\": {f}, \"pseudo_gradients\": [...]}} at \
                 local_step {local_step}: fragment {f}'s all-reduce is in flight \
                 (fragment_sync_delay {})",
                self.delay
            ))
        };
        if given.get("fragment").and_then(Value::as_u64) != Some(f as u64) {
            return Err(wrong());
        }
        let list = given
            .get("pseudo_gradients")
            .and_then(Value::as_array)
            .ok_or_else(wrong)?;
        if list.len() != self.fragments[f].len() {
            return Err(Error::value(format!(
                "\"pending\" has {} pseudo-gradients, fragment {f} has {} parameters",
                list.len(),
                self.fragments[f].len()
            )));
        }
        let mut held = Vec::with_capacity(list.len());
        for (k, (&j, value)) in self.fragments[f].iter().zip(list).enumerate() {
            let what = format!("pending.pseudo_gradients[{k}]");
            let parameter = format!("parameter {j}");
            held.push(loaded_words(replicas, j, value, &what, &parameter)?);
        }
        Ok(Some((f, held)))
    }
}

/// Rank `rank`'s tensors of `arenas` for the parameters `params`, in their order, as JSON (a
/// state dict's list). Every one must be held: `held` says why (the panic's message
/// otherwise).
async fn held_tensors_json(
    arenas: &StateArenas,
    replicas: &Replicas,
    rank: usize,
    params: impl ExactSizeIterator<Item = usize>,
    held: &str,
) -> Result<Vec<Value>> {
    let mut tensors = Vec::with_capacity(params.len());
    for j in params {
        let tensor = arenas.read(replicas, rank, j).await?.expect(held);
        tensors.push(tensor_to_json(&tensor).await?);
    }
    Ok(tensors)
}

/// A loaded state tensor of parameter `j` (`what`, as the state dict names it): it must have
/// the parameter's dtype and shape (an error names the parameter as `parameter`); encoded for
/// the arenas of the parameter's bucket.
fn loaded_words(
    replicas: &Replicas,
    j: usize,
    value: &Value,
    what: &str,
    parameter: &str,
) -> Result<Vec<u32>> {
    let tensor = tensor_from_json(value, what)?;
    if tensor.dtype() != replicas.dtype(j) || tensor.shape() != replicas.shape(j) {
        return Err(Error::value(format!(
            "{what} is {} {}, {parameter} is {} {}",
            tensor.dtype(),
            crate::tensor::format_shape(tensor.shape()),
            replicas.dtype(j),
            crate::tensor::format_shape(replicas.shape(j))
        )));
    }
    let format = replicas.buckets()[replicas.place(j).bucket].format();
    transfer::encode(&tensor, format, "a loaded state tensor")
}

/// A `ValueError` unless `fragments` is a partition of `0..params` into non-empty fragments,
/// no more of them than `sync_every`.
fn check_fragments(params: usize, fragments: &[Vec<usize>], sync_every: u64) -> Result<()> {
    if fragments.is_empty() || fragments.iter().any(Vec::is_empty) {
        return Err(Error::value(
            "fragments must be a non-empty list of non-empty lists of parameter indices",
        ));
    }
    if fragments.len() as u64 > sync_every {
        return Err(Error::value(format!(
            "sync_every ({sync_every}) must be at least the number of fragments ({})",
            fragments.len()
        )));
    }
    let mut seen = vec![false; params];
    for &j in fragments.iter().flatten() {
        if j >= params {
            return Err(Error::new(
                crate::ErrorKind::IndexError,
                format!("parameter index {j} out of range for {params} parameters"),
            ));
        }
        if std::mem::replace(&mut seen[j], true) {
            return Err(Error::value(format!(
                "parameter {j} appears in more than one fragment"
            )));
        }
    }
    if let Some(j) = seen.iter().position(|s| !s) {
        return Err(Error::value(format!("parameter {j} is in no fragment")));
    }
    Ok(())
}

/// `params` parameters split into `count` fragments of consecutive parameters (as a model
/// splits into runs of layers), their sizes differing by at most one. A `ValueError` when
/// `count` is 0 or exceeds `params`.
///
/// # Errors
/// A `ValueError` when `count` is 0 or larger than `params`.
pub fn split_fragments(params: usize, count: usize) -> Result<Vec<Vec<usize>>> {
    if count == 0 || count > params {
        return Err(Error::value(format!(
            "cannot split {params} parameters into {count} non-empty fragments"
        )));
    }
    Ok((0..count)
        .map(|f| (f * params / count..(f + 1) * params / count).collect())
        .collect())
}
