//! The plain-Rust backend: the readable reference every GPU kernel is compared with, and the
//! fallback where no adapter exists. Kernels work block by block (so the inner loops
//! vectorize) and split large arenas across the host's cores.

use super::{Arena, ArenaStorage, Backend, BackendInfo, BackendKind, BoxFuture};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// Elements handled per block: small enough to stay in L1, a multiple of every format's
/// elements per word.
const BLOCK: usize = 1024;
/// Below this many elements moved, one thread is faster than spawning more.
const PARALLEL_THRESHOLD: usize = 1 << 16;

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
    /// A backend using every core the host offers (one thread on wasm32).
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
        1
    }
}

fn host(arena: &Arena) -> Result<&[u32]> {
    match &arena.storage {
        ArenaStorage::Host(words) => Ok(words),
        ArenaStorage::Gpu(_) => Err(Error::runtime(
            "this arena lives on a GPU device, not on the CPU backend",
        )),
    }
}

fn host_mut(arena: &mut Arena) -> Result<&mut [u32]> {
    match &mut arena.storage {
        ArenaStorage::Host(words) => Ok(words),
        ArenaStorage::Gpu(_) => Err(Error::runtime(
            "this arena lives on a GPU device, not on the CPU backend",
        )),
    }
}

/// Decodes elements `start..start + out.len()` of `words` (stored in `format`) into `out`.
#[inline]
fn load_block(format: StorageFormat, words: &[u32], start: usize, out: &mut [f32]) {
    match format {
        StorageFormat::F32 => {
            let len = out.len();
            for (o, &w) in out.iter_mut().zip(&words[start..start + len]) {
                *o = f32::from_bits(w);
            }
        }
        _ => {
            for (k, o) in out.iter_mut().enumerate() {
                *o = format.load(words, start + k);
            }
        }
    }
}

/// Rounds `values` to `format` and stores them at element `start` of `words`.
#[inline]
fn store_block(format: StorageFormat, words: &mut [u32], start: usize, values: &[f32]) {
    match format {
        StorageFormat::F32 => {
            for (w, &v) in words[start..start + values.len()].iter_mut().zip(values) {
                *w = v.to_bits();
            }
        }
        _ => {
            for (k, &v) in values.iter().enumerate() {
                format.store(words, start + k, v);
            }
        }
    }
}

/// Splits `words` (laid out `[rank][rank_words]`) into, per part, the slice of every rank that
/// covers that part's word range. `bounds` are word offsets within a rank.
fn split_ranks<'a>(
    words: &'a mut [u32],
    rank_words: usize,
    bounds: &[usize],
) -> Vec<Vec<&'a mut [u32]>> {
    let parts = bounds.len() - 1;
    let mut out: Vec<Vec<&mut [u32]>> = (0..parts).map(|_| Vec::new()).collect();
    for rank in words.chunks_exact_mut(rank_words) {
        let mut rest = rank;
        for (p, slot) in out.iter_mut().enumerate() {
            let (head, tail) = rest.split_at_mut(bounds[p + 1] - bounds[p]);
            slot.push(head);
            rest = tail;
        }
    }
    out
}

/// Element boundaries that split `len` elements into `parts` nearly equal, block-aligned parts.
fn part_bounds(len: usize, parts: usize) -> Vec<usize> {
    let blocks = len.div_ceil(BLOCK);
    (0..=parts)
        .map(|p| ((blocks * p / parts) * BLOCK).min(len))
        .collect()
}

/// Runs `work(part)` for each part, on scoped threads natively.
fn run_parts<T: Send>(parts: Vec<T>, work: impl Fn(T) + Sync) {
    #[cfg(not(target_arch = "wasm32"))]
    if parts.len() > 1 {
        std::thread::scope(|scope| {
            let work = &work;
            for part in parts {
                scope.spawn(move || work(part));
            }
        });
        return;
    }
    for part in parts {
        work(part);
    }
}

/// The reference data-parallel SGD step over one element range. `params[r]`, `means` and
/// `grads` cover elements `start..end` of the rank space (params/means slices begin at
/// `start`'s word; `grads` is the whole arena).
#[allow(clippy::too_many_arguments)]
fn dp_sgd_step_range(
    param_format: StorageFormat,
    grad_format: StorageFormat,
    params: &mut [&mut [u32]],
    means: &mut [u32],
    grads: &[u32],
    grad_rank_words: usize,
    elements: usize,
    first_element: usize,
    learning_rate: f32,
) {
    let ranks = params.len();
    let divisor = ranks as f32;
    let mut acc = [0f32; BLOCK];
    let mut scratch = [0f32; BLOCK];
    let mut start = 0;
    while start < elements {
        let n = BLOCK.min(elements - start);
        let (acc, scratch) = (&mut acc[..n], &mut scratch[..n]);
        acc.fill(0.0);
        for rank in 0..ranks {
            let rank_words = &grads[rank * grad_rank_words..(rank + 1) * grad_rank_words];
            load_block(grad_format, rank_words, first_element + start, scratch);
            for (a, &g) in acc.iter_mut().zip(scratch.iter()) {
                *a += g;
            }
        }
        // mean = round_P(acc / R); acc now holds the mean as the parameter's dtype sees it.
        for a in acc.iter_mut() {
            *a = param_format.round(*a / divisor);
        }
        store_block(param_format, means, start, acc);
        load_block(param_format, params[0], start, scratch);
        for (p, &m) in scratch.iter_mut().zip(acc.iter()) {
            let scaled = learning_rate * m;
            *p -= scaled;
        }
        for rank_words in params.iter_mut() {
            store_block(param_format, rank_words, start, scratch);
        }
        start += n;
    }
}

impl Backend for CpuBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn chunk_len(&self, rank_len: usize, _ranks: usize) -> usize {
        rank_len
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
        Ok(Arena::new(
            format,
            ranks,
            rank_len,
            rank_len,
            ArenaStorage::Host(vec![0; words]),
        ))
    }

    fn copy_elements(
        &self,
        src: &Arena,
        src_rank: usize,
        src_offset: usize,
        dst: &mut Arena,
        dst_rank: usize,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        check_same_format(src, dst)?;
        let words = src.read_range_host(src_rank, src_offset, len)?;
        dst.write(dst_rank, dst_offset, &words)
    }

    fn copy_arena(&self, src: &Arena, dst: &mut Arena) -> Result<()> {
        check_same_format(src, dst)?;
        let from = host(src)?;
        let to = host_mut(dst)?;
        if from.len() != to.len() {
            return Err(Error::value("copy_arena: arenas differ in size"));
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

    fn dp_sgd_step(
        &self,
        params: &mut Arena,
        grads: &Arena,
        means: &mut Arena,
        learning_rate: f32,
    ) -> Result<()> {
        check_step_arenas(params, grads, means)?;
        let (param_format, grad_format) = (params.format(), grads.format());
        let elements = params.rank_len();
        let ranks = params.ranks();
        let grad_rank_words = grad_format.words_for(elements);
        let param_rank_words = param_format.words_for(elements);
        let grads = host(grads)?;
        let parts = if elements * ranks >= PARALLEL_THRESHOLD {
            self.info.threads
        } else {
            1
        };
        let bounds = part_bounds(elements, parts);
        let word_bounds: Vec<usize> = bounds.iter().map(|&e| param_format.words_for(e)).collect();
        let param_parts = split_ranks(host_mut(params)?, param_rank_words, &word_bounds);
        let mean_parts = split_ranks(host_mut(means)?, param_rank_words, &word_bounds);
        let work: Vec<_> = param_parts
            .into_iter()
            .zip(mean_parts)
            .zip(bounds.windows(2))
            .map(|((p, mut m), w)| (p, m.pop().unwrap_or_default(), w[0], w[1] - w[0]))
            .collect();
        run_parts(work, |(mut p, m, first, n)| {
            dp_sgd_step_range(
                param_format,
                grad_format,
                &mut p,
                m,
                grads,
                grad_rank_words,
                n,
                first,
                learning_rate,
            )
        });
        Ok(())
    }

    fn synchronize(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

impl Arena {
    fn read_range_host(&self, rank: usize, offset: usize, len: usize) -> Result<Vec<u32>> {
        self.check_range(rank, offset, len)?;
        let per_word = self.format().elements_per_word();
        let start = rank * (self.rank_len() / per_word) + offset / per_word;
        Ok(host(self)?[start..start + self.format().words_for(len)].to_vec())
    }
}

pub(crate) fn check_same_format(src: &Arena, dst: &Arena) -> Result<()> {
    if src.format() != dst.format() {
        return Err(Error::value(format!(
            "cannot copy between arenas of formats {:?} and {:?}",
            src.format(),
            dst.format()
        )));
    }
    Ok(())
}

pub(crate) fn check_step_arenas(params: &Arena, grads: &Arena, means: &Arena) -> Result<()> {
    if params.ranks() != grads.ranks()
        || means.ranks() != 1
        || params.rank_len() != grads.rank_len()
        || params.rank_len() != means.rank_len()
        || params.format() != means.format()
        || params.chunk_len() != grads.chunk_len()
        || params.chunk_len() != means.chunk_len()
    {
        return Err(Error::value(format!(
            "dp_sgd_step arenas do not match: params {params:?}, grads {grads:?}, means {means:?}"
        )));
    }
    Ok(())
}
