//! The bindings' side of the module's memory budget (`distopt::budget`, 2 GiB on wasm32 by
//! default): a 32-bit WebAssembly module has at most 4 GiB, and an allocation that fails there
//! aborts the module ("capacity overflow", `unreachable`) instead of reporting. The library's
//! host arenas hold reservations for as long as they live; every copy the bindings make of a
//! caller's input is checked here first against what is left, so that a request that would
//! pass the budget is a `RuntimeError` naming the request and the budget, and the module stays
//! usable. Large copies also reserve fallibly (`try_reserve_exact`), so that a refused
//! `memory.grow` is reported too.

use distopt::budget;
use distopt::error::{Error, Result};

/// `bytes` as a `usize`, or the error for a request no 32-bit module could hold.
fn size(what: &str, bytes: u64) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| {
        Error::runtime(format!(
            "not enough memory for {what}: {bytes} bytes requested, more than a 32-bit WebAssembly module can address (its memory budget is {})",
            budget::human(budget::limit())
        ))
    })
}

/// Checks that `bytes` more for `what` fit the module's budget now (nothing is allocated or
/// counted).
pub(crate) fn check(what: &str, bytes: u64) -> Result<()> {
    budget::check(size(what, bytes)?, what)
}

/// Counts `bytes` for `what` against the module's budget until the reservation is dropped.
pub(crate) fn reserve(what: &str, bytes: u64) -> Result<budget::Reservation> {
    budget::reserve(size(what, bytes)?, what)
}

/// [`check`] for `elements` elements of `element_bytes` bytes each.
pub(crate) fn check_elements(what: &str, elements: usize, element_bytes: usize) -> Result<()> {
    check(what, (elements as u64).saturating_mul(element_bytes as u64))
}

/// A vector of `len` zero elements, checked against the budget and allocated fallibly (the
/// budget's error, never an abort).
pub(crate) fn zeroed<T: bytemuck::Zeroable>(what: &str, len: usize) -> Result<Vec<T>> {
    budget::zeroed(len, what)
}
