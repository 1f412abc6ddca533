//! What a backend runs on: [`BackendInfo`], as `distopt info` prints it.

/// Which implementation a backend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// wgpu on a GPU adapter (or a software adapter such as lavapipe or SwiftShader).
    Gpu,
    /// Plain Rust on the host's cores.
    Cpu,
}

/// What a backend runs on, as `distopt info` prints it.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendInfo {
    /// Gpu or Cpu.
    pub kind: BackendKind,
    /// Adapter or CPU name.
    pub name: String,
    /// Graphics API (Vulkan, Metal, Dx12, Gl, BrowserWebGpu) or `host`.
    pub api: String,
    /// Device type (DiscreteGpu, IntegratedGpu, VirtualGpu, Cpu, Other).
    pub device_type: String,
    /// Driver and its version, where the adapter reports them.
    pub driver: String,
    /// Largest storage buffer binding distopt uses (bytes); arenas above are chunked.
    pub max_binding_bytes: u64,
    /// Largest buffer the device allows (bytes).
    pub max_buffer_bytes: u64,
    /// Workgroups per dispatch dimension.
    pub max_workgroups_per_dimension: u32,
    /// Whether storage buffers can be mapped directly (unified memory).
    pub mappable_primary_buffers: bool,
    /// Worker threads (CPU backend).
    pub threads: usize,
}
