//! Arena buffers kept for reuse on one device, as PyTorch's CUDA caching allocator keeps the
//! blocks a step freed.
//!
//! A step from host tensors creates its arenas, uses them once and drops them. A fresh buffer
//! costs more than its transfers: the device allocates it, and wgpu zero-fills it before its
//! first use (on a CPU-side adapter such as lavapipe, both are page faults and a memset of
//! fresh host memory). So a dropped arena's large chunk buffers are kept here (up to
//! [`CAPACITY_BYTES`] per device), and a new arena whose chunk has the same size takes one and
//! clears it on the device: an arena starts as zeros either way.

use std::sync::Mutex;

/// Buffers below this many bytes are not kept (creating them is cheap).
pub(crate) const MIN_BYTES: u64 = 1 << 20;
/// At most this many bytes of buffers are kept per device.
pub(crate) const CAPACITY_BYTES: u64 = 512 << 20;

/// The kept buffers of one device (every arena buffer of a device has the same usage).
#[derive(Default)]
pub(crate) struct Spare {
    buffers: Mutex<(Vec<wgpu::Buffer>, u64)>,
}

impl Spare {
    /// Keeps `buffer` when it is large and fits (after freeing every kept buffer when it does
    /// not fit beside them); otherwise drops it.
    pub(crate) fn give(&self, buffer: wgpu::Buffer) {
        let size = buffer.size();
        if !(MIN_BYTES..=CAPACITY_BYTES).contains(&size) {
            return;
        }
        let mut kept = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        if kept.1 + size > CAPACITY_BYTES {
            // Kept buffers of other sizes are stale: free them all.
            *kept = (Vec::new(), 0);
        }
        kept.0.push(buffer);
        kept.1 += size;
    }

    /// The most recently kept buffer of exactly `size` bytes, if any. Its contents are what
    /// its last arena left: the caller clears it.
    pub(crate) fn take(&self, size: u64) -> Option<wgpu::Buffer> {
        if size < MIN_BYTES {
            return None;
        }
        let mut kept = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        let at = kept.0.iter().rposition(|b| b.size() == size)?;
        let buffer = kept.0.swap_remove(at);
        kept.1 -= size;
        Some(buffer)
    }

    /// Bytes kept now.
    pub(crate) fn bytes(&self) -> u64 {
        self.buffers.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// Frees every kept buffer.
    pub(crate) fn release(&self) {
        *self.buffers.lock().unwrap_or_else(|e| e.into_inner()) = (Vec::new(), 0);
    }
}
