//! Large host buffers recycled between calls, as PyTorch's CPU allocator recycles what the
//! previous step freed.
//!
//! A step from host tensors hands back new buffers on every call (the mean gradient and the
//! updated replicas). Fresh memory of that size comes from the operating system untouched, and
//! the first write to each page faults: on a small machine that costs more than the step's
//! arithmetic. So a large [`HostData`](crate::HostData) buffer that is dropped is kept here
//! (cleared, up to [`CAPACITY_BYTES`] in all) and handed back by `take` to the next output of
//! a close size, whose pages are then already mapped (a clone of a `HostData` too); the
//! packed images a step uploads to a device are recycled the same way.
//! [`release_cached_memory`] returns
//! everything kept to the allocator.

use std::sync::Mutex;

use half::{bf16, f16};

/// Buffers below this many bytes are not kept: the allocator recycles small blocks itself.
pub const MIN_BYTES: usize = 1 << 20;
/// At most this many bytes are kept in all.
pub const CAPACITY_BYTES: usize = 256 << 20;

/// The kept buffers, one shelf per element type, most recent last.
pub(crate) struct Pool {
    f32s: Vec<Vec<f32>>,
    f16s: Vec<Vec<f16>>,
    bf16s: Vec<Vec<bf16>>,
    f64s: Vec<Vec<f64>>,
    /// Packed arena images (`crate::transfer::pack_row`).
    words: Vec<Vec<u32>>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool::new());

/// An element type whose buffers are kept.
pub(crate) trait Recyclable: Sized + 'static {
    /// This type's shelf of `pool`.
    fn shelf(pool: &mut Pool) -> &mut Vec<Vec<Self>>;
}

macro_rules! recyclable {
    ($t:ty, $shelf:ident) => {
        impl Recyclable for $t {
            fn shelf(pool: &mut Pool) -> &mut Vec<Vec<$t>> {
                &mut pool.$shelf
            }
        }
    };
}
recyclable!(f32, f32s);
recyclable!(f16, f16s);
recyclable!(bf16, bf16s);
recyclable!(f64, f64s);
recyclable!(u32, words);

fn bytes_of<T>(v: &Vec<T>) -> usize {
    v.capacity() * std::mem::size_of::<T>()
}

impl Pool {
    const fn new() -> Pool {
        Pool {
            f32s: Vec::new(),
            f16s: Vec::new(),
            bf16s: Vec::new(),
            f64s: Vec::new(),
            words: Vec::new(),
            bytes: 0,
        }
    }

    /// Keeps `v` when it is large and fits (after dropping every kept buffer when it does not
    /// fit beside them); otherwise frees it.
    fn give<T: Recyclable>(&mut self, mut v: Vec<T>) {
        let bytes = bytes_of(&v);
        if !(MIN_BYTES..=CAPACITY_BYTES).contains(&bytes) {
            return;
        }
        if self.bytes + bytes > CAPACITY_BYTES {
            // Kept buffers of other sizes are stale: free them all.
            *self = Pool::new();
        }
        v.clear();
        T::shelf(self).push(v);
        self.bytes += bytes;
    }

    /// The most recently kept buffer with room for `len` elements and at most twice that.
    fn take<T: Recyclable>(&mut self, len: usize) -> Option<Vec<T>> {
        if len * std::mem::size_of::<T>() < MIN_BYTES {
            return None;
        }
        let shelf = T::shelf(self);
        let at = shelf
            .iter()
            .rposition(|v| v.capacity() >= len && v.capacity() / 2 <= len)?;
        let v = shelf.swap_remove(at);
        self.bytes -= bytes_of(&v);
        Some(v)
    }
}

/// Keeps `v`'s memory for a later [`take`] (see [`Pool::give`]).
pub(crate) fn give<T: Recyclable>(v: Vec<T>) {
    if bytes_of(&v) < MIN_BYTES {
        return;
    }
    if let Ok(mut pool) = POOL.lock() {
        pool.give(v);
    }
}

/// An empty vector with room for `len` elements whose memory was used before, when one of a
/// close size (`len` to `2·len` elements) is kept; `None` otherwise.
pub(crate) fn take<T: Recyclable>(len: usize) -> Option<Vec<T>> {
    POOL.lock().ok()?.take(len)
}

/// An empty vector with room for `len` elements: a kept buffer's memory when [`take`] has one
/// (no page faults), otherwise fresh.
pub(crate) fn with_capacity<T: Recyclable>(len: usize) -> Vec<T> {
    take(len).unwrap_or_else(|| Vec::with_capacity(len))
}

/// Returns every host buffer distopt keeps for reuse to the allocator (at most
/// [`CAPACITY_BYTES`]; see the module docs), like `torch.cuda.empty_cache()`.
pub fn release_cached_memory() {
    if let Ok(mut pool) = POOL.lock() {
        *pool = Pool::new();
    }
}

/// Bytes kept for reuse now.
pub fn cached_bytes() -> usize {
    POOL.lock().map_or(0, |pool| pool.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_serves_the_next_output_of_a_close_size_only() {
        let mut pool = Pool::new();
        let n = MIN_BYTES / 4 * 3;
        let mut v: Vec<f32> = vec![1.5; n];
        let address = v.as_ptr();
        v.truncate(7);
        pool.give(v);
        assert_eq!(pool.bytes, n * 4);
        // Another element type, a size it cannot hold, and one less than half of it: nothing.
        assert!(pool.take::<f64>(n / 2).is_none());
        assert!(pool.take::<f32>(n + 1).is_none());
        assert!(pool.take::<f32>(n / 2 - 1).is_none());
        let again = pool.take::<f32>(n - 5).expect("the kept buffer");
        assert_eq!(again.as_ptr(), address);
        assert!(again.is_empty() && again.capacity() >= n);
        assert_eq!(pool.bytes, 0);
        // Small buffers are not kept; nothing beyond the capacity is.
        pool.give(vec![0f32; 16]);
        assert_eq!(pool.bytes, 0);
        pool.give(again);
        pool.give(vec![0f64; CAPACITY_BYTES / 8 - 1000]);
        assert!(pool.bytes <= CAPACITY_BYTES);
        assert!(
            pool.take::<f32>(n).is_none(),
            "the older buffer was freed for room"
        );
        assert!(pool.take::<f64>(CAPACITY_BYTES / 8 - 1000).is_some());
        assert_eq!(pool.bytes, 0);
    }

    #[test]
    fn a_clone_has_the_values_whatever_memory_it_gets() {
        let n = MIN_BYTES / 4 + 3;
        let big = crate::HostData::Float32((0..n).map(|i| i as f32).collect());
        // Kept by the process's pool: the clone may be written into it.
        drop(crate::HostData::Float32(vec![7.0; n + 10]));
        let copy = big.clone();
        assert_eq!(copy, big);
        assert_eq!(copy.len(), n);
    }
}
