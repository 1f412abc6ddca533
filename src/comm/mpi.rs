//! One rank per process over MPI (feature `mpi`): [`MpiWorld`] is the [`Communicator`] for a
//! job launched by `mpirun -np W`, each process holding one rank's arenas on its own backend.
//!
//! The transport is the system's MPI through rsmpi (Debian's OpenMPI in CI). Device data is
//! staged through host buffers only as far as MPI needs: host arenas (the CPU backend,
//! float64) are reduced in place, GPU arenas are read back once per collective and written
//! back. Sums use MPI's own reduction (`MPI_SUM` for float32 and float64; a commutative user
//! operation that rounds every addition for float16 and bfloat16, which MPI lacks), so, as
//! with gloo or NCCL in PyTorch, the order of a group's additions is the transport's: results
//! agree with the simulated world bit for bit for groups of two and within rounding
//! otherwise.
//!
//! Subgroups are `MPI_Comm_split` by `rank / group_size` (the contiguous groups of
//! [`new_subgroups`](super::new_subgroups)), created when first used and cached. Failures end
//! the whole job: [`MpiWorld::abort_with`] and the hook of [`install_panic_hook`] call
//! `MPI_Abort`, so no rank is left waiting in a collective.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mpi::Count;
use mpi::Threading;
use mpi::collective::{SystemOperation, UserOperation};
use mpi::datatype::{DynBuffer, DynBufferMut, PartitionMut};
use mpi::environment::Universe;
use mpi::raw::AsRaw;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::Communicator as _;
use mpi::traits::*;

use super::param_runs::merged_runs;
use super::regions::Words;
use super::scratch::scratch_of;
use super::{
    AllReduceMeanArgs, AllReduceScaledSumArgs, BroadcastRegion, CommStats, Communicator, MeanOrder,
    StatsCounter, one_rank, regions,
};
use crate::backend::gpu::GpuArena;
use crate::backend::kernels::{ParamStarts, Real};
use crate::backend::quotient::{divide_in_place, divide_into};
use crate::backend::{Arena, ArenaStorage, Backend};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};
use crate::transfer;

/// What the one-rank checks call a process of this world.
const HOLDER: &str = "an MPI process";

/// How long a failing rank waits for the others to fail the same way (so that every rank
/// reports a configuration error) before it aborts the job.
const FAILURE_GRACE: Duration = Duration::from_secs(2);

/// The MPI state. Every call into MPI is made with the [`MpiWorld`]'s lock held, which is what
/// `MPI_THREAD_SERIALIZED` (requested at initialization) allows.
struct Mpi {
    world: SimpleCommunicator,
    /// A duplicate of the world used only to agree on a failure, so that its barrier can never
    /// match a collective that other ranks are blocked in.
    errors: SimpleCommunicator,
    /// Subgroup communicators by group size.
    groups: HashMap<usize, SimpleCommunicator>,
    /// Scratch for the divided values and packed regions, kept between calls.
    send: Vec<u64>,
    recv: Vec<u64>,
    /// Declared last: dropped (`MPI_Finalize`) after the communicators above.
    _universe: Universe,
}

// SAFETY: MPI handles are plain identifiers, valid on any thread; MPI was initialized with
// MPI_THREAD_SERIALIZED and every use goes through `MpiWorld::lock`, so no two threads ever
// call MPI at once.
unsafe impl Send for Mpi {}

impl Mpi {
    /// The communicator of the group of `rank` in a partition into groups of `group_size`.
    fn group(
        &mut self,
        group_size: usize,
        rank: usize,
        world_size: usize,
    ) -> Result<&SimpleCommunicator> {
        if group_size == world_size {
            return Ok(&self.world);
        }
        let Mpi { world, groups, .. } = self;
        if let std::collections::hash_map::Entry::Vacant(slot) = groups.entry(group_size) {
            let color = Color::with_value((rank / group_size) as i32);
            let comm = world
                .split_by_color_with_key(color, rank as i32)
                .ok_or_else(|| Error::runtime("MPI_Comm_split returned no communicator"))?;
            slot.insert(comm);
        }
        groups
            .get(&group_size)
            .ok_or_else(|| Error::runtime("subgroup communicator missing"))
    }
}

/// This process's rank of an MPI job (see the module documentation).
///
/// Create it once per process with [`MpiWorld::initialize`] and share the `Arc`; MPI is
/// finalized when the last clone is dropped, so drop every algorithm holding one before the
/// process exits.
pub struct MpiWorld {
    rank: usize,
    size: usize,
    mpi: Mutex<Mpi>,
    stats: StatsCounter,
}

impl fmt::Debug for MpiWorld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiWorld")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl MpiWorld {
    /// Initializes MPI (`MPI_Init_thread`, serialized) and returns this process's world. A
    /// process started without `mpirun` is a world of one. Fails when MPI was initialized
    /// before in this process.
    ///
    /// # Errors
    /// A `RuntimeError` when MPI was initialized before in this process, or the MPI library does
    /// not offer `MPI_THREAD_SERIALIZED` threading.
    pub fn initialize() -> Result<Arc<MpiWorld>> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| {
                Error::runtime(
                    "MPI is already initialized in this process: create one MpiWorld and share it",
                )
            })?;
        if matches!(threading, Threading::Single | Threading::Funneled) {
            return Err(Error::runtime(format!(
                "this MPI library offers only {threading:?} threading; distopt needs Serialized"
            )));
        }
        let world = universe.world();
        let errors = world.duplicate();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        Ok(Arc::new(MpiWorld {
            rank,
            size,
            mpi: Mutex::new(Mpi {
                world,
                errors,
                groups: HashMap::new(),
                send: Vec::new(),
                recv: Vec::new(),
                _universe: universe,
            }),
            stats: StatsCounter::default(),
        }))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Whether this process was started by an MPI launcher (`mpirun`, `mpiexec`, `srun`), from
    /// the environment those set; without one a process would be a world of one.
    pub fn launched() -> bool {
        [
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
            "PMIX_RANK",
            "MPI_LOCALNRANKS",
        ]
        .iter()
        .any(|name| std::env::var_os(name).is_some())
    }

    fn lock(&self) -> MutexGuard<'_, Mpi> {
        self.mpi.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, update: impl FnOnce(&mut CommStats)) {
        self.stats.record(update);
    }

    /// Runs `collective` with the MPI state locked and its scratch buffers taken out of it (so
    /// that they can be borrowed beside its communicators), then puts them back.
    fn with_scratch<R>(&self, collective: impl FnOnce(&mut Mpi, Scratch<'_>) -> R) -> R {
        let mut guard = self.lock();
        let mpi = &mut *guard;
        let (mut send, mut recv) = (std::mem::take(&mut mpi.send), std::mem::take(&mut mpi.recv));
        let result = collective(mpi, (&mut send, &mut recv));
        (mpi.send, mpi.recv) = (send, recv);
        result
    }

    /// A barrier over the world.
    pub fn barrier(&self) {
        self.lock().world.barrier();
    }

    /// Ends the whole job because this rank failed: prints `message` to standard error with
    /// the rank, waits up to two seconds for the other ranks to fail too (a configuration
    /// error fails every rank the same way, and each says so), then `MPI_Abort`s the world
    /// with `code`, which ends every process. Never returns.
    pub fn abort_with(&self, message: &str, code: i32) -> ! {
        say(&format!(
            "distopt rank {} of {}: {message}\n",
            self.rank, self.size
        ));
        let Ok(guard) = self.mpi.try_lock() else {
            // The lock is held by a call that cannot finish: abort without agreeing.
            abort_world(code)
        };
        let mut barrier = guard.errors.immediate_barrier();
        let deadline = Instant::now() + FAILURE_GRACE;
        loop {
            match barrier.test() {
                Ok(_) => break,
                Err(pending) if Instant::now() < deadline => {
                    barrier = pending;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(pending) => {
                    // Dropping a pending request aborts the process; the job ends anyway.
                    std::mem::forget(pending);
                    break;
                }
            }
        }
        guard.world.abort(code)
    }

    /// Elementwise float32 all-reduce (sum) of `values` over the world, through MPI with no
    /// distopt layer around it: the peer the benchmark compares
    /// [`Communicator::all_reduce_mean`] with.
    ///
    /// # Errors
    /// A `ValueError` when `send` and `recv` differ in length.
    pub fn raw_all_reduce_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        if send.len() != recv.len() {
            return Err(Error::value("send and receive buffers differ in length"));
        }
        self.lock()
            .world
            .all_reduce_into(send, recv, SystemOperation::sum());
        Ok(())
    }

    fn check_one_rank(&self, arena: &Arena, what: &str) -> Result<()> {
        one_rank::check_one_rank(arena, what, HOLDER)
    }

    fn check_root(&self, root: usize, what: &str) -> Result<()> {
        super::check_root(root, self.size, what)
    }
}

/// Writes `line` to standard error in one call, so that lines of ranks sharing a terminal do
/// not interleave.
fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// `MPI_Abort` on the world without touching distopt's lock (which a panicking thread may
/// hold).
fn abort_world(code: i32) -> ! {
    // SAFETY: MPI_Abort may be called at any time after MPI_Init; it does not return.
    unsafe {
        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
    }
    std::process::abort()
}

/// Makes a panic on any thread end the whole MPI job promptly: the panic's message is printed
/// with the rank (by the previous hook), then `MPI_Abort` ends every process, so the other
/// ranks never wait in a collective for this one.
pub fn install_panic_hook(world: &MpiWorld) {
    let (rank, size) = (world.rank, world.size);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        say(&format!("distopt rank {rank} of {size} panicked:\n"));
        previous(info);
        abort_world(101);
    }));
}

unsafe extern "C" {
    /// `MPI_IN_PLACE` (src/comm/mpi_in_place.c).
    fn distopt_mpi_in_place() -> *mut std::ffi::c_void;
}

/// The float32 mean over `comm` of `values`, in place: each value divided by `divisor`, then
/// summed over the group with `MPI_IN_PLACE` (or, [`MeanOrder::SumThenDivide`], summed, then
/// divided), so that neither distopt nor MPI copies the data into a second buffer first (MPI
/// copies a separate send buffer into the receive buffer before it reduces).
fn all_reduce_mean_in_place_f32(
    comm: &SimpleCommunicator,
    values: &mut [f32],
    divisor: f32,
    order: MeanOrder,
) {
    if order == MeanOrder::DivideThenSum {
        divide_in_place(values, divisor);
    }
    // Every rank holds the same length, so every rank cuts the same pieces.
    for piece in values.chunks_mut(Count::MAX as usize) {
        // SAFETY: `piece` is valid for reads and writes of `piece.len()` (at most `Count::MAX`)
        // float32 values, which MPI_FLOAT describes, for the whole (blocking) call; the
        // communicator, datatype and operation are valid handles for it.
        let code = unsafe {
            mpi::ffi::MPI_Allreduce(
                distopt_mpi_in_place(),
                piece.as_mut_ptr().cast(),
                piece.len() as Count,
                mpi::ffi::RSMPI_FLOAT,
                mpi::ffi::RSMPI_SUM,
                comm.as_raw(),
            )
        };
        // MPI's default error handler aborts the job on a failure before this returns.
        debug_assert_eq!(code, 0, "MPI_Allreduce failed");
    }
    if order == MeanOrder::SumThenDivide {
        divide_in_place(values, divisor);
    }
}

/// The float32 mean over `comm` of elements `run` of a mapped device arena's one rank (lavapipe,
/// SwiftShader: device memory that is host memory), in place, as a host arena's: the buffer is
/// mapped once and reduced where it is ([`all_reduce_mean_in_place_f32`]). No copy of the arena
/// is made. `None`, before any MPI call, when the arena cannot be mapped in place (not mapped,
/// the run spans two chunk buffers): the caller stages a copy.
fn all_reduce_mean_mapped_f32(
    gpu: &GpuArena,
    comm: &SimpleCommunicator,
    run: &Range<usize>,
    divisor: f32,
    order: MeanOrder,
) -> Option<()> {
    gpu.update_in_place(0, run.start, run.len(), |words| {
        let values: &mut [f32] = bytemuck::cast_slice_mut(words);
        all_reduce_mean_in_place_f32(comm, values, divisor, order);
    })
}

/// float16 or bfloat16 bits, widened.
fn half_to_f32(format: StorageFormat, bits: u16) -> f32 {
    match format {
        StorageFormat::BF16 => half::bf16::from_bits(bits).to_f32(),
        _ => half::f16::from_bits(bits).to_f32(),
    }
}

/// `value` rounded to float16 or bfloat16 bits (nearest even).
fn f32_to_half(format: StorageFormat, value: f32) -> u16 {
    match format {
        StorageFormat::BF16 => crate::dtype::f32_to_bf16_bits(value),
        _ => crate::dtype::f32_to_f16_bits(value),
    }
}

/// The elements of this rank's arena row that an all-reduce covers: the flagged parameters'
/// runs, adjacent ones merged, their span (first start to last end) and their number.
struct RowRuns {
    runs: Vec<Range<usize>>,
    span: Range<usize>,
    total: usize,
}

impl RowRuns {
    /// The runs of the parameters `flags` marks; `None` when it marks none.
    fn of(starts: &ParamStarts, flags: &[bool], arena: &Arena) -> Option<RowRuns> {
        let runs = merged_runs(starts, flags, arena.rank_len());
        let span = runs.first()?.start..runs.last()?.end;
        let total = runs.iter().map(|r| r.len()).sum();
        Some(RowRuns { runs, span, total })
    }

    /// The [`Reduction`] of these elements of `words`, the row's words from element `base` on
    /// (see [`transfer::with_row_words`]), through `scratch` (send, receive).
    fn reduction<'a>(
        &'a self,
        comm: &'a SimpleCommunicator,
        scratch: Scratch<'a>,
        words: &'a mut [u32],
        base: usize,
    ) -> Reduction<'a, impl Iterator<Item = usize> + Clone + 'a> {
        let elements = self
            .runs
            .iter()
            .flat_map(move |run| run.start - base..run.end - base);
        let total = self.total;
        Reduction {
            comm,
            scratch,
            words,
            elements,
            total,
        }
    }
}

/// The MPI state's send and receive scratch buffers, taken out of it for one collective (see
/// [`MpiWorld::with_scratch`]).
type Scratch<'a> = (&'a mut Vec<u64>, &'a mut Vec<u64>);

/// An all-reduce through MPI of the listed elements (indices into `words`, `total` of them) of
/// one rank's words, over `comm`.
struct Reduction<'a, E> {
    comm: &'a SimpleCommunicator,
    scratch: Scratch<'a>,
    words: &'a mut [u32],
    elements: E,
    total: usize,
}

impl<E: Iterator<Item = usize> + Clone> Reduction<'_, E> {
    /// Each element's `quotient` (its value divided by the group size, or scaled, in the
    /// arithmetic type) into the send buffer, `op` over the group into the receive buffer, and
    /// each result `store`d back (none where `store` is `None`: a rank that contributes but does
    /// not receive).
    fn reduce<T, O>(
        self,
        quotient: impl Fn(&[u32], usize) -> T,
        store: Option<impl Fn(&mut [u32], usize, T)>,
        op: O,
    ) where
        T: bytemuck::Pod + mpi::datatype::Equivalence,
        O: mpi::collective::Operation,
    {
        let (send, recv) = self.scratch;
        let send: &mut [T] = scratch_of(send, self.total);
        for (s, i) in send.iter_mut().zip(self.elements.clone()) {
            *s = quotient(self.words, i);
        }
        let recv: &mut [T] = scratch_of(recv, self.total);
        self.comm.all_reduce_into(&send[..], &mut recv[..], op);
        if let Some(store) = store {
            for (&v, i) in recv.iter().zip(self.elements) {
                store(self.words, i, v);
            }
        }
    }

    /// The float64 or float32 (`T`) sum (`MPI_SUM`) of each element's `addend` of its value
    /// (zero where it does not `contribute`), made the `result` and stored back in `format`
    /// where this rank `receives`.
    fn sum<T>(
        self,
        format: StorageFormat,
        contributes: impl Fn(usize) -> bool,
        addend: impl Fn(T) -> T,
        result: impl Fn(T) -> T,
        receives: bool,
    ) where
        T: Real + bytemuck::Pod + mpi::datatype::Equivalence,
    {
        let zero = T::scalar(0.0);
        self.reduce(
            |words, k| match contributes(k) {
                true => addend(T::load(format, words, k)),
                false => zero,
            },
            receives.then_some(|words: &mut [u32], k, v| T::store(format, words, k, result(v))),
            SystemOperation::sum(),
        );
    }

    /// The sum in float16 or bfloat16 arithmetic (`half`, the arena's format): each element's
    /// `addend` of its value (zero where it does not `contribute`) and every addition rounded
    /// to it, made the `result` (in float32) and stored back where this rank `receives`.
    fn sum_half(
        self,
        half: StorageFormat,
        contributes: impl Fn(usize) -> bool,
        addend: impl Fn(f32) -> f32,
        result: impl Fn(f32) -> f32,
        receives: bool,
    ) {
        let add = half_sum(half);
        self.reduce(
            |words, k| match contributes(k) {
                true => f32_to_half(half, addend(half.load(words, k))),
                false => 0,
            },
            receives.then_some(|words: &mut [u32], k, v| {
                half.store(words, k, result(half_to_f32(half, v)))
            }),
            &add,
        );
    }
}

/// MPI's sum of float16 or bfloat16 words (`u16`), each addition rounded to `half`.
fn half_sum(half: StorageFormat) -> UserOperation<'static> {
    UserOperation::commutative(move |a: DynBuffer, b: DynBufferMut| {
        if let (Some(a), Some(b)) = (a.downcast::<u16>(), b.downcast::<u16>()) {
            for (x, y) in a.iter().zip(b.iter_mut()) {
                *y = f32_to_half(half, half_to_f32(half, *x) + half_to_f32(half, *y));
            }
        }
    })
}

/// The data of the one rank an MPI process holds.
fn only_rank<T>(per_local_rank: &[T]) -> Result<&T> {
    one_rank::only_rank(per_local_rank, HOLDER)
}

/// An object's length as MPI counts it.
fn count_of(bytes: &[u8]) -> Result<Count> {
    Count::try_from(bytes.len())
        .map_err(|_| Error::value("an object larger than 2 GiB cannot be gathered"))
}

impl Communicator for MpiWorld {
    fn world_size(&self) -> usize {
        self.size
    }

    fn local_ranks(&self) -> Range<usize> {
        self.rank..self.rank + 1
    }

    fn all_reduce_mean(
        &self,
        _backend: &dyn Backend,
        arena: &mut Arena,
        mean: AllReduceMeanArgs<'_>,
    ) -> Result<()> {
        self.check_one_rank(arena, "all_reduce")?;
        mean.check(self.size)?;
        let g = mean.groups.group_size();
        let Some(runs) = RowRuns::of(mean.starts, mean.active, arena) else {
            return Ok(());
        };
        let format = arena.format();
        self.with_scratch(|mpi, (send, recv)| {
            let comm = mpi.group(g, self.rank, self.size)?;
            if let (ArenaStorage::Gpu(gpu), StorageFormat::F32, StorageFormat::F32, [run]) =
                (&arena.storage, format, mean.arith, &runs.runs[..])
            {
                // A mapped device arena: reduced in place, as a host arena is.
                if let Some(()) = all_reduce_mean_mapped_f32(gpu, comm, run, g as f32, mean.order) {
                    return Ok(());
                }
            }
            transfer::with_row_words(arena, runs.span.clone(), |words, base| {
                let every = |_: usize| true;
                match (format, mean.arith) {
                    (StorageFormat::F32, StorageFormat::F32) => {
                        let values: &mut [f32] = bytemuck::cast_slice_mut(words);
                        let at = |run: &Range<usize>| run.start - base..run.end - base;
                        let divisor = g as f32;
                        if let [run] = &runs.runs[..] {
                            // One run: reduced where it is.
                            let run = &mut values[at(run)];
                            all_reduce_mean_in_place_f32(comm, run, divisor, mean.order);
                        } else {
                            // Several runs: gathered into one message, summed, scattered back.
                            let send: &mut [f32] = scratch_of(send, runs.total);
                            let mut k = 0;
                            let each = mean.order.divisors(g as f64).0 as f32;
                            for run in &runs.runs {
                                divide_into(&mut send[k..k + run.len()], &values[at(run)], each);
                                k += run.len();
                            }
                            let recv: &mut [f32] = scratch_of(recv, runs.total);
                            comm.all_reduce_into(&send[..], recv, SystemOperation::sum());
                            if mean.order == MeanOrder::SumThenDivide {
                                divide_in_place(recv, divisor);
                            }
                            let mut k = 0;
                            for run in &runs.runs {
                                values[at(run)].copy_from_slice(&recv[k..k + run.len()]);
                                k += run.len();
                            }
                        }
                    }
                    (_, StorageFormat::F64) => {
                        let (each, after) = mean.order.divisors(g as f64);
                        let reduction = runs.reduction(comm, (send, recv), words, base);
                        reduction.sum(format, every, |x: f64| x / each, |s| s / after, true);
                    }
                    (_, StorageFormat::F32) => {
                        let (each, after) = mean.order.divisors(g as f64);
                        let (each, after) = (each as f32, after as f32);
                        let reduction = runs.reduction(comm, (send, recv), words, base);
                        reduction.sum(format, every, |x: f32| x / each, |s| s / after, true);
                    }
                    (_, half) => {
                        // float16 / bfloat16 arithmetic: only parameters of that one format
                        // promote to it. Every quotient and every addition rounds to it.
                        if format != half {
                            return Err(Error::value(format!(
                                "cannot average {format:?} parameters in {half:?}"
                            )));
                        }
                        let (each, after) = mean.order.divisors(g as f64);
                        let (each, after) = (each as f32, after as f32);
                        let reduction = runs.reduction(comm, (send, recv), words, base);
                        reduction.sum_half(half, every, |x| x / each, |s| s / after, true);
                    }
                }
                Ok(())
            })
        })?;
        self.record(|s| s.add_all_reduce(g, mean.bytes_per_rank));
        Ok(())
    }

    fn all_reduce_scaled_sum(
        &self,
        _backend: &dyn Backend,
        arena: &mut Arena,
        sum: AllReduceScaledSumArgs<'_>,
    ) -> Result<()> {
        self.check_one_rank(arena, "all_reduce")?;
        sum.check(arena)?;
        let Some(runs) = RowRuns::of(sum.starts, sum.reduced, arena) else {
            return Ok(());
        };
        let format = arena.format();
        let scale = sum.scales[0];
        let s = scale.unwrap_or(0.0);
        let receives = scale.is_some();
        self.with_scratch(|mpi, scratch| {
            transfer::with_row_words(arena, runs.span.clone(), |words, base| {
                // Whether element k's value goes into the sum (a joined rank and an absent
                // gradient contribute zeros, as DDP's zero-filled buckets do).
                let contributes = |k| receives && sum.present[sum.starts.param_of(k + base)];
                let reduction = runs.reduction(&mpi.world, scratch, words, base);
                match sum.arith {
                    StorageFormat::F64 => {
                        reduction.sum(format, contributes, |x: f64| x * s, |x| x, receives)
                    }
                    StorageFormat::F32 => {
                        let s = s as f32;
                        reduction.sum(format, contributes, |x: f32| x * s, |x| x, receives);
                    }
                    half => {
                        // float16 / bfloat16 arithmetic: every product and addition rounds to it.
                        if format != half {
                            return Err(Error::value(format!(
                                "cannot reduce {format:?} values in {half:?}"
                            )));
                        }
                        let s = s as f32;
                        reduction.sum_half(half, contributes, |x| x * s, |x| x, receives);
                    }
                }
                Ok(())
            })
        })?;
        self.record(|s| s.add_all_reduce(self.size, sum.bytes_per_rank));
        Ok(())
    }

    fn broadcast(
        &self,
        _backend: &dyn Backend,
        arena: &mut Arena,
        root: usize,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        self.check_one_rank(arena, "broadcast")?;
        self.check_root(root, "broadcast")?;
        arena.check_range(0, offset, len)?;
        let mut words = if root == self.rank {
            transfer::read_row_words(arena, 0, offset, len)?
        } else {
            vec![0u32; arena.format().words_for(len)]
        };
        self.lock()
            .world
            .process_at_rank(root as i32)
            .broadcast_into(&mut words[..]);
        if root != self.rank {
            arena.write(0, offset, &words)?;
        }
        let bytes = (len * arena.format().element_bytes()) as u64;
        self.record(|s| s.broadcast_bytes += bytes);
        Ok(())
    }

    fn broadcast_regions(
        &self,
        _backend: &dyn Backend,
        src: Option<&Arena>,
        dst: &mut Arena,
        root: usize,
        regions: &[BroadcastRegion],
    ) -> Result<()> {
        self.check_one_rank(dst, "broadcast")?;
        self.check_root(root, "broadcast")?;
        let bytes = regions::broadcast(src, dst, (root, self.rank), regions, |words| {
            let mut words = match words {
                Words::Send(words) => words,
                Words::Receive(len) => vec![0; len],
            };
            self.lock()
                .world
                .process_at_rank(root as i32)
                .broadcast_into(&mut words[..]);
            Ok(words)
        })?;
        self.record(|s| s.broadcast_bytes += bytes);
        Ok(())
    }

    fn all_reduce_sum_f32(&self, per_local_rank: &[Vec<f32>]) -> Result<Vec<f32>> {
        let mine = only_rank(per_local_rank)?;
        let mut sum = vec![0f32; mine.len()];
        self.lock()
            .world
            .all_reduce_into(&mine[..], &mut sum[..], SystemOperation::sum());
        let bytes = (mine.len() * 4) as u64;
        self.record(|s| s.add_all_reduce(self.size, bytes));
        Ok(sum)
    }

    fn broadcast_bytes(&self, root: usize, data: Option<Vec<u8>>) -> Result<Vec<u8>> {
        self.check_root(root, "broadcast")?;
        let mine = if root == self.rank {
            Some(super::root_data(root, data)?)
        } else {
            None
        };
        let guard = self.lock();
        let process = guard.world.process_at_rank(root as i32);
        // The length first, then the bytes.
        let mut len = mine.as_ref().map_or(0u64, |d| d.len() as u64);
        process.broadcast_into(&mut len);
        let mut bytes = mine.unwrap_or_else(|| vec![0u8; len as usize]);
        process.broadcast_into(&mut bytes[..]);
        drop(guard);
        self.record(|s| s.broadcast_bytes += len);
        Ok(bytes)
    }

    fn all_gather_bytes(&self, per_local_rank: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
        let mine = only_rank(&per_local_rank)?;
        let count = count_of(mine)?;
        let mut counts = vec![0 as Count; self.size];
        let guard = self.lock();
        guard.world.all_gather_into(&count, &mut counts[..]);
        let displs = displacements(&counts)?;
        let total = counts.iter().map(|&c| c as usize).sum();
        let mut all = vec![0u8; total];
        {
            let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            guard
                .world
                .all_gather_varcount_into(&mine[..], &mut partition);
        }
        drop(guard);
        self.record(|s| s.gather_bytes += (total - mine.len()) as u64);
        Ok(split(&all, &counts))
    }

    fn gather_bytes(
        &self,
        to: usize,
        per_local_rank: Vec<Vec<u8>>,
    ) -> Result<Option<Vec<Vec<u8>>>> {
        self.check_root(to, "gather")?;
        let mine = only_rank(&per_local_rank)?;
        let count = count_of(mine)?;
        let guard = self.lock();
        let root = guard.world.process_at_rank(to as i32);
        if to != self.rank {
            root.gather_into(&count);
            root.gather_varcount_into(&mine[..]);
            return Ok(None);
        }
        let mut counts = vec![0 as Count; self.size];
        root.gather_into_root(&count, &mut counts[..]);
        let displs = displacements(&counts)?;
        let total = counts.iter().map(|&c| c as usize).sum();
        let mut all = vec![0u8; total];
        {
            let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            root.gather_varcount_into_root(&mine[..], &mut partition);
        }
        drop(guard);
        self.record(|s| s.gather_bytes += (total - mine.len()) as u64);
        Ok(Some(split(&all, &counts)))
    }

    fn stats(&self) -> CommStats {
        self.stats.snapshot()
    }

    fn reset_stats(&self) {
        self.stats.reset();
    }
}

fn displacements(counts: &[Count]) -> Result<Vec<Count>> {
    let mut next: Count = 0;
    counts
        .iter()
        .map(|&c| {
            let at = next;
            next = next
                .checked_add(c)
                .ok_or_else(|| Error::value("gathered objects exceed 2 GiB in all"))?;
            Ok(at)
        })
        .collect()
}

fn split(all: &[u8], counts: &[Count]) -> Vec<Vec<u8>> {
    let mut at = 0;
    counts
        .iter()
        .map(|&c| {
            let part = all[at..at + c as usize].to_vec();
            at += c as usize;
            part
        })
        .collect()
}
