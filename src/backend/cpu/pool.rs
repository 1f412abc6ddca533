//! A pool of worker threads that the host starts and lends to the CPU backend: the Web Workers
//! of the threaded WebAssembly build (`wasm32` with `atomics`), where `std::thread::spawn` does
//! not exist. Each worker calls [`WorkerPool::serve`] and never returns; [`WorkerPool::run`]
//! then splits a batch of parts between the caller and the workers.
//!
//! The caller never blocks in the browser's sense: it claims parts itself and spins until the
//! last one is done, so the pool also works from a page's main thread (where `Atomics.wait` is
//! refused). Idle workers sleep in `memory.atomic.wait32` (natively, on a condition variable).
//!
//! One batch runs at a time: the batch's state is one atomic word, `epoch | parts | next`, that
//! callers and workers claim parts from by compare-and-swap, so a part runs exactly once, and a
//! worker that wakes late finds the epoch changed and claims nothing of a later batch by mistake.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Largest number of parts in one batch (the `parts` and `next` fields are 16 bits each).
pub const MAX_PARTS: usize = u16::MAX as usize;

/// The pool of the threaded WebAssembly build (natively, nothing serves it and it stays empty).
pub static GLOBAL: WorkerPool = WorkerPool::new();

/// Worker threads that run the parts of one batch at a time (see the module documentation).
pub struct WorkerPool {
    /// `epoch << 32 | parts << 16 | next`: the batch running and the next part to claim.
    state: AtomicU64,
    /// The batch of the current epoch; only read by whoever claimed one of its parts.
    batch: AtomicPtr<Batch<'static>>,
    /// Bumped after `state` when a batch starts: the word idle workers sleep on.
    wake: AtomicU32,
    /// Workers serving the pool.
    workers: AtomicUsize,
    /// Set while a caller's batch is running (a second caller runs its parts itself).
    busy: AtomicBool,
    #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
    sleep: (std::sync::Mutex<()>, std::sync::Condvar),
}

/// One batch: the work of each part, and how many parts are not finished yet.
struct Batch<'a> {
    work: &'a (dyn Fn(usize) + Sync),
    remaining: AtomicUsize,
}

impl Default for WorkerPool {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("workers", &self.workers())
            .finish_non_exhaustive()
    }
}

impl WorkerPool {
    /// An empty pool (no workers: [`run`](Self::run) runs every part on the caller).
    pub const fn new() -> WorkerPool {
        WorkerPool {
            state: AtomicU64::new(0),
            batch: AtomicPtr::new(std::ptr::null_mut()),
            wake: AtomicU32::new(0),
            workers: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
            sleep: (std::sync::Mutex::new(()), std::sync::Condvar::new()),
        }
    }

    /// How many workers serve the pool.
    pub fn workers(&self) -> usize {
        self.workers.load(Ordering::Acquire)
    }

    /// Runs `work(part)` for every part in `0..parts`, each exactly once, on the caller and the
    /// pool's workers; returns when all are done. Without workers, while another batch runs,
    /// or for a single part, the caller runs them all in order.
    pub fn run(&self, parts: usize, work: &(dyn Fn(usize) + Sync)) {
        if parts <= 1
            || parts > MAX_PARTS
            || self.workers() == 0
            || self
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            (0..parts).for_each(work);
            return;
        }
        let batch = Batch {
            work,
            remaining: AtomicUsize::new(parts),
        };
        // The batch outlives every use of this pointer: it is only followed by whoever claims
        // one of its parts, and this function returns once all of them have finished.
        let pointer = &batch as *const Batch<'_> as *mut Batch<'static>;
        self.batch.store(pointer, Ordering::Release);
        let epoch = (self.state.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xffff_ffff;
        self.state
            .store(epoch << 32 | (parts as u64) << 16, Ordering::Release);
        self.wake.store(epoch as u32, Ordering::Release);
        self.notify();
        while let Some((part, claimed)) = self.claim() {
            // SAFETY: a part of the batch above, claimed from its own epoch.
            unsafe { finish(claimed, part) };
        }
        while batch.remaining.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
        self.busy.store(false, Ordering::Release);
    }

    /// Serves the pool on the calling thread, for good: the entry of a worker thread.
    pub fn serve(&self) -> ! {
        self.workers.fetch_add(1, Ordering::AcqRel);
        loop {
            let seen = self.wake.load(Ordering::Acquire);
            while let Some((part, claimed)) = self.claim() {
                // SAFETY: a part claimed from the epoch it belongs to.
                unsafe { finish(claimed, part) };
            }
            self.wait(seen);
        }
    }

    /// Claims the next part of the running batch: its index and the batch. The batch pointer
    /// is read between the state and the compare-and-swap that claims a part, so on success
    /// it is that epoch's batch, which cannot finish before the claimed part does.
    fn claim(&self) -> Option<(usize, *const Batch<'static>)> {
        loop {
            let state = self.state.load(Ordering::Acquire);
            let parts = (state >> 16) & 0xffff;
            let next = state & 0xffff;
            if next >= parts {
                return None;
            }
            let batch = self.batch.load(Ordering::Acquire);
            if self
                .state
                .compare_exchange_weak(state, state + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some((next as usize, batch));
            }
        }
    }

    /// Sleeps until `wake` differs from `seen` (or a spurious wake-up).
    fn wait(&self, seen: u32) {
        #[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
        // SAFETY: `wake` is a live, aligned 32-bit word of the shared memory.
        unsafe {
            core::arch::wasm32::memory_atomic_wait32(self.wake.as_ptr().cast(), seen as i32, -1);
        }
        #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
        {
            let (lock, condvar) = &self.sleep;
            let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
            if self.wake.load(Ordering::Acquire) == seen {
                let _guard = condvar.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
        }
    }

    /// Wakes every sleeping worker.
    fn notify(&self) {
        #[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
        // SAFETY: as in `wait`.
        unsafe {
            core::arch::wasm32::memory_atomic_notify(self.wake.as_ptr().cast(), u32::MAX);
        }
        #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
        {
            let (lock, condvar) = &self.sleep;
            let _guard = lock.lock().unwrap_or_else(|e| e.into_inner());
            condvar.notify_all();
        }
    }
}

/// Runs a claimed part and counts it finished; the batch may be gone right after.
///
/// # Safety
/// `batch` must be the batch the part was claimed from, by [`WorkerPool::claim`].
unsafe fn finish(batch: *const Batch<'static>, part: usize) {
    // SAFETY: the batch is alive until its last part is counted finished (below).
    let batch = unsafe { &*batch };
    (batch.work)(part);
    batch.remaining.fetch_sub(1, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A pool served by `workers` native threads (they stay parked when the test ends).
    fn pool(workers: usize) -> &'static WorkerPool {
        let pool: &'static WorkerPool = Box::leak(Box::new(WorkerPool::new()));
        for _ in 0..workers {
            std::thread::spawn(move || pool.serve());
        }
        while pool.workers() < workers {
            std::thread::yield_now();
        }
        pool
    }

    #[test]
    fn every_part_runs_exactly_once_across_many_batches() {
        let pool = pool(3);
        for parts in [0, 1, 2, 3, 4, 7, 64, 1000] {
            for _ in 0..50 {
                let counts: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
                pool.run(parts, &|part| {
                    counts[part].fetch_add(1, Ordering::Relaxed);
                });
                for (part, count) in counts.iter().enumerate() {
                    assert_eq!(count.load(Ordering::Relaxed), 1, "part {part} of {parts}");
                }
            }
        }
    }

    #[test]
    fn parts_run_on_the_workers_too() {
        let pool = pool(2);
        let caller = std::thread::current().id();
        let elsewhere = Arc::new(AtomicUsize::new(0));
        // Parts that take a while, so that sleeping workers wake up in time to claim some.
        for _ in 0..20 {
            pool.run(8, &|_| {
                if std::thread::current().id() != caller {
                    elsewhere.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            });
        }
        assert!(
            elsewhere.load(Ordering::Relaxed) > 0,
            "no part ran on a worker"
        );
    }

    #[test]
    fn without_workers_or_while_busy_the_caller_runs_every_part() {
        let empty = WorkerPool::new();
        let order = std::sync::Mutex::new(Vec::new());
        empty.run(5, &|part| order.lock().unwrap().push(part));
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);

        // A batch started from inside a part (the pool is busy) runs on its caller.
        let pool = pool(1);
        let inner = AtomicUsize::new(0);
        pool.run(2, &|_| {
            pool.run(3, &|_| {
                inner.fetch_add(1, Ordering::Relaxed);
            })
        });
        assert_eq!(inner.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn the_parts_see_the_callers_borrowed_data() {
        let pool = pool(2);
        let mut data = vec![0u64; 4096];
        let chunks: Vec<std::sync::Mutex<Option<&mut [u64]>>> = data
            .chunks_mut(512)
            .map(|c| std::sync::Mutex::new(Some(c)))
            .collect();
        pool.run(chunks.len(), &|part| {
            let chunk = chunks[part].lock().unwrap().take().unwrap();
            for (i, x) in chunk.iter_mut().enumerate() {
                *x = (part * 512 + i) as u64;
            }
        });
        drop(chunks);
        assert!(data.iter().enumerate().all(|(i, &x)| x == i as u64));
    }
}
