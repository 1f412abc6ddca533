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
    #[cfg(target_arch = "x86_64")]
    if streaming {
        stream_words(dst, src);
        return;
    }
    let _ = streaming;
    dst.copy_from_slice(src);
}

/// `dst.copy_from_slice(src)` with non-temporal 16-byte stores for the aligned middle part.
/// [`store_fence`] must follow before the data is handed to another thread.
#[cfg(target_arch = "x86_64")]
fn stream_words(dst: &mut [u32], src: &[u32]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let len = dst.len();
    assert_eq!(len, src.len(), "stream_words: slices differ in length");
    let head = dst.as_ptr().align_offset(16).min(len);
    dst[..head].copy_from_slice(&src[..head]);
    let body_end = head + (len - head) / 4 * 4;
    let mut k = head;
    while k < body_end {
        // SAFETY: k + 4 <= body_end <= len == dst.len() == src.len(), so both 16-byte accesses
        // are in bounds; `dst + k` is 16-byte aligned (`dst + head` is, and k - head is a
        // multiple of 4 words); the load may be unaligned. SSE2 is part of x86-64.
        unsafe {
            let v = _mm_loadu_si128(src.as_ptr().add(k).cast::<__m128i>());
            _mm_stream_si128(dst.as_mut_ptr().add(k).cast::<__m128i>(), v);
        }
        k += 4;
    }
    dst[body_end..].copy_from_slice(&src[body_end..]);
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
    #[cfg(target_arch = "x86_64")]
    if streaming {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let bytes = std::mem::size_of_val(src);
        // SAFETY: both slices hold `bytes` bytes; `T: Copy` has no drop glue and any bytes of a
        // `T` copied whole are a valid `T` (the middle and the ends together copy every byte
        // of every element exactly once).
        unsafe {
            let (d, s) = (dst.as_mut_ptr().cast::<u8>(), src.as_ptr().cast::<u8>());
            let head = d.align_offset(16).min(bytes);
            std::ptr::copy_nonoverlapping(s, d, head);
            let body_end = head + (bytes - head) / 16 * 16;
            let mut k = head;
            while k < body_end {
                // In bounds (k + 16 <= body_end <= bytes); `d + k` is 16-byte aligned.
                let v = _mm_loadu_si128(s.add(k).cast::<__m128i>());
                _mm_stream_si128(d.add(k).cast::<__m128i>(), v);
                k += 16;
            }
            std::ptr::copy_nonoverlapping(s.add(body_end), d.add(body_end), bytes - body_end);
        }
        return;
    }
    let _ = streaming;
    for (out, &x) in dst.iter_mut().zip(src) {
        out.write(x);
    }
}
