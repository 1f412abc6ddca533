//! The plain-Rust backend: fused, multi-threaded twins of the reference kernels
//! (`backend::kernels`), and the fallback where no adapter exists. Kernels work block by block
//! (so the inner loops vectorize) and split large arenas across the host's cores.
//!
//! - `host_words`: host arenas (staggered starts, budget reservations);
//! - `threads`: splitting work into element ranges and running the parts;
//! - `pool`: the worker threads the threaded WebAssembly build's Web Workers lend;
//! - `half`: exact, branch-free 16-bit conversions and round trips;
//! - `f16c`: the same binary16 conversions in hardware (x86-64), for the step;
//! - `step`: the data-parallel SGD step over arenas (`shaders/dp_sgd_step.wgsl` on the GPU);
//! - `sgd`, `adam`, `average`: SGD, Adam/AdamW and group averaging over arenas, each the
//!   twin of the reference of its name in `backend/kernels/` (and of `backend/gpu/<kernel>.rs`,
//!   `shaders/<kernel>.wgsl`); scaled sums, pseudo-gradients and conversions run the reference;
//! - `parts`: splitting those kernels' steps into slot-aligned parts, and `run_best`;
//! - `storage`: how their loops read, round and write each storage format;
//! - `host_step`: the step straight from host tensors;
//! - `roofline`: the same-traffic kernel the benchmarks compare with;
//! - this file: `CpuBackend` and its `Backend` implementation.

mod adam;
mod average;
mod f16c;
mod half;
pub mod host_step;
pub(crate) mod host_words;
mod parts;
pub mod pool;
pub mod roofline;
mod sgd;
mod step;
mod storage;
mod stream;
#[cfg(test)]
mod test_arenas;
mod threads;

use self::host_words::HostWords;
use self::threads::{PARALLEL_THRESHOLD, part_bounds, run_parts, split_ranks};
use super::kernels::{
    self, AdamArenas, AdamScalars, AverageArgs, ConvertArgs, LerpArgs, ParamStarts, ScaledSumArgs,
    SgdArgs,
};
use super::{
    Arena, ArenaStorage, Backend, BackendInfo, BackendKind, BoxFuture, CopyRegion,
    check_copy_regions, check_param_table, check_same_format, host_words as host,
    host_words_mut as host_mut,
};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// The plain-Rust backend.
#[derive(Debug, Clone)]
pub struct CpuBackend {
    info: BackendInfo,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// A backend using every core the host offers (on wasm32, the caller and the workers
    /// serving `pool::GLOBAL`: one thread outside the threaded build).
    pub fn new() -> CpuBackend {
        Self::with_threads(default_threads())
    }

    /// A backend using `threads` worker threads (at least one).
    pub fn with_threads(threads: usize) -> CpuBackend {
        CpuBackend {
            info: BackendInfo {
                kind: BackendKind::Cpu,
                name: "distopt CPU backend (plain Rust)".into(),
                api: "host".into(),
                device_type: "Cpu".into(),
                driver: String::new(),
                max_binding_bytes: u64::MAX,
                max_buffer_bytes: u64::MAX,
                max_workgroups_per_dimension: u32::MAX,
                mappable_primary_buffers: true,
                threads: threads.max(1),
            },
        }
    }
}

fn default_threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
    #[cfg(target_arch = "wasm32")]
    {
        pool::GLOBAL.workers() + 1
    }
}

impl Backend for CpuBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn chunk_len(&self, rank_len: usize, _ranks: usize) -> usize {
        rank_len
    }

    /// Zero-filled, as [`Backend::create_arena`]: host memory comes from the allocator
    /// zeroed anyway.
    fn create_scratch_arena(
        &self,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
    ) -> Result<Arena> {
        self.create_arena(format, ranks, rank_len, chunk_len)
    }

    fn create_arena(
        &self,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        _chunk_len: usize,
    ) -> Result<Arena> {
        let words = ranks
            .checked_mul(format.words_for(rank_len))
            .ok_or_else(|| Error::value("arena size overflows"))?;
        let what = format!(
            "a host arena of {ranks} ranks × {rank_len} {} elements",
            format.dtype().name()
        );
        Ok(Arena::new(
            format,
            ranks,
            rank_len,
            rank_len,
            ArenaStorage::Host(HostWords::zeroed(words, &what)?),
        ))
    }

    fn copy_arena(&self, src: &Arena, dst: &mut Arena) -> Result<()> {
        check_same_format(src, dst)?;
        let from = host(src)?;
        let to = host_mut(dst)?;
        if from.len() != to.len() {
            return Err(Error::value("copy_arena: arenas differ in size"));
        }
        if from.is_empty() {
            return Ok(());
        }
        let parts = if from.len() >= PARALLEL_THRESHOLD {
            self.info.threads
        } else {
            1
        };
        let bounds = part_bounds(from.len(), parts);
        let pieces: Vec<(&mut [u32], &[u32])> = split_ranks(to, from.len(), &bounds)
            .into_iter()
            .zip(bounds.windows(2))
            .map(|(mut d, w)| (d.pop().unwrap_or_default(), &from[w[0]..w[1]]))
            .collect();
        run_parts(pieces, |(d, s)| d.copy_from_slice(s));
        Ok(())
    }

    fn dp_sgd_step_with_divisor(
        &self,
        params: &mut Arena,
        grads: &Arena,
        means: &mut Arena,
        learning_rate: f32,
        divisor: f32,
    ) -> Result<()> {
        step::dp_sgd_step(
            self.info.threads,
            params,
            grads,
            means,
            learning_rate,
            divisor,
        )
    }

    fn host_sgd_step(
        &self,
        params: &[host_step::HostStepParam<'_>],
        ranks: usize,
        learning_rate: f32,
        copies: usize,
    ) -> Option<Vec<host_step::HostStepResult>> {
        Some(host_step::host_step(
            self.info.threads,
            params,
            ranks,
            learning_rate,
            copies,
        ))
    }

    fn sgd(&self, args: SgdArgs<'_>) -> Result<()> {
        check_param_table("sgd", args.params, args.starts)?;
        sgd::sgd(self.info.threads, args)
    }

    fn adam(
        &self,
        arenas: AdamArenas<'_>,
        starts: &ParamStarts,
        scalars: &[AdamScalars],
    ) -> Result<()> {
        check_param_table("adam", arenas.params, starts)?;
        adam::adam(self.info.threads, arenas, starts, scalars)
    }

    fn average(&self, args: AverageArgs<'_>) -> Result<()> {
        check_param_table("average", args.arena, args.starts)?;
        average::average(self.info.threads, args)
    }

    fn scaled_sum(&self, args: ScaledSumArgs<'_>) -> Result<()> {
        check_param_table("scaled sum", args.arena, args.starts)?;
        if args.arena.ranks() == 0 {
            // No rank contributes or receives anything (the reference would read rank 0).
            args.check()?;
            return host(args.arena).map(|_| ());
        }
        kernels::scaled_sum_reference(args)
    }

    fn lerp(&self, args: LerpArgs<'_>) -> Result<()> {
        check_param_table("lerp", args.params, args.starts)?;
        kernels::lerp_reference(args)
    }

    fn convert(&self, args: ConvertArgs<'_>) -> Result<()> {
        check_param_table("convert", args.src, args.starts)?;
        kernels::convert_reference(args)
    }

    fn copy_regions(&self, src: &Arena, dst: &mut Arena, regions: &[CopyRegion]) -> Result<()> {
        check_copy_regions(src, dst, regions)?;
        let format = src.format();
        let (src_words, dst_words) = (
            format.words_for(src.rank_len()),
            format.words_for(dst.rank_len()),
        );
        let from = kernels::host_words(src)?;
        let to = kernels::host_words_mut(dst)?;
        for r in regions {
            let words = format.words_for(r.len);
            let s = r.src_rank * src_words + format.word_of(r.src_offset);
            let d = r.dst_rank * dst_words + format.word_of(r.dst_offset);
            to[d..d + words].copy_from_slice(&from[s..s + words]);
        }
        Ok(())
    }

    fn copy_between_ranks(
        &self,
        arena: &mut Arena,
        from: usize,
        to: usize,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        arena.check_range(from, offset, len)?;
        arena.check_range(to, offset, len)?;
        let format = arena.format();
        let rank_words = format.words_for(arena.rank_len());
        let (first, words) = (format.word_of(offset), format.words_for(len));
        let host = kernels::host_words_mut(arena)?;
        host.copy_within(
            from * rank_words + first..from * rank_words + first + words,
            to * rank_words + first,
        );
        Ok(())
    }

    fn synchronize(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }
}
