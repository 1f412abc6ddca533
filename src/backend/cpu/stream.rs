//! Output stores for the CPU kernels: plain, or non-temporal (streaming) on x86-64, which
//! spares the read-for-ownership of every destination line when the outputs do not fit in the
//! caches. A [`store_fence`] must follow streaming stores before their data is handed to
//! another thread.

use std::mem::MaybeUninit;

/// From this many bytes of traffic on, a step writes its outputs with streaming stores: the
/// working set no longer fits in the last-level cache, so caching the outputs would only cost
/// an extra read of every destination line.
pub(super) const STREAMING_THRESHOLD_BYTES: usize = 24 << 20;

/// Copies `src` into `dst` (equal lengths), with streaming stores when `streaming` is set and
/// the target has them.
#[inline]
pub(super) fn store_words(dst: &mut [u32], src: &[u32], streaming: bool) {
    assert_eq!(dst.len(), src.len(), "store_words: slices differ in length");
    // SAFETY: `dst` holds `src.len()` elements (asserted) and does not overlap `src` (it is
    // `&mut`).
    if !unsafe { stream(dst.as_mut_ptr(), src, streaming) } {
        dst.copy_from_slice(src);
    }
}

/// Writes `src` to `dst` with `stream_bytes` when `streaming` is set and the target has
/// streaming stores, and says whether it did (the caller copies otherwise).
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` elements that do not overlap `src`.
#[inline]
unsafe fn stream<T: Copy>(dst: *mut T, src: &[T], streaming: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    if streaming {
        // SAFETY: both ranges hold `size_of_val(src)` bytes and do not overlap (the caller's
        // contract); `T: Copy` has no drop glue, and every element is copied whole.
        unsafe { stream_bytes(dst.cast(), src.as_ptr().cast(), size_of_val(src)) };
        return true;
    }
    let _ = (dst, src, streaming);
    false
}

/// Copies `bytes` bytes from `s` to `d` with non-temporal 16-byte stores for the part of `d`
/// that is 16-byte aligned, plain copies for the ends. [`store_fence`] must follow before the
/// data is handed to another thread.
///
/// # Safety
/// `s` must be valid for `bytes` bytes of reads and `d` for `bytes` bytes of writes, and the
/// two ranges must not overlap.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_bytes(d: *mut u8, s: *const u8, bytes: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let head = d.align_offset(16).min(bytes);
    let body_end = head + (bytes - head) / 16 * 16;
    // SAFETY: every access lies in `0..bytes` of its range (the caller's contract); `d + k` is
    // 16-byte aligned in the loop (`d + head` is, and k - head is a multiple of 16); the loads
    // may be unaligned. SSE2 is part of x86-64.
    unsafe {
        std::ptr::copy_nonoverlapping(s, d, head);
        let mut k = head;
        while k < body_end {
            let v = _mm_loadu_si128(s.add(k).cast::<__m128i>());
            _mm_stream_si128(d.add(k).cast::<__m128i>(), v);
            k += 16;
        }
        std::ptr::copy_nonoverlapping(s.add(body_end), d.add(body_end), bytes - body_end);
    }
}

/// Makes the streaming stores issued so far visible before any later store (x86-64; a no-op
/// elsewhere).
#[inline]
pub(super) fn store_fence(streaming: bool) {
    #[cfg(target_arch = "x86_64")]
    if streaming {
        // SAFETY: SSE is part of x86-64.
        #[allow(unused_unsafe)]
        unsafe {
            std::arch::x86_64::_mm_sfence();
        }
    }
    let _ = streaming;
}

/// Writes `src` into `dst` (equal lengths), with streaming stores for the 16-byte-aligned
/// middle when `streaming` is set and the target has them.
#[inline]
pub(super) fn store_elements<T: Copy>(dst: &mut [MaybeUninit<T>], src: &[T], streaming: bool) {
    assert_eq!(
        dst.len(),
        src.len(),
        "store_elements: slices differ in length"
    );
    // SAFETY: `dst` holds `src.len()` elements (asserted) and does not overlap `src` (it is
    // `&mut`); a `MaybeUninit<T>` has the layout of a `T`.
    if !unsafe { stream(dst.as_mut_ptr().cast::<T>(), src, streaming) } {
        for (out, &x) in dst.iter_mut().zip(src) {
            out.write(x);
        }
    }
}
