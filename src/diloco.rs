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
//!
//! *Streaming DiLoCo* (Douillard et al., "Streaming DiLoCo with overlapping communication",
//! 2025) splits the parameters into fragments that sync on a staggered schedule: with `F`
//! fragments and `H = sync_every`, fragment `f` syncs after local step `(f+1)·H/F` (mod `H`)
//! of every period, so each parameter still syncs once per `H` inner steps while the traffic
//! is spread over the period. One fragment is plain DiLoCo.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::backend::{Arena, Backend, CpuBackend};
use crate::comm::{Communicator, Subgroups};
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
/// is computed *in the wire format* as gloo's all-reduce of a 16-bit tensor does: each value
/// divided by the world size and rounded, then summed with every addition rounded to the wire
/// format (in rank order when one process holds the world, in the transport's order over MPI,
/// whose 16-bit all-reduce rounds every addition the same way), and the mean is converted back
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
    /// Inner steps since the start of the current period, in `0..sync_every`.
    local_step: u64,
    /// The global parameter indices of each fragment (every parameter in exactly one).
    fragments: Vec<Vec<usize>>,
    /// Fragment `f` syncs when `local_step` becomes `offsets[f]`.
    offsets: Vec<u64>,
    /// Every local rank's parameters at their fragment's last sync (laid out like the
    /// parameters, one arena per format bucket).
    backups: StateArenas,
    /// The pseudo-gradients' wire precision.
    compression: Compression,
    /// Per format bucket, the wire-format arena of the compressed all-reduce (created on the
    /// first compressed sync of a bucket whose format differs from the wire format).
    wire: Vec<Option<Arena>>,
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
        Self::check_arguments(replicas, sync_every, world.as_ref())?;
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
            compression: Compression::None,
            ranks: replicas.ranks(),
            params: replicas.len(),
        })
    }

    /// The checks [`DiLoCo::new`] makes before it builds anything: `sync_every >= 1`, and
    /// `replicas` holds `world`'s local ranks. A front end that must keep the optimizers when
    /// construction fails calls it before handing them over.
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
    /// [`Compression`]); every rank must choose the same.
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

    /// Inner steps since the start of the current period (for plain DiLoCo: since the last
    /// sync), in `0..sync_every`.
    pub fn local_step(&self) -> u64 {
        self.local_step
    }

    /// The fragments' global parameter indices.
    pub fn fragments(&self) -> &[Vec<usize>] {
        &self.fragments
    }

    /// For each fragment, the value of [`DiLoCo::local_step`] at which it syncs (right after
    /// the inner step that brings the counter there).
    pub fn sync_schedule(&self) -> &[u64] {
        &self.offsets
    }

    /// The inner optimizer's `zero_grad(set_to_none=True)`.
    pub fn zero_grad(&self, replicas: &mut Replicas) {
        self.inner.zero_grad(replicas);
    }

    /// One inner step on every rank (parameters without a gradient skipped), then a sync of
    /// the fragment due at this step, if any (for plain DiLoCo: every `sync_every` inner
    /// steps). Returns whether it synced.
    ///
    /// # Errors
    /// As [`DiLoCo::step_fragments`].
    pub fn step(&mut self, replicas: &mut Replicas) -> Result<bool> {
        Ok(!self.step_fragments(replicas)?.is_empty())
    }

    /// [`DiLoCo::step`], returning the fragments that synced.
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than DiLoCo was built for; the
    /// inner optimizer's errors ([`LocalOptimizer::step`]); when a fragment is due, the errors of
    /// its sync (as [`DiLoCo::sync`]: the backend's, the world's and the outer optimizer's). A
    /// failed sync leaves the step counter advanced.
    pub fn step_fragments(&mut self, replicas: &mut Replicas) -> Result<Vec<usize>> {
        check_same_model(replicas, self.ranks, self.params)?;
        self.inner.step(replicas)?;
        self.local_step = (self.local_step + 1) % self.sync_every;
        let due: Vec<usize> = (0..self.fragments.len())
            .filter(|&f| self.offsets[f] == self.local_step)
            .collect();
        for &f in &due {
            self.sync_fragment(replicas, f)?;
        }
        Ok(due)
    }

    /// The outer step now, for every fragment, and a new period from here.
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than DiLoCo was built for; the
    /// backend's and the world's errors (a `RuntimeError` for a GPU error, a lost device, or a wire
    /// arena over the memory budget); the outer optimizer's errors ([`LocalOptimizer::step`]).
    pub fn sync(&mut self, replicas: &mut Replicas) -> Result<()> {
        check_same_model(replicas, self.ranks, self.params)?;
        for f in 0..self.fragments.len() {
            self.sync_fragment(replicas, f)?;
        }
        self.local_step = 0;
        Ok(())
    }

    /// Fragment `f`'s outer step: each of its parameters' gradient becomes the world's mean of
    /// `backup - params` (computed and summed in the parameter's dtype), its parameters go
    /// back to the backup, the outer optimizer steps them (the other parameters have no
    /// gradient, so it skips them), the result becomes their new backup, and every gradient
    /// is cleared (`set_to_none`).
    fn sync_fragment(&mut self, replicas: &mut Replicas, f: usize) -> Result<()> {
        let mut member = vec![false; self.params];
        for &j in &self.fragments[f] {
            member[j] = true;
        }
        let backend = replicas.backend().clone();
        let subgroups = Subgroups::world(self.world.world_size());
        let wire = self.compression.wire_format();
        let plans: Vec<(Vec<bool>, u64)> = replicas
            .buckets()
            .iter()
            .map(|bucket| {
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
                (bucket.mask(&member), bytes)
            })
            .collect();
        for (b, (bucket, (active, bytes))) in
            replicas.buckets_mut().iter_mut().zip(&plans).enumerate()
        {
            if !active.contains(&true) {
                continue;
            }
            let format = bucket.format();
            let (rank_len, chunk_len) = (bucket.rank_len(), bucket.chunk_len());
            let (params, grads, starts) = bucket.arenas_mut();
            let backup = self.backups.get(b).expect("every bucket has its backup");
            backend.pseudo_gradient(params, backup, grads, starts, active)?;
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
                backend.convert(grads, arena, starts, active)?;
                self.world.all_reduce_mean(
                    backend.as_ref(),
                    arena,
                    subgroups,
                    wire,
                    starts,
                    active,
                    *bytes,
                )?;
                backend.convert(arena, grads, starts, active)?;
                continue;
            }
            // The reference all-reduces each pseudo-gradient in its own dtype.
            self.world.all_reduce_mean(
                backend.as_ref(),
                grads,
                subgroups,
                format,
                starts,
                active,
                *bytes,
            )?;
        }
        for rank in 0..self.ranks {
            for (j, &m) in member.iter().enumerate() {
                replicas.set_has_grad(rank, j, m);
            }
        }
        self.outer.step(replicas)?;
        self.backups.copy_params(replicas, &self.fragments[f])?;
        self.outer.zero_grad(replicas);
        Ok(())
    }

    /// Rank `rank`'s (a local index) state: `{"inner_optimizer", "outer_optimizer",
    /// "local_step", "original_parameters"}` — both optimizers' `state_dict()`s, the inner
    /// steps since the last sync, and the parameters at the last sync, so that a run resumes
    /// exactly where it stopped (the model's current parameters are saved separately, as with
    /// any optimizer).
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than DiLoCo was built for; an
    /// `IndexError` when `rank` is out of range (from the optimizers' `state_dict`); a
    /// `RuntimeError` when a readback fails (a GPU error, a lost device).
    pub async fn state_dict(&self, replicas: &Replicas, rank: usize) -> Result<Value> {
        check_same_model(replicas, self.ranks, self.params)?;
        let inner = self.inner.state_dict(replicas, rank).await?;
        let outer = self.outer.state_dict(replicas, rank).await?;
        let mut original = Vec::with_capacity(self.params);
        for j in 0..self.params {
            let tensor = self
                .backups
                .read(replicas, rank, j)
                .await?
                .expect("every bucket has its backup");
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
    ///
    /// # Errors
    /// As [`DiLoCo::state_dict`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn state_dict_blocking(&self, replicas: &Replicas, rank: usize) -> Result<Value> {
        pollster::block_on(self.state_dict(replicas, rank))
    }

    /// Loads rank `rank`'s (a local index) state saved by [`DiLoCo::state_dict`]: both
    /// optimizers, the local step counter and the parameters at the last sync.
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than DiLoCo was built for; an
    /// `IndexError` when `rank` is out of range; a `ValueError` when a key is missing, `local_step`
    /// is not a non-negative integer below `sync_every`, or `original_parameters` is not a list of
    /// one tensor per parameter in its dtype and shape; the optimizers' `ValueError`s and
    /// `TypeError`s ([`LocalOptimizer::check_state_dict`]), checked before either optimizer
    /// changes; a `RuntimeError` when a loaded tensor or a state arena does not fit the memory
    /// budget or the backend fails.
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
            let tensor = tensor_from_json(value, &format!("original_parameters[{j}]"))?;
            if tensor.dtype() != replicas.dtype(j) || tensor.shape() != replicas.shape(j) {
                return Err(Error::value(format!(
                    "original_parameters[{j}] is {} {}, the parameter is {} {}",
                    tensor.dtype(),
                    crate::tensor::format_shape(tensor.shape()),
                    replicas.dtype(j),
                    crate::tensor::format_shape(replicas.shape(j))
                )));
            }
            let format = replicas.buckets()[replicas.place(j).bucket].format();
            tensors.push(transfer::encode(&tensor, format, "a loaded state tensor")?);
        }
        // Both optimizers check their parts before either changes.
        self.inner.check_state_dict(replicas, rank, inner)?;
        self.outer.check_state_dict(replicas, rank, outer)?;
        self.inner.load_state_dict(replicas, rank, inner)?;
        self.outer.load_state_dict(replicas, rank, outer)?;
        for (j, words) in tensors.iter().enumerate() {
            self.backups.write_words(replicas, rank, j, words)?;
        }
        self.local_step = local_step;
        Ok(())
    }
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
