//! The compute layer: a small [`Backend`] trait of fused elementwise kernels over flat replica
//! arenas, with a wgpu implementation ([`gpu`]) and a plain-Rust one ([`cpu`]) that is both the
//! reference the GPU is tested against and the fallback where no adapter exists.

pub mod cpu;
pub mod gpu;
pub mod kernels;
pub(crate) mod oneshot;
pub(crate) mod quotient;

use cpu::host_words;
pub use cpu::{host_step, roofline};

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::dtype::StorageFormat;
use crate::error::{Error, Result};
use kernels::{AdamArenas, AdamScalars, ParamStarts, SgdScalars};

pub use cpu::CpuBackend;
pub use gpu::GpuBackend;

/// Every parameter's first element in an arena sits at a multiple of this many elements, so
/// that 16-bit parameters start on a word and copies stay 4-byte aligned.
pub const PARAM_ALIGN_ELEMENTS: usize = 64;

/// `Send + Sync` natively; nothing on wasm32, where wgpu's WebGPU handles are `!Send`.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSendSync: Send + Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + Sync + ?Sized> MaybeSendSync for T {}
/// `Send + Sync` natively; nothing on wasm32, where wgpu's WebGPU handles are `!Send`.
#[cfg(target_arch = "wasm32")]
pub trait MaybeSendSync {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSendSync for T {}

/// `Send` natively; nothing on wasm32.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSend: Send {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + ?Sized> MaybeSend for T {}
/// `Send` natively; nothing on wasm32.
#[cfg(target_arch = "wasm32")]
pub trait MaybeSend {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSend for T {}

/// A boxed future (not `Send` on wasm32).
#[cfg(not(target_arch = "wasm32"))]
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
/// A boxed future (not `Send` on wasm32).
#[cfg(target_arch = "wasm32")]
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Which implementation a backend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// wgpu on a GPU adapter (or a software adapter such as lavapipe or SwiftShader).
    Gpu,
    /// Plain Rust on the host's cores.
    Cpu,
}

/// What a backend runs on, as `distopt info` prints it.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendInfo {
    /// Gpu or Cpu.
    pub kind: BackendKind,
    /// Adapter or CPU name.
    pub name: String,
    /// Graphics API (Vulkan, Metal, Dx12, Gl, BrowserWebGpu) or `host`.
    pub api: String,
    /// Device type (DiscreteGpu, IntegratedGpu, VirtualGpu, Cpu, Other).
    pub device_type: String,
    /// Driver and its version, where the adapter reports them.
    pub driver: String,
    /// Largest storage buffer binding distopt uses (bytes); arenas above are chunked.
    pub max_binding_bytes: u64,
    /// Largest buffer the device allows (bytes).
    pub max_buffer_bytes: u64,
    /// Workgroups per dispatch dimension.
    pub max_workgroups_per_dimension: u32,
    /// Whether storage buffers can be mapped directly (unified memory).
    pub mappable_primary_buffers: bool,
    /// Worker threads (CPU backend).
    pub threads: usize,
}

/// One arena: the elements of `ranks` replicas of a list of parameters, all stored in one
/// format, laid out `[rank][element]` with `rank_len` elements per rank. Parameters are views
/// (offset, length) into the rank's element space, at [`PARAM_ALIGN_ELEMENTS`] boundaries.
///
/// A backend may store a large arena as several chunks (each a separate binding); the
/// `chunk_len` elements of every rank that form one chunk are then stored together. Arenas
/// that take part in one kernel share `rank_len` and `chunk_len`.
pub struct Arena {
    format: StorageFormat,
    ranks: usize,
    rank_len: usize,
    chunk_len: usize,
    pub(crate) storage: ArenaStorage,
}

pub(crate) enum ArenaStorage {
    Host(host_words::HostWords),
    Gpu(gpu::GpuArena),
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("format", &self.format)
            .field("ranks", &self.ranks)
            .field("rank_len", &self.rank_len)
            .field("chunk_len", &self.chunk_len)
            .field(
                "on",
                &match self.storage {
                    ArenaStorage::Host(_) => "host",
                    ArenaStorage::Gpu(_) => "gpu",
                },
            )
            .finish()
    }
}

impl Arena {
    pub(crate) fn new(
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
        storage: ArenaStorage,
    ) -> Arena {
        Arena {
            format,
            ranks,
            rank_len,
            chunk_len,
            storage,
        }
    }

    /// The storage format of every element.
    pub fn format(&self) -> StorageFormat {
        self.format
    }

    /// Number of replicas.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Elements per rank (a multiple of [`PARAM_ALIGN_ELEMENTS`]).
    pub fn rank_len(&self) -> usize {
        self.rank_len
    }

    /// Elements per rank in one chunk (equal to `rank_len` for an unchunked arena).
    pub fn chunk_len(&self) -> usize {
        self.chunk_len
    }

    /// Whether the arena lives on a GPU device (`false`: in host memory).
    pub fn is_on_device(&self) -> bool {
        matches!(self.storage, ArenaStorage::Gpu(_))
    }

    /// Bytes the arena occupies.
    pub fn bytes(&self) -> usize {
        self.ranks * self.rank_len * self.format.element_bytes()
    }

    /// Writes `words` (packed in this arena's format) at element `offset` of rank `rank`.
    /// `offset` must be a multiple of the format's elements per word.
    ///
    /// # Errors
    /// A `ValueError` when `rank` is out of range, `offset` lies beyond the rank's elements or is
    /// not word aligned, or `words` run past the end of the rank. A write to a GPU arena is queued:
    /// a device error surfaces at a later call.
    pub fn write(&mut self, rank: usize, offset: usize, words: &[u32]) -> Result<()> {
        // Padding elements may be written with the last word: clamp to the rank's length.
        let elements = words.len() * 4 / self.format.element_bytes();
        self.check_range(
            rank,
            offset,
            elements.min(self.rank_len.saturating_sub(offset)),
        )?;
        if !self.format.is_word_aligned(offset) {
            return Err(Error::value(format!(
                "arena write at element {offset} is not word aligned"
            )));
        }
        let rank_words = self.format.words_for(self.rank_len);
        let first = self.format.word_of(offset);
        if first + words.len() > rank_words {
            return Err(Error::value(format!(
                "arena write of {} words at element {offset} overruns the rank's {rank_words} words",
                words.len()
            )));
        }
        match &mut self.storage {
            ArenaStorage::Host(host) => {
                let start = rank * rank_words + first;
                host[start..start + words.len()].copy_from_slice(words);
            }
            ArenaStorage::Gpu(arena) => arena.write(rank, first, words),
        }
        Ok(())
    }

    /// Reads every rank back: `ranks * words_for(rank_len)` words, rank-major.
    ///
    /// # Errors
    /// A `RuntimeError` when a host arena's copy does not fit the memory budget, or when a GPU
    /// readback fails (a device error, a lost device).
    pub async fn read_all(&self) -> Result<Vec<u32>> {
        match &self.storage {
            ArenaStorage::Host(host) => {
                crate::budget::check(host.len().saturating_mul(4), "an arena's readback")?;
                Ok(host.to_vec())
            }
            ArenaStorage::Gpu(arena) => arena.read_all().await,
        }
    }

    /// Reads `len` elements of rank `rank` from element `offset` (word aligned); the words
    /// returned start with element `offset`.
    ///
    /// # Errors
    /// A `ValueError` when `rank` is out of range, `offset + len` exceeds the rank's elements or
    /// `offset` is not word aligned; a `RuntimeError` when a GPU readback fails (a device error, a lost device).
    pub async fn read_range(&self, rank: usize, offset: usize, len: usize) -> Result<Vec<u32>> {
        self.check_range(rank, offset, len)?;
        let first = self.format.word_of(offset);
        let words = self.format.words_for(len);
        match &self.storage {
            ArenaStorage::Host(host) => {
                let start = rank * self.format.words_for(self.rank_len) + first;
                Ok(host[start..start + words].to_vec())
            }
            ArenaStorage::Gpu(arena) => arena.read_range(rank, first, words).await,
        }
    }

    /// A `ValueError` unless rank `rank` has elements `offset..offset + len` and `offset` is
    /// word aligned.
    pub(crate) fn check_range(&self, rank: usize, offset: usize, len: usize) -> Result<()> {
        if rank >= self.ranks
            || offset
                .checked_add(len)
                .is_none_or(|end| end > self.rank_len)
        {
            return Err(Error::value(format!(
                "arena access out of range: rank {rank}, elements {offset}..{} of an arena with {} ranks of {} elements",
                offset.saturating_add(len),
                self.ranks,
                self.rank_len
            )));
        }
        // 16-bit formats pack two elements per word: every access starts on a word.
        if !self.format.is_word_aligned(offset) {
            return Err(Error::value(format!(
                "arena access at element {offset} is not word aligned"
            )));
        }
        Ok(())
    }
}

/// Lays out parameters of the given element counts in one rank's element space: returns each
/// parameter's offset and the padded rank length.
pub fn layout_params(numels: &[usize]) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(numels.len());
    let mut next = 0usize;
    for &n in numels {
        offsets.push(next);
        next += n.div_ceil(PARAM_ALIGN_ELEMENTS) * PARAM_ALIGN_ELEMENTS;
    }
    (offsets, next.max(PARAM_ALIGN_ELEMENTS))
}

/// A fused-kernel backend. Algorithms are written once against this trait; they never know
/// whether a GPU or the host's cores run them. Arenas belong to the backend that created
/// them; passing another backend's arena is a `RuntimeError`.
///
/// Every kernel is a required method, implemented by both backends: nothing falls back to a
/// host loop behind a backend's back, and a backend that wraps another (to record or
/// instrument calls) must forward each one. The one provided method that computes,
/// [`host_sgd_step`](Self::host_sgd_step), is an optional shortcut (the default `None` makes
/// the caller pack arenas for [`dp_sgd_step`](Self::dp_sgd_step)), not a fallback.
pub trait Backend: MaybeSendSync + fmt::Debug {
    /// What this backend runs on.
    fn info(&self) -> &BackendInfo;

    /// Why this backend can no longer run anything (a GPU device that was lost), or `None`.
    fn lost(&self) -> Option<String> {
        None
    }

    /// Destroys the backend's device, as a driver reset would (a test hook for the
    /// device-lost path; nothing on a CPU backend).
    fn destroy_device_for_test(&self) {}

    /// Elements per rank per chunk for an arena of `rank_len` elements per rank and up to
    /// `ranks` ranks, so that every chunk fits in one storage binding.
    fn chunk_len(&self, rank_len: usize, ranks: usize) -> usize;

    /// A zero-filled arena.
    ///
    /// # Errors
    /// A `ValueError` when the arena's size overflows `usize` (the GPU backend also refuses, for
    /// rows of some elements, a zero or odd `chunk_len` or an odd `rank_len`; rows of no
    /// elements are accepted with any `chunk_len` on both); a `RuntimeError` when a host arena does not fit
    /// the memory budget ([`crate::budget`]) or the allocator refuses it, or when the GPU device
    /// refuses a buffer (beyond its limits, out of memory) or is lost.
    fn create_arena(
        &self,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
    ) -> Result<Arena>;

    /// An arena whose contents are unspecified (it may hold the values of an arena dropped
    /// before): for work that writes every element whose value it uses before reading it.
    /// The CPU backend's is
    /// zero-filled like [`create_arena`](Self::create_arena); the GPU backend skips the clear
    /// of a buffer it kept from a dropped arena.
    ///
    /// # Errors
    /// As [`create_arena`](Self::create_arena).
    fn create_scratch_arena(
        &self,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
    ) -> Result<Arena>;

    /// Copies a whole arena into another of the same format and shape.
    ///
    /// # Errors
    /// A `ValueError` when the arenas differ in format or shape; a `RuntimeError` for an arena this
    /// backend cannot use (another backend's: see the trait's documentation), or when the GPU
    /// device reports an error or is lost.
    fn copy_arena(&self, src: &Arena, dst: &mut Arena) -> Result<()>;

    /// The synchronous data-parallel SGD step over whole arenas, one dispatch per chunk:
    /// `means[i] = round(Σ_r grads[r][i] / R)`, `params[r][i] = round(params[0][i] - lr·means[i])`.
    /// `grads` has R ranks, `params` R ranks, `means` one.
    ///
    /// # Errors
    /// As [`Backend::dp_sgd_step_with_divisor`] with the divisor R: arenas without ranks are a
    /// `ValueError`.
    fn dp_sgd_step(
        &self,
        params: &mut Arena,
        grads: &Arena,
        means: &mut Arena,
        learning_rate: f32,
    ) -> Result<()> {
        let divisor = params.ranks() as f32;
        self.dp_sgd_step_with_divisor(params, grads, means, learning_rate, divisor)
    }

    /// [`Backend::dp_sgd_step`] dividing the float32 sum by `divisor` instead of the rank
    /// count: `means[i] = round((0 + Σ_r grads[r][i]) / divisor)` (a true float32 division),
    /// `params[r][i] = round(params[0][i] - lr·means[i])`. One rank of gradients holding a
    /// world's summed gradients, divided by the world size, is the step of a world whose
    /// gradients were summed elsewhere (one rank per process). `divisor` must be positive
    /// and finite (a `ValueError` otherwise).
    ///
    /// # Errors
    /// A `ValueError` when `divisor` is not positive and finite, or the arenas do not match
    /// (`grads` with other ranks than `params`, `means` with more than one rank, another `rank_len`
    /// or `chunk_len`, `means` in another format than `params`; the CPU backend also refuses arenas
    /// without ranks); a `RuntimeError` for an arena this backend cannot use (another backend's:
    /// see the trait's documentation), or when the GPU device reports an error or is lost.
    fn dp_sgd_step_with_divisor(
        &self,
        params: &mut Arena,
        grads: &Arena,
        means: &mut Arena,
        learning_rate: f32,
        divisor: f32,
    ) -> Result<()>;

    /// The data-parallel step computed straight from host tensors, for a backend whose
    /// kernels run on the host: per parameter, the mean gradient and `copies` buffers of the
    /// updated value, the same bits as [`Backend::dp_sgd_step`] over packed arenas. `None`
    /// (the default) when this backend has no such path: the caller packs arenas instead.
    fn host_sgd_step(
        &self,
        params: &[host_step::HostStepParam<'_>],
        ranks: usize,
        learning_rate: f32,
        copies: usize,
    ) -> Option<Vec<host_step::HostStepResult>> {
        let _ = (params, ranks, learning_rate, copies);
        None
    }

    /// `torch.optim.SGD`'s step over every rank and parameter of an arena (one dispatch per
    /// chunk). `scalars` has one entry per (rank, parameter), rank-major.
    ///
    /// # Errors
    /// A `ValueError` when `grads` or `momentum` differ from `params` in ranks, length or format
    /// (on the GPU backend also in chunking), when `starts` is empty or `scalars` does not hold one
    /// entry per (rank, parameter), or when an active entry has momentum and no momentum arena is
    /// given. A `RuntimeError` for an arena this backend cannot use (another backend's:
    /// see the trait's documentation), or when the GPU device reports an error or is lost.
    fn sgd(
        &self,
        params: &mut Arena,
        grads: &Arena,
        momentum: Option<&mut Arena>,
        starts: &ParamStarts,
        scalars: &[SgdScalars],
    ) -> Result<()>;

    /// `torch.optim.Adam`/`AdamW`'s step over every rank and parameter of an arena.
    ///
    /// # Errors
    /// A `ValueError` when an arena differs from the parameters in ranks, length or format (on the
    /// GPU backend also in chunking), when `starts` is empty or `scalars` does not hold one entry
    /// per (rank, parameter), or when an active `amsgrad` entry has no `max_exp_avg_sq` arena. A
    /// `RuntimeError` for an arena this backend cannot use (another
    /// backend's: see the trait's documentation), or when the GPU device reports an error or is
    /// lost.
    fn adam(
        &self,
        arenas: AdamArenas<'_>,
        starts: &ParamStarts,
        scalars: &[AdamScalars],
    ) -> Result<()>;

    /// Averages every group of `group_size` consecutive ranks of `arena` over the parameters
    /// flagged in `active` (see [`kernels::average_reference`]), all groups in one dispatch.
    ///
    /// An empty `starts` (an arena with no parameters) and an arena without ranks have nothing
    /// to average: the call checks its arguments and changes nothing, on every backend.
    ///
    /// # Errors
    /// A `ValueError` when `group_size` is 0 or does not divide the arena's ranks, `active` does
    /// not hold one flag per parameter of `starts`, or `starts` does not fit the arena (it must
    /// start at 0 and ascend on 64-element slots within a rank's elements); a `RuntimeError` for
    /// an arena this backend cannot use (another backend's: see the trait's documentation), or
    /// when the GPU device reports an error or is lost.
    fn average(
        &self,
        arena: &mut Arena,
        group_size: usize,
        arith: StorageFormat,
        starts: &ParamStarts,
        active: &[bool],
    ) -> Result<()>;

    /// The data-parallel gradient all-reduce (see [`kernels::scaled_sum_reference`]): every
    /// rank with a scale contributes its values times the scale (zeros where not `present`),
    /// ranks without one contribute zeros; the sum over all ranks, in rank order, is written to
    /// the ranks with a scale. One dispatch for every rank and parameter.
    ///
    /// # Errors
    /// A `ValueError` when `reduced` does not hold one flag per parameter, `scales` one entry per
    /// rank or `present` one flag per (rank, parameter); a `RuntimeError` for an arena this backend
    /// cannot use (another backend's: see the trait's documentation), or when the GPU device
    /// reports an error or is lost.
    fn scaled_sum(
        &self,
        arena: &mut Arena,
        arith: StorageFormat,
        starts: &ParamStarts,
        reduced: &[bool],
        scales: &[Option<f64>],
        present: &[bool],
    ) -> Result<()>;

    /// DiLoCo's pseudo-gradient over three arenas of one layout (see
    /// [`kernels::pseudo_gradient_reference`]): for every rank and every element of the
    /// parameters flagged in `active`, `grads = round(backup - params)` in the parameters'
    /// precision, then `params = backup`, one dispatch per chunk.
    ///
    /// An empty `starts` (arenas with no parameters) has nothing to compute: the call checks its
    /// arguments and changes nothing, on every backend.
    ///
    /// # Errors
    /// A `ValueError` when `backup` or `grads` differ from `params` in ranks, length or format (on
    /// the GPU backend also in chunking), `active` does not hold one flag per parameter, or
    /// `starts` does not fit the arenas (see [`Backend::average`]); a `RuntimeError` for an arena
    /// this backend cannot use (another backend's: see the trait's documentation), or when the
    /// GPU device reports an error or is lost.
    fn pseudo_gradient(
        &self,
        params: &mut Arena,
        backup: &Arena,
        grads: &mut Arena,
        starts: &ParamStarts,
        active: &[bool],
    ) -> Result<()>;

    /// Converts the parameters flagged in `active` of every rank of `src` into `dst`, an arena
    /// of the same ranks, layout and chunking in another storage format (see
    /// [`kernels::convert_reference`]), one dispatch per chunk.
    ///
    /// # Errors
    /// A `ValueError` when the arenas differ in ranks or length (on the GPU backend also in
    /// chunking) or `active` does not hold one flag per parameter; a `RuntimeError` for an arena
    /// this backend cannot use (another backend's: see the trait's documentation), or when the GPU
    /// device reports an error or is lost.
    fn convert(
        &self,
        src: &Arena,
        dst: &mut Arena,
        starts: &ParamStarts,
        active: &[bool],
    ) -> Result<()>;

    /// Copies many element ranges from `src` to `dst` (arenas of the same format) as one
    /// batch.
    ///
    /// # Errors
    /// A `ValueError` when the arenas differ in format, or a region's rank or elements are out of
    /// range or its offsets are not word aligned; a `RuntimeError` for an arena this backend cannot
    /// use (another backend's: see the trait's documentation), or when the GPU device reports an
    /// error or is lost.
    fn copy_regions(&self, src: &Arena, dst: &mut Arena, regions: &[CopyRegion]) -> Result<()>;

    /// Copies elements `offset..offset + len` (word aligned) of rank `from` to rank `to` of the
    /// same arena.
    ///
    /// # Errors
    /// A `ValueError` when `from` or `to` is out of range or `offset + len` exceeds the rank's
    /// elements; a `RuntimeError` for an arena this backend cannot use (another backend's: see the
    /// trait's documentation), or when the GPU device reports an error or is lost.
    fn copy_between_ranks(
        &self,
        arena: &mut Arena,
        from: usize,
        to: usize,
        offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Resolves when every operation submitted so far has finished.
    ///
    /// # Errors
    /// On the GPU backend, a `RuntimeError` when the device reported an error since the last check,
    /// was lost, or could not be polled; the CPU backend never fails.
    fn synchronize(&self) -> BoxFuture<'_, Result<()>>;
}

/// One element range to copy between arenas (see [`Backend::copy_regions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyRegion {
    /// Source rank.
    pub src_rank: usize,
    /// First source element (word aligned).
    pub src_offset: usize,
    /// Destination rank.
    pub dst_rank: usize,
    /// First destination element (word aligned).
    pub dst_offset: usize,
    /// Elements to copy.
    pub len: usize,
}

/// Checks a per-parameter kernel's table against the arena it describes, the same on every
/// backend: an empty table (an arena with no parameters: nothing to do), or one that starts at
/// element 0 and ascends, every start on a [`PARAM_ALIGN_ELEMENTS`] slot and within a rank's
/// elements (a start equal to `rank_len` is an empty last parameter). A `ValueError` otherwise:
/// a kernel never runs over a table that does not fit (the reference kernels would index out
/// of their rows, the shaders would read another parameter's flags).
pub(crate) fn check_param_table(what: &str, arena: &Arena, starts: &ParamStarts) -> Result<()> {
    let table = &starts.0;
    let fits = table.first().is_none_or(|&first| first == 0)
        && table.windows(2).all(|w| w[0] <= w[1])
        && table.iter().all(|&start| {
            (start as usize).is_multiple_of(PARAM_ALIGN_ELEMENTS)
                && start as usize <= arena.rank_len()
        });
    if !fits {
        return Err(Error::value(format!(
            "{what}: parameter table {table:?} does not fit an arena of {} elements per rank (parameters start at 0 and ascend, on {PARAM_ALIGN_ELEMENTS}-element slots)",
            arena.rank_len()
        )));
    }
    Ok(())
}

/// The argument checks of [`Backend::average`] that do not depend on the arena's storage (the
/// reference kernel's, with its text): the GPU backend makes them for an empty table, which
/// it does not dispatch.
pub(crate) fn check_average_args(
    arena: &Arena,
    group_size: usize,
    starts: &ParamStarts,
    active: &[bool],
) -> Result<()> {
    let ranks = arena.ranks();
    if group_size == 0 || !ranks.is_multiple_of(group_size) || active.len() != starts.0.len() {
        return Err(Error::value(format!(
            "average: group size {group_size} does not divide {ranks} ranks, or {} flags for {} parameters",
            active.len(),
            starts.0.len()
        )));
    }
    Ok(())
}

/// Validates a batch of copies: same format, in range, word aligned.
pub(crate) fn check_copy_regions(src: &Arena, dst: &Arena, regions: &[CopyRegion]) -> Result<()> {
    if src.format() != dst.format() {
        return Err(Error::value(format!(
            "cannot copy between arenas of formats {:?} and {:?}",
            src.format(),
            dst.format()
        )));
    }
    let format = src.format();
    for r in regions {
        src.check_range(r.src_rank, r.src_offset, r.len)?;
        dst.check_range(r.dst_rank, r.dst_offset, r.len)?;
        if !format.is_word_aligned(r.src_offset) || !format.is_word_aligned(r.dst_offset) {
            return Err(Error::value("copy offsets must be word aligned"));
        }
    }
    Ok(())
}

/// Which backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// A real GPU when there is one; the CPU backend when the only adapter is a software one
    /// (on the same cores the native loop is faster) or none exists.
    Auto,
    /// The GPU backend, on whatever adapter wgpu finds (software adapters included).
    Gpu,
    /// The plain-Rust backend.
    Cpu,
}

impl BackendChoice {
    /// Parses `auto`, `gpu` or `cpu`.
    ///
    /// # Errors
    /// A `ValueError` naming the accepted names for any other (case-sensitive) name.
    pub fn parse(name: &str) -> Result<BackendChoice> {
        match name {
            "auto" => Ok(BackendChoice::Auto),
            "gpu" => Ok(BackendChoice::Gpu),
            "cpu" => Ok(BackendChoice::Cpu),
            other => Err(Error::value(format!(
                "unknown backend '{other}': expected auto, gpu or cpu"
            ))),
        }
    }
}

impl std::str::FromStr for BackendChoice {
    type Err = crate::error::Error;

    /// As [`BackendChoice::parse`].
    fn from_str(name: &str) -> crate::error::Result<BackendChoice> {
        BackendChoice::parse(name)
    }
}

/// The backend picked by [`select_backend`] and why.
#[derive(Debug, Clone)]
pub struct Selection {
    /// The backend to run on.
    pub backend: Arc<dyn Backend>,
    /// One sentence on why it was chosen.
    pub reason: String,
}

/// Picks a backend. `Gpu` fails with a `RuntimeError` when no adapter exists.
///
/// # Errors
/// For [`BackendChoice::Gpu`] only, those of [`GpuBackend::new`] (a `RuntimeError`: no adapter, a
/// device that cannot be opened). `Auto` falls back to the CPU backend instead, and `Cpu` never
/// fails.
pub async fn select_backend(choice: BackendChoice) -> Result<Selection> {
    match choice {
        BackendChoice::Cpu => Ok(Selection {
            backend: Arc::new(CpuBackend::new()),
            reason: "the CPU backend was requested".into(),
        }),
        BackendChoice::Gpu => {
            let gpu = GpuBackend::new().await?;
            let reason = format!("the GPU backend was requested: {}", gpu.info().name);
            Ok(Selection {
                backend: Arc::new(gpu),
                reason,
            })
        }
        BackendChoice::Auto => match GpuBackend::new().await {
            Ok(gpu) if gpu.info().device_type != "Cpu" => {
                let reason = format!(
                    "found a hardware adapter: {} ({})",
                    gpu.info().name,
                    gpu.info().device_type
                );
                Ok(Selection {
                    backend: Arc::new(gpu),
                    reason,
                })
            }
            Ok(gpu) => Ok(Selection {
                backend: Arc::new(CpuBackend::new()),
                reason: format!(
                    "the only adapter, {}, is a software rasterizer on the host's cores: the native CPU backend is faster there",
                    gpu.info().name
                ),
            }),
            Err(err) => Ok(Selection {
                backend: Arc::new(CpuBackend::new()),
                reason: format!("no GPU adapter: {}", err.message()),
            }),
        },
    }
}
