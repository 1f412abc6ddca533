//! What the backend and every arena it creates share: the device and queue ([`GpuShared`]),
//! and the error of a lost device.

use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use super::spare;
use crate::error::{Error, Result};

/// WebGPU guarantees this much per storage binding; larger arenas are split into chunks of at
/// most this size on every adapter, so the chunked path is the same everywhere.
pub const DEFAULT_MAX_BINDING_BYTES: u64 = 128 << 20;

/// The error of every call on a backend whose device was lost.
pub fn device_lost_error(reason: &str) -> Error {
    Error::runtime(format!(
        "the GPU device was lost ({reason}): objects made on it cannot be used any more; select a backend again (init() in JavaScript, init({{backend: 'cpu'}}) for the CPU backend) and make them anew"
    ))
}

/// Device and queue, shared by the backend and every arena it creates.
pub(crate) struct GpuShared {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    /// The first validation or out-of-memory error wgpu reported outside an error scope.
    pub(crate) uncaptured: Arc<Mutex<Option<String>>>,
    /// Why the device was lost (its device-lost callback), once it is.
    pub(crate) lost: Arc<Mutex<Option<String>>>,
    /// Dropped arenas' buffers, kept for the next arenas of their size.
    pub(crate) spare: spare::Spare,
}

impl GpuShared {
    /// The device-lost message, once the device is lost.
    pub(crate) fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Turns an error wgpu reported asynchronously into a `RuntimeError` (a lost device
    /// first: nothing made on it can be used any more).
    pub(crate) fn take_uncaptured(&self) -> Result<()> {
        if let Some(reason) = self.lost() {
            return Err(device_lost_error(&reason));
        }
        match self
            .uncaptured
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            Some(message) => Err(Error::runtime(format!("GPU error: {message}"))),
            None => Ok(()),
        }
    }

    /// A uniform buffer holding `value` (a kernel's per-dispatch uniforms).
    pub(crate) fn uniform_buffer<T: bytemuck::Pod>(&self, label: &str, value: &T) -> wgpu::Buffer {
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytemuck::bytes_of(value),
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    /// Blocks natively until the device is idle; a no-op in browsers, where mapping callbacks
    /// run from the event loop.
    pub(crate) fn poll_wait(&self) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::runtime(format!("GPU poll failed: {e}")))?;
        Ok(())
    }
}
