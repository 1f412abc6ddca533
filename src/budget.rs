//! The memory budget: one limit, per process natively and per module on wasm32, on the bytes
//! the library's big, input-sized allocations may hold at once.
//!
//! Every allocation whose size comes from input (a host arena, a tensor converted from
//! another dtype, the words a step packs or reads back) asks the budget first, so that an
//! absurd size is a typed error naming the request and the budget instead of an abort
//! ("memory allocation failed", exit 134) or a trap, and the process or module stays usable.
//! Two kinds of requests:
//!
//! - [`reserve`] counts bytes as *live* until the returned [`Reservation`] is dropped. Host
//!   arenas hold one for as long as they live, so the budget sees every arena at once (the
//!   fourth large `Replicas` fails cleanly when three fill the budget).
//! - [`check`] asks whether `bytes` more would fit now without counting them (for short-lived
//!   buffers: packing, readback, conversion); [`zeroed`] checks, then allocates with
//!   `try_reserve_exact`, so that an allocation the system refuses is an error as well.
//!
//! The limit is, by default, three quarters of physical memory natively (the smaller of
//! `/proc/meminfo`'s `MemTotal` and the cgroup's `memory.max` on Linux; 8 GiB where neither can
//! be read) and 2 GiB on wasm32 (half the 4 GiB address space: inputs arrive as copies, so
//! an arena needs room for its source as well). The environment variable
//! `DISTOPT_MEMORY_BUDGET` (natively; bytes, optionally with a suffix `K`, `M`, `G`, `T`,
//! `KiB`, `MiB`, `GiB`, `TiB`, `KB`, `MB`, `GB`, `TB`) or [`set_limit`] overrides it.
//!
//! GPU buffers are not counted: they live in device memory (wgpu refuses a buffer beyond the
//! device's limits itself), while this budget guards the process's own memory.
//!
//! ```
//! use distopt::budget;
//! let before = budget::in_use();
//! let held = budget::reserve(1 << 20, "a scratch buffer").unwrap();
//! assert!(budget::in_use() >= before + (1 << 20));
//! drop(held);
//! let err = budget::check(usize::MAX / 2, "an absurd request").unwrap_err();
//! assert_eq!(err.kind(), distopt::ErrorKind::RuntimeError);
//! assert!(err.message().contains("an absurd request"));
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};

/// The environment variable that overrides the default limit (natively).
pub const ENV_VAR: &str = "DISTOPT_MEMORY_BUDGET";

/// The default limit on wasm32: 2 GiB of the module's 4 GiB address space.
pub const WASM_DEFAULT_LIMIT: usize = 1 << 31;

/// The default limit natively when physical memory cannot be read.
pub const FALLBACK_LIMIT: u64 = 8 << 30;

/// `usize::MAX` marks "not yet initialized".
const UNSET: usize = usize::MAX;

static LIMIT: AtomicUsize = AtomicUsize::new(UNSET);
static IN_USE: AtomicUsize = AtomicUsize::new(0);

/// The current limit in bytes (the default on first use, see the module docs).
pub fn limit() -> usize {
    let current = LIMIT.load(Ordering::Relaxed);
    if current != UNSET {
        return current;
    }
    let initial = default_limit();
    match LIMIT.compare_exchange(UNSET, initial, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => initial,
        Err(set) => set,
    }
}

/// Sets the limit to `bytes` (for the whole process natively, the whole module on wasm32).
/// Bytes already reserved stay reserved; only later requests see the new limit.
pub fn set_limit(bytes: usize) {
    LIMIT.store(bytes.min(UNSET - 1), Ordering::Relaxed);
}

/// Restores the default limit (the environment's `DISTOPT_MEMORY_BUDGET` natively, if set
/// and valid).
pub fn reset_limit() {
    LIMIT.store(default_limit(), Ordering::Relaxed);
}

/// Bytes reserved now (live [`Reservation`]s).
pub fn in_use() -> usize {
    IN_USE.load(Ordering::Relaxed)
}

/// The default limit: `DISTOPT_MEMORY_BUDGET` if set and valid (an invalid value is logged
/// and ignored), else the platform default (see the module docs).
pub fn default_limit() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    if let Ok(text) = std::env::var(ENV_VAR) {
        match parse_bytes(&text) {
            Ok(bytes) => return bytes.min(UNSET - 1),
            Err(e) => log::warn!("{ENV_VAR} ignored: {}", e.message()),
        }
    }
    platform_default()
}

#[cfg(target_arch = "wasm32")]
fn platform_default() -> usize {
    WASM_DEFAULT_LIMIT
}

#[cfg(not(target_arch = "wasm32"))]
fn platform_default() -> usize {
    let physical = physical_memory().unwrap_or(FALLBACK_LIMIT);
    usize::try_from(physical / 4 * 3).unwrap_or(UNSET - 1)
}

/// Physical memory in bytes, as far as this process may use it: Linux's `MemTotal`, capped by
/// the cgroup's `memory.max` when that is set. `None` where neither can be read.
#[cfg(not(target_arch = "wasm32"))]
fn physical_memory() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))
                .and_then(|rest| rest.trim().strip_suffix("kB"))
                .and_then(|kb| kb.trim().parse::<u64>().ok())
                .map(|kb| kb.saturating_mul(1024))
        });
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    match (total, cgroup) {
        (Some(t), Some(c)) => Some(t.min(c)),
        (t, c) => t.or(c),
    }
}

/// Parses a byte count: digits, optionally followed by a unit (`K`, `M`, `G`, `T` and their
/// `KiB`/`KB` spellings, all powers of 1024, case-insensitive). A `ValueError` naming the
/// text otherwise.
///
/// # Errors
/// A `ValueError` when `text` (trimmed) is not digits with an optional known unit, or the count
/// overflows `usize`.
///
/// ```
/// assert_eq!(distopt::budget::parse_bytes("64MiB").unwrap(), 64 << 20);
/// assert_eq!(distopt::budget::parse_bytes("4096").unwrap(), 4096);
/// assert!(distopt::budget::parse_bytes("lots").is_err());
/// ```
pub fn parse_bytes(text: &str) -> Result<usize> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let bad = || {
        let shown: String = text.chars().take(40).collect();
        Error::value(format!(
            "invalid memory budget {shown:?}: expected bytes, e.g. 1073741824, 512MiB or 4G"
        ))
    };
    let n: usize = digits.parse().map_err(|_| bad())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1usize.checked_shl(shift).ok_or_else(bad)?)
        .ok_or_else(bad)
}

/// `bytes` in the largest binary unit that keeps it readable, e.g. `"1.50 GiB"`.
pub fn human(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

fn over_budget(bytes: usize, what: &str, used: usize, limit: usize) -> Error {
    Error::runtime(format!(
        "not enough memory for {what}: {bytes} bytes ({}) requested, {} of the {} memory budget \
         in use (set {ENV_VAR} to change the budget)",
        human(bytes),
        human(used),
        human(limit)
    ))
}

/// `count` elements of `size` bytes each, or a `RuntimeError` naming `what` when the product
/// overflows `usize`.
///
/// # Errors
/// A `RuntimeError` when `count * size` overflows `usize`.
pub fn bytes_of(count: usize, size: usize, what: &str) -> Result<usize> {
    count.checked_mul(size).ok_or_else(|| {
        Error::runtime(format!(
            "not enough memory for {what}: {count} elements of {size} bytes overflow the address space"
        ))
    })
}

/// Whether `bytes` more would fit the budget now, without counting them: `Ok` if so, else a
/// `RuntimeError` naming `what`, the request and the budget.
///
/// # Errors
/// A `RuntimeError` when `bytes` exceed what the budget has left.
pub fn check(bytes: usize, what: &str) -> Result<()> {
    let (used, limit) = (in_use(), limit());
    if bytes > limit.saturating_sub(used) {
        return Err(over_budget(bytes, what, used, limit));
    }
    Ok(())
}

/// Counts `bytes` as live until the returned [`Reservation`] is dropped; a `RuntimeError`
/// naming `what`, the request and the budget if they do not fit.
///
/// # Errors
/// A `RuntimeError` when `bytes` exceed what the budget has left.
pub fn reserve(bytes: usize, what: &str) -> Result<Reservation> {
    let limit = limit();
    let mut used = IN_USE.load(Ordering::Relaxed);
    loop {
        if bytes > limit.saturating_sub(used) {
            return Err(over_budget(bytes, what, used, limit));
        }
        match IN_USE.compare_exchange_weak(used, used + bytes, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => return Ok(Reservation { bytes }),
            Err(now) => used = now,
        }
    }
}

/// `len` zero values of `T` in a vector allocated after a [`check`] of its bytes: a request
/// over the budget, or one the allocator refuses, is a `RuntimeError` naming `what`, never an
/// abort.
///
/// # Errors
/// A `RuntimeError` when the vector's size overflows `usize`, exceeds what the budget has left, or
/// is refused by the allocator.
pub fn zeroed<T: bytemuck::Zeroable>(len: usize, what: &str) -> Result<Vec<T>> {
    check(bytes_of(len, std::mem::size_of::<T>(), what)?, what)?;
    allocate_zeroed(len, what)
}

/// `len` zero values of `T` without asking the budget (the caller holds a [`Reservation`] for
/// them): a refused allocation is a `RuntimeError`. The memory comes from the allocator's
/// zeroed allocation (`calloc`), as `vec![0; len]`'s does: a large block is fresh pages the
/// kernel zeroes on first touch, so nothing touches them here, and a caller can still ask for
/// transparent huge pages before the first touch (writing the zeros here would fault every
/// page in as a 4 KiB page first).
pub(crate) fn allocate_zeroed<T: bytemuck::Zeroable>(len: usize, what: &str) -> Result<Vec<T>> {
    let bytes = bytes_of(len, std::mem::size_of::<T>(), what)?;
    let refused = || {
        Error::runtime(format!(
            "not enough memory for {what}: the allocator refused {bytes} bytes ({})",
            human(bytes)
        ))
    };
    if bytes == 0 {
        return Ok(std::iter::repeat_with(T::zeroed).take(len).collect());
    }
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| refused())?;
    // SAFETY: `layout` has a non-zero size (`bytes > 0`).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(refused());
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `len` values of
    // `T` (so its capacity is `len`), and all of its bytes are zero, a valid `T` (`Zeroable`).
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// Bytes counted against the budget (see [`reserve`]); released when dropped.
#[derive(Debug)]
pub struct Reservation {
    bytes: usize,
}

impl Reservation {
    /// The bytes this reservation holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        IN_USE.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_vectors_hold_zeros_and_can_grow() {
        for len in [0usize, 1, 7, 1 << 20] {
            let mut words: Vec<u32> = zeroed(len, "a test vector").unwrap();
            assert_eq!(words.len(), len);
            assert!(words.iter().all(|&w| w == 0), "len {len}");
            words.push(5);
            assert_eq!(words[len], 5);
        }
        let halves: Vec<u16> = allocate_zeroed(3, "a test vector").unwrap();
        assert_eq!(halves, vec![0u16; 3]);
        let e = zeroed::<u64>(usize::MAX / 4, "a huge vector").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::RuntimeError, "{e}");
    }

    #[test]
    fn byte_counts_parse_with_binary_units() {
        assert_eq!(parse_bytes("0").unwrap(), 0);
        assert_eq!(parse_bytes("1k").unwrap(), 1024);
        assert_eq!(parse_bytes(" 3 GiB ").unwrap(), 3 << 30);
        assert_eq!(parse_bytes("2MB").unwrap(), 2 << 20);
        for bad in ["", "GiB", "1.5G", "-1", "1 PB", "99999999999999999999999"] {
            let e = parse_bytes(bad).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::ValueError, "{bad:?}");
            assert!(e.message().contains("invalid memory budget"), "{e}");
        }
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(3 << 29), "1.50 GiB");
    }

    #[test]
    fn the_platform_default_is_a_fraction_of_physical_memory() {
        let d = platform_default();
        assert!(d >= 1 << 28, "{d}");
        if let Some(p) = physical_memory() {
            assert!((d as u64) < p, "{d} of {p}");
        }
    }

    #[test]
    fn products_that_overflow_are_errors() {
        let e = bytes_of(usize::MAX, 4, "a huge tensor").unwrap_err();
        assert!(e.message().contains("a huge tensor"), "{e}");
        assert!(zeroed::<u64>(usize::MAX / 4, "a huge vector").is_err());
    }
}
