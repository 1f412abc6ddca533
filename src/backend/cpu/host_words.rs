//! Host memory of an arena: a word vector whose start is staggered between large arenas.
//!
//! The kernels stream through several arenas at the same element index at once (Adam reads
//! four and writes three). Large allocations all start at the same offset within a page, so
//! without a stagger the same element of every arena shares its address bits below 4 KiB
//! (and more): the loads of one array then falsely depend on the stores to another (4K
//! aliasing) and compete for the same cache sets. Measured here, Adam over 8 × 2^22 float32
//! elements ran in 82 ms with aligned arenas and 39 ms with staggered ones. Each large arena
//! therefore starts `k · (4 KiB + 64 B)` into its allocation, `k` cycling over eight values.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};

/// From this many words on, an arena is staggered (and, on Linux, backed by huge pages).
const LARGE_WORDS: usize = 1 << 20;
/// The stagger step: a page and a cache line, in words.
const STAGGER_WORDS: usize = (4096 + 64) / 4;
/// Distinct staggers.
const STAGGERS: usize = 8;

static NEXT_STAGGER: AtomicUsize = AtomicUsize::new(0);

/// The words of a host arena.
pub(crate) struct HostWords {
    buf: Vec<u32>,
    start: usize,
    len: usize,
    /// The bytes counted against the memory budget while these words live (`None` for a
    /// vector handed over whole, which was allocated and checked elsewhere).
    _reservation: Option<crate::budget::Reservation>,
}

impl HostWords {
    /// `len` zero words. A large vector is staggered (see the module docs) and, natively on
    /// Linux, marked for transparent huge pages before anything touches it (as PyTorch's CPU
    /// allocator does): first touching a fresh arena then takes one fault per 2 MiB instead of
    /// one per 4 KiB, and the kernels that stream through several arrays miss the TLB less.
    ///
    /// The words count against the memory budget ([`crate::budget`]) for as long as they live;
    /// a request over the budget, or one the allocator refuses, is a `RuntimeError` naming
    /// `what`.
    pub(crate) fn zeroed(len: usize, what: &str) -> crate::Result<HostWords> {
        let start = if len >= LARGE_WORDS {
            NEXT_STAGGER.fetch_add(1, Ordering::Relaxed) % STAGGERS * STAGGER_WORDS
        } else {
            0
        };
        let total = len.saturating_add(start);
        let reservation = crate::budget::reserve(crate::budget::bytes_of(total, 4, what)?, what)?;
        let buf = crate::budget::allocate_zeroed::<u32>(total, what)?;
        #[cfg(all(target_os = "linux", not(target_arch = "wasm32")))]
        if len >= LARGE_WORDS {
            advise_huge_pages(buf.as_ptr() as usize, buf.len() * 4);
        }
        Ok(HostWords {
            buf,
            start,
            len,
            _reservation: Some(reservation),
        })
    }
}

impl From<Vec<u32>> for HostWords {
    fn from(buf: Vec<u32>) -> HostWords {
        let len = buf.len();
        HostWords {
            buf,
            start: 0,
            len,
            _reservation: None,
        }
    }
}

impl Deref for HostWords {
    type Target = [u32];

    fn deref(&self) -> &[u32] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl DerefMut for HostWords {
    fn deref_mut(&mut self) -> &mut [u32] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// Asks Linux to back a fresh vector's memory with transparent huge pages before anything
/// touches it (no-op elsewhere and for small vectors): first touching it then takes one fault
/// per 2 MiB instead of one per 4 KiB. Memory the allocator recycles is unaffected.
pub(crate) fn prefer_huge_pages<T>(v: &Vec<T>) {
    let bytes = v.capacity() * std::mem::size_of::<T>();
    #[cfg(all(target_os = "linux", not(target_arch = "wasm32")))]
    if bytes >= LARGE_WORDS * 4 {
        advise_huge_pages(v.as_ptr() as usize, bytes);
    }
    let _ = bytes;
}

#[cfg(all(target_os = "linux", not(target_arch = "wasm32")))]
fn advise_huge_pages(start: usize, len: usize) {
    unsafe extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    const MADV_HUGEPAGE: i32 = 14;
    const HUGE_PAGE: usize = 2 << 20;
    let first = start.div_ceil(HUGE_PAGE) * HUGE_PAGE;
    let end = (start + len) / HUGE_PAGE * HUGE_PAGE;
    if end > first {
        // SAFETY: the range lies inside one live allocation this function's caller owns;
        // MADV_HUGEPAGE only changes how the kernel backs the pages, never their contents.
        // A failure (no THP support) changes nothing and is ignored.
        let _ = unsafe { madvise(first as *mut std::ffi::c_void, end - first, MADV_HUGEPAGE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_arenas_start_at_different_offsets_within_a_page() {
        let offsets: Vec<usize> = (0..STAGGERS)
            .map(|_| {
                HostWords::zeroed(LARGE_WORDS, "a test arena")
                    .unwrap()
                    .as_ptr() as usize
                    % 4096
            })
            .collect();
        let mut distinct = offsets.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), STAGGERS, "page offsets {offsets:?}");
        let w = HostWords::zeroed(LARGE_WORDS, "a test arena").unwrap();
        assert_eq!(w.len(), LARGE_WORDS);
        assert!(w.iter().all(|&x| x == 0));
    }
}
