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
//!
//! A part that panics on a worker (a bug) never leaves the caller spinning: the part counts as
//! finished, the caller returns once the others are done, and the panic's message waits in the
//! pool for [`WorkerPool::take_panic`] (the JS bindings turn it into a `RuntimeError` of the
//! call). Where panics unwind (natively), the worker catches it and keeps serving. Where they
//! abort (the threaded WebAssembly build, `panic = "abort"`), nothing can be caught: the
//! module's panic hook calls [`note_panic`] first, which does the same bookkeeping on the
//! panicking worker and takes it out of the pool, and then the worker traps (its Web Worker
//! ends); the caller and the other workers carry on.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Mutex;
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
    /// Set when a part panicked on a worker and [`take_panic`](Self::take_panic) has not
    /// taken it yet; `panic_message` holds the first such message.
    panicked: AtomicBool,
    panic_message: Mutex<Option<String>>,
    #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
    sleep: (std::sync::Mutex<()>, std::sync::Condvar),
}

/// One batch: the work of each part, and how many parts are not finished yet.
struct Batch<'a> {
    work: &'a (dyn Fn(usize) + Sync),
    remaining: AtomicUsize,
}

/// A part of a batch that panicked on one of the pool's workers: what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerPanic {
    message: String,
}

impl WorkerPanic {
    /// The panic's message (its payload, or the panic hook's report with the location).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for WorkerPanic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The pool and the batch whose part this thread, a worker, is running now (null between
/// parts and on every other thread): what [`note_panic`] reports a panic to.
type Running = (*const WorkerPool, *const Batch<'static>);

thread_local! {
    static RUNNING: Cell<Running> = const { Cell::new((std::ptr::null(), std::ptr::null())) };
}

/// For a panic hook, before the panic aborts: if this thread is a worker running a part of a
/// pool's batch, and panics abort here (so that the worker cannot catch it and will trap right
/// after the hook), counts the part finished, leaves its `message` for the pool's
/// [`take_panic`](WorkerPool::take_panic) and takes the worker out of the pool, so that the
/// batch's caller returns instead of waiting for it. Elsewhere it does nothing (where panics
/// unwind, the worker catches them itself). The JS bindings' hook calls it.
pub fn note_panic(message: &dyn std::fmt::Display) {
    if cfg!(panic = "abort") {
        abandon_part(&message.to_string());
    }
}

/// [`note_panic`]'s bookkeeping, whatever the panic strategy: whether this thread was running
/// a part on a worker (which now counts as gone).
fn abandon_part(message: &str) -> bool {
    let (pool, batch) = RUNNING.with(|r| r.replace((std::ptr::null(), std::ptr::null())));
    if batch.is_null() {
        return false;
    }
    // SAFETY: set by `run_on_worker` for the part this thread is running: the pool outlives
    // its serving workers, and the batch lives until this part is counted finished (below).
    let pool = unsafe { &*pool };
    pool.workers.fetch_sub(1, Ordering::AcqRel);
    // SAFETY: as above.
    pool.part_panicked(unsafe { &*batch }, message);
    true
}

/// A panic payload's text.
fn payload_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
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
            panicked: AtomicBool::new(false),
            panic_message: Mutex::new(None),
            #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
            sleep: (std::sync::Mutex::new(()), std::sync::Condvar::new()),
        }
    }

    /// How many workers serve the pool.
    pub fn workers(&self) -> usize {
        self.workers.load(Ordering::Acquire)
    }

    /// The first panic of a part on a worker since the last call, if any (taken: the next call
    /// says `None` until another part panics). A batch in which one happened returned
    /// normally, with that part's work incomplete: whoever ran it must check.
    pub fn take_panic(&self) -> Option<WorkerPanic> {
        if !self.panicked.load(Ordering::Acquire) {
            return None;
        }
        let mut slot = self.panic_message.lock().unwrap_or_else(|e| e.into_inner());
        self.panicked.store(false, Ordering::Release);
        slot.take().map(|message| WorkerPanic { message })
    }

    /// Records a part of `batch` that panicked on a worker and counts it finished; the batch
    /// may be gone right after.
    fn part_panicked(&self, batch: &Batch<'_>, message: &str) {
        {
            let mut slot = self.panic_message.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert_with(|| message.to_string());
            self.panicked.store(true, Ordering::Release);
        }
        batch.remaining.fetch_sub(1, Ordering::Release);
    }

    /// Runs `work(part)` for every part in `0..parts`, each exactly once, on the caller and the
    /// pool's workers; returns when all are done. Without workers, while another batch runs,
    /// or for a single part, the caller runs them all in order.
    ///
    /// A part that panics on the caller panics the caller, once every other part has finished.
    /// A part that panics on a worker counts as finished: `run` returns, and the panic waits
    /// for [`take_panic`](Self::take_panic).
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
        let mut panic = None;
        while let Some((part, claimed)) = self.claim() {
            // SAFETY: a part of the batch above, claimed from its own epoch.
            let claimed = unsafe { &*claimed };
            // The workers may still be running parts of this batch: a panic here waits for
            // them (below) before it goes on.
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (claimed.work)(part))) {
                panic.get_or_insert(payload);
            }
            claimed.remaining.fetch_sub(1, Ordering::Release);
        }
        while batch.remaining.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
        self.busy.store(false, Ordering::Release);
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
    }

    /// Serves the pool on the calling thread, for good: the entry of a worker thread.
    pub fn serve(&self) -> ! {
        self.workers.fetch_add(1, Ordering::AcqRel);
        loop {
            let seen = self.wake.load(Ordering::Acquire);
            while let Some((part, claimed)) = self.claim() {
                // SAFETY: a part claimed from the epoch it belongs to.
                unsafe { self.run_on_worker(claimed, part) };
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

impl WorkerPool {
    /// Runs a part a worker claimed and counts it finished, panicked or not; the batch may be
    /// gone right after.
    ///
    /// # Safety
    /// `batch` must be the batch the part was claimed from, by [`WorkerPool::claim`].
    unsafe fn run_on_worker(&self, batch: *const Batch<'static>, part: usize) {
        RUNNING.with(|r| r.set((self, batch)));
        // SAFETY: the batch is alive until its last part is counted finished (below).
        let batch = unsafe { &*batch };
        let outcome = catch_unwind(AssertUnwindSafe(|| (batch.work)(part)));
        // Cleared already when the panic hook reported the part (`note_panic`).
        let (_, still) = RUNNING.with(|r| r.replace((std::ptr::null(), std::ptr::null())));
        match outcome {
            Ok(()) => {
                batch.remaining.fetch_sub(1, Ordering::Release);
            }
            Err(payload) if !still.is_null() => {
                self.part_panicked(batch, &payload_message(payload.as_ref()));
            }
            Err(_) => {}
        }
    }
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

    /// A batch of two parts on `pool` in which `on_worker` runs on a worker (the caller's part
    /// waits until a worker has started the other one, so one surely does), run by a caller
    /// thread: fails, instead of hanging, unless that caller returns within 10 s.
    fn run_with_a_worker_part(pool: &'static WorkerPool, on_worker: fn()) {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let caller = std::thread::current().id();
            let started = AtomicBool::new(false);
            pool.run(2, &|_| {
                if std::thread::current().id() == caller {
                    while !started.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                } else if !started.swap(true, Ordering::AcqRel) {
                    // The first worker to take a part runs `on_worker`; when both parts went
                    // to workers, the second one has nothing to do.
                    on_worker();
                }
            });
            let _ = done.send(());
        });
        finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the caller still waits for the part that panicked on a worker");
    }

    /// Runs batches until a part has run on a worker, checking that every part runs once.
    fn check_usable(pool: &WorkerPool) {
        let caller = std::thread::current().id();
        let elsewhere = AtomicUsize::new(0);
        for _ in 0..200 {
            let counts: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
            pool.run(8, &|part| {
                counts[part].fetch_add(1, Ordering::Relaxed);
                if std::thread::current().id() != caller {
                    elsewhere.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            if elsewhere.load(Ordering::Relaxed) > 0 {
                break;
            }
        }
        assert!(
            elsewhere.load(Ordering::Relaxed) > 0,
            "no part ran on a worker"
        );
        assert_eq!(pool.take_panic(), None);
    }

    #[test]
    fn a_part_that_panics_on_a_worker_is_reported_and_the_pool_goes_on() {
        let pool = pool(2);
        run_with_a_worker_part(pool, || panic!("boom on a worker"));
        let panic = pool.take_panic().expect("the worker's panic is reported");
        assert_eq!(panic.message(), "boom on a worker");
        assert_eq!(pool.take_panic(), None, "taken once");
        // The worker caught it and still serves.
        assert_eq!(pool.workers(), 2);
        check_usable(pool);
    }

    #[test]
    fn a_worker_lost_to_an_aborting_panic_is_reported_and_the_others_go_on() {
        // Where panics abort (the threaded WebAssembly build), the panic hook reports the part
        // (`note_panic`) and the worker then traps, never to return: here it parks for good.
        let pool = pool(2);
        run_with_a_worker_part(pool, || {
            assert!(abandon_part("boom, then abort"));
            loop {
                std::thread::park();
            }
        });
        assert_eq!(
            pool.take_panic().map(|p| p.message().to_string()),
            Some("boom, then abort".to_string())
        );
        assert_eq!(pool.workers(), 1, "the lost worker left the pool");
        check_usable(pool);
        // Off a worker's part, nothing is reported.
        assert!(!abandon_part("not on a worker"));
        assert_eq!(pool.take_panic(), None);
    }

    #[test]
    fn a_part_that_panics_on_the_caller_panics_it_after_the_others_finish() {
        let pool = pool(2);
        let caller = std::thread::current().id();
        let caller_ran = AtomicBool::new(false);
        let finished = AtomicUsize::new(0);
        // Three parts, two workers: the caller runs at least one; the workers' wait for it.
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            pool.run(3, &|_| {
                if std::thread::current().id() == caller {
                    caller_ran.store(true, Ordering::Release);
                    panic!("boom on the caller");
                }
                while !caller_ran.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
                finished.fetch_add(1, Ordering::AcqRel);
            })
        }));
        let payload = outcome.expect_err("the caller's panic goes on");
        assert_eq!(payload_message(payload.as_ref()), "boom on the caller");
        // Every part a worker took had finished before the panic left `run`.
        let on_workers = finished.load(Ordering::Acquire);
        assert!(on_workers <= 2);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(finished.load(Ordering::Acquire), on_workers);
        assert_eq!(pool.take_panic(), None);
        check_usable(pool);
    }
}
