//! Splitting the CPU backend's work across threads: element ranges per part, and scoped
//! threads to run them (on wasm32, the Web Workers of `pool::GLOBAL` in the threaded build,
//! else one thread); and whole ranks per thread, for the kernels' by-rank fallbacks.

/// Elements handled per block, and the granularity of every split: the step's accumulator and
/// packed outputs of one block stay in L1 while the gradients of every rank stream past; a
/// multiple of every format's elements per word.
pub(super) const BLOCK: usize = 2048;
/// Below this many elements moved, one thread is faster than spawning more.
pub(super) const PARALLEL_THRESHOLD: usize = 1 << 16;

/// Splits `words` (laid out `[rank][rank_words]`) into, per part, the slice of every rank that
/// covers that part's word range. `bounds` are word offsets within a rank.
pub(super) fn split_ranks<'a>(
    words: &'a mut [u32],
    rank_words: usize,
    bounds: &[usize],
) -> Vec<Vec<&'a mut [u32]>> {
    let parts = bounds.len().saturating_sub(1);
    let mut out: Vec<Vec<&mut [u32]>> = (0..parts).map(|_| Vec::new()).collect();
    if rank_words == 0 {
        return out;
    }
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
pub(super) fn part_bounds(len: usize, parts: usize) -> Vec<usize> {
    let blocks = len.div_ceil(BLOCK);
    let parts = parts.max(1);
    (0..=parts)
        .map(|p| ((blocks * p / parts) * BLOCK).min(len))
        .collect()
}

/// Runs `work(part)` for each part: natively the last one on the calling thread, the others on
/// scoped threads; in the threaded WebAssembly build, on the caller and the pool's workers.
pub(super) fn run_parts<T: Send>(parts: Vec<T>, work: impl Fn(T) + Sync) {
    #[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
    if parts.len() > 1 && super::pool::GLOBAL.workers() > 0 {
        let slots: Vec<std::sync::Mutex<Option<T>>> = parts
            .into_iter()
            .map(|p| std::sync::Mutex::new(Some(p)))
            .collect();
        super::pool::GLOBAL.run(slots.len(), &|i| {
            let part = slots[i].lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(part) = part {
                work(part);
            }
        });
        return;
    }
    #[cfg(not(target_arch = "wasm32"))]
    if parts.len() > 1 {
        let mut parts = parts;
        let last = parts.pop();
        std::thread::scope(|scope| {
            let work = &work;
            for part in parts {
                scope.spawn(move || work(part));
            }
            if let Some(part) = last {
                work(part);
            }
        });
        return;
    }
    for part in parts {
        work(part);
    }
}

/// Runs `work(rank, rank slices…)` for every rank, on scoped threads natively when the arena
/// is large enough to pay for them.
pub(super) fn for_each_rank<T: Send>(
    items: Vec<T>,
    elements: usize,
    work: impl Fn(usize, T) + Sync,
) {
    #[cfg(target_arch = "wasm32")]
    let _ = elements;
    #[cfg(not(target_arch = "wasm32"))]
    if items.len() > 1 && elements * items.len() >= 1 << 16 {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(items.len());
        if threads > 1 {
            let mut buckets: Vec<Vec<(usize, T)>> = (0..threads).map(|_| Vec::new()).collect();
            for (rank, item) in items.into_iter().enumerate() {
                buckets[rank % threads].push((rank, item));
            }
            std::thread::scope(|scope| {
                let work = &work;
                for bucket in buckets {
                    scope.spawn(move || {
                        for (rank, item) in bucket {
                            work(rank, item);
                        }
                    });
                }
            });
            return;
        }
    }
    for (rank, item) in items.into_iter().enumerate() {
        work(rank, item);
    }
}
