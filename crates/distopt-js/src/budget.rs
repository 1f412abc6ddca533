//! The module's memory budget (wasm32): a 32-bit WebAssembly module has at most 4 GiB, and an
//! allocation that fails there aborts the module ("capacity overflow", `unreachable`) instead
//! of reporting. So the module counts its live heap bytes (a counting global allocator over
//! the default one) and every allocation whose size depends on the caller's input is checked
//! first against [`BUDGET_BYTES`]: a request that would pass it is a `RuntimeError` naming the
//! request, what is already in use and the budget, and the module stays usable. Large copies
//! also reserve fallibly (`try_reserve_exact`), so a refused `memory.grow` is reported too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use distopt::error::{Error, Result};

/// Live heap bytes the module may hold: 3 GiB of the 4 GiB a 32-bit module can address,
/// leaving room for the allocator's own overhead and short-lived copies.
pub(crate) const BUDGET_BYTES: u64 = 3 << 30;

static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The default allocator, counting the bytes it has handed out and not yet taken back.
struct Counting;

// SAFETY: every call forwards to `System` with the caller's arguments; the counter only
// observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap bytes the module holds now.
pub(crate) fn live_bytes() -> u64 {
    LIVE.load(Ordering::Relaxed) as u64
}

/// The error for a request of `bytes` for `what` that the budget refuses.
pub(crate) fn out_of_memory(what: &str, bytes: u64) -> Error {
    Error::runtime(format!(
        "out of memory: {what} needs {bytes} bytes, with {} bytes already in use the module's budget of {BUDGET_BYTES} bytes would be exceeded (a 32-bit WebAssembly module holds at most 4 GiB)",
        live_bytes()
    ))
}

/// Checks that `bytes` more for `what` fit the budget (nothing is allocated).
pub(crate) fn check(what: &str, bytes: u64) -> Result<()> {
    if live_bytes().saturating_add(bytes) > BUDGET_BYTES {
        return Err(out_of_memory(what, bytes));
    }
    Ok(())
}

/// `bytes` for `what` from an element count and an element size, checked.
pub(crate) fn check_elements(what: &str, elements: usize, element_bytes: usize) -> Result<()> {
    check(what, (elements as u64).saturating_mul(element_bytes as u64))
}

/// An empty vector with room for `len` elements, or the budget's error (never an abort).
pub(crate) fn vec_with_capacity<T>(what: &str, len: usize) -> Result<Vec<T>> {
    check_elements(what, len, std::mem::size_of::<T>())?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        out_of_memory(
            what,
            (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        )
    })?;
    Ok(v)
}
