//! The wgpu backend: one `.wgsl` file per kernel family (see `shaders/`), pipelines created
//! once per (kernel, storage formats) and cached, arenas resident in device buffers.

mod arena;
pub mod shaders;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

pub(crate) use arena::GpuArena;

use super::cpu::{check_same_format, check_step_arenas};
use super::{Arena, ArenaStorage, Backend, BackendInfo, BackendKind, BoxFuture, oneshot};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// WebGPU guarantees this much per storage binding; larger arenas are split into chunks of at
/// most this size on every adapter, so the chunked path is the same everywhere.
pub const DEFAULT_MAX_BINDING_BYTES: u64 = 128 << 20;

/// Invocations per workgroup in every kernel (`WORKGROUP_SIZE` in `shaders/packing.wgsl`);
/// each invocation handles one pair of elements.
const WORKGROUP_SIZE: u32 = 256;

/// Device and queue, shared by the backend and every arena it creates.
pub(crate) struct GpuShared {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    /// The first validation or out-of-memory error wgpu reported outside an error scope.
    uncaptured: Arc<Mutex<Option<String>>>,
}

impl GpuShared {
    /// Turns an error wgpu reported asynchronously into a `RuntimeError`.
    fn take_uncaptured(&self) -> Result<()> {
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

/// Options for [`GpuBackend::with_options`].
#[derive(Debug, Clone)]
pub struct GpuOptions {
    /// Largest storage binding to use (bytes, capped by the adapter's limit); arenas larger
    /// than this are processed in chunks. Tests lower it to exercise chunking cheaply.
    pub max_binding_bytes: u64,
    /// Largest workgroup count per dimension to use (capped by the adapter's limit); more
    /// workgroups spill into a second dimension.
    pub max_workgroups_per_dimension: u32,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            max_binding_bytes: DEFAULT_MAX_BINDING_BYTES,
            max_workgroups_per_dimension: 65_535,
        }
    }
}

type PipelineKey = (&'static str, StorageFormat, StorageFormat);

/// The wgpu backend.
pub struct GpuBackend {
    shared: Arc<GpuShared>,
    info: BackendInfo,
    step_module: wgpu::ShaderModule,
    step_layout: wgpu::BindGroupLayout,
    step_pipeline_layout: wgpu::PipelineLayout,
    pipelines: Mutex<HashMap<PipelineKey, wgpu::ComputePipeline>>,
}

impl std::fmt::Debug for GpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBackend")
            .field("info", &self.info)
            .finish()
    }
}

/// The uniforms of `shaders/dp_sgd_step.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct StepUniforms {
    pairs: u32,
    ranks: u32,
    param_rank_words: u32,
    grad_rank_words: u32,
    learning_rate: f32,
    divisor: f32,
    _pad: [u32; 2],
}

impl GpuBackend {
    /// Opens the best adapter wgpu finds (high performance preferred) with default options.
    /// A `RuntimeError` when there is none (in a browser: when WebGPU is unavailable).
    pub async fn new() -> Result<GpuBackend> {
        Self::with_options(GpuOptions::default()).await
    }

    /// Blocking [`GpuBackend::new`] for native callers.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new_blocking() -> Result<GpuBackend> {
        pollster::block_on(Self::new())
    }

    /// Opens the best adapter with `options`.
    pub async fn with_options(options: GpuOptions) -> Result<GpuBackend> {
        #[cfg(target_arch = "wasm32")]
        if !wgpu::util::is_browser_webgpu_supported().await {
            return Err(Error::runtime(
                "WebGPU is not available in this environment",
            ));
        }
        let mut descriptor = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        if std::env::var_os("WGPU_BACKEND").is_none() {
            descriptor.backends = wgpu::Backends::all();
        }
        let instance = wgpu::Instance::new(descriptor);
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            })
            .await
            .map_err(|e| Error::runtime(format!("no GPU adapter found: {e}")))?;
        let adapter_limits = adapter.limits();
        let features = adapter.features() & wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("distopt"),
                required_features: features,
                required_limits: adapter_limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| Error::runtime(format!("could not open the GPU device: {e}")))?;
        let uncaptured = Arc::new(Mutex::new(None));
        {
            let sink = uncaptured.clone();
            device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
                log::error!("wgpu: {error}");
                let mut slot = sink.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert_with(|| error.to_string());
            }));
        }
        let adapter_info = adapter.get_info();
        let max_binding_bytes = options
            .max_binding_bytes
            .min(adapter_limits.max_storage_buffer_binding_size)
            .min(adapter_limits.max_buffer_size);
        let info = BackendInfo {
            kind: BackendKind::Gpu,
            name: adapter_info.name.clone(),
            api: format!("{:?}", adapter_info.backend),
            device_type: format!("{:?}", adapter_info.device_type),
            driver: format!("{} {}", adapter_info.driver, adapter_info.driver_info)
                .trim()
                .to_string(),
            max_binding_bytes,
            max_buffer_bytes: adapter_limits.max_buffer_size,
            max_workgroups_per_dimension: options
                .max_workgroups_per_dimension
                .min(adapter_limits.max_compute_workgroups_per_dimension)
                .max(1),
            mappable_primary_buffers: features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
            threads: 1,
        };
        let step_module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("dp_sgd_step"),
            source: wgpu::ShaderSource::Wgsl(shaders::DP_SGD_STEP.into()),
        });
        let storage = |binding, read_only| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let step_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("dp_sgd_step"),
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                },
                storage(1, true),
                storage(2, false),
                storage(3, false),
            ],
        });
        let step_pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("dp_sgd_step"),
            bind_group_layouts: &[Some(&step_layout)],
            immediate_size: 0,
        });
        let shared = Arc::new(GpuShared {
            device,
            queue,
            uncaptured,
        });
        shared.take_uncaptured()?;
        Ok(GpuBackend {
            shared,
            info,
            step_module,
            step_layout,
            step_pipeline_layout,
            pipelines: Mutex::new(HashMap::new()),
        })
    }

    fn gpu<'a>(&self, arena: &'a Arena) -> Result<&'a GpuArena> {
        match &arena.storage {
            ArenaStorage::Gpu(gpu) if Arc::ptr_eq(&gpu.shared, &self.shared) => Ok(gpu),
            ArenaStorage::Gpu(_) => Err(Error::runtime(
                "this arena belongs to another GPU device than the backend it was passed to",
            )),
            ArenaStorage::Host(_) => Err(Error::runtime(
                "this arena lives on the CPU backend, not on a GPU device",
            )),
        }
    }

    /// The cached pipeline of `kernel` specialised for the two formats (created on first use).
    fn pipeline(
        &self,
        kernel: &'static str,
        param_format: StorageFormat,
        grad_format: StorageFormat,
    ) -> wgpu::ComputePipeline {
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry((kernel, param_format, grad_format))
            .or_insert_with(|| {
                let constants = [
                    ("PARAM_FORMAT", f64::from(param_format.shader_code())),
                    ("GRAD_FORMAT", f64::from(grad_format.shader_code())),
                ];
                self.shared
                    .device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(kernel),
                        layout: Some(&self.step_pipeline_layout),
                        module: &self.step_module,
                        entry_point: Some("main"),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants: &constants,
                            zero_initialize_workgroup_memory: false,
                        },
                        cache: None,
                    })
            })
            .clone()
    }

    /// The 2-D workgroup grid covering `pairs` invocations.
    fn grid(&self, pairs: usize) -> (u32, u32) {
        let groups = pairs.div_ceil(WORKGROUP_SIZE as usize).max(1);
        let max_x = self.info.max_workgroups_per_dimension as usize;
        if groups <= max_x {
            (groups as u32, 1)
        } else {
            (max_x as u32, groups.div_ceil(max_x) as u32)
        }
    }

    /// The number of pipelines created so far (they are cached: this stops growing).
    pub fn cached_pipelines(&self) -> usize {
        self.pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

impl Backend for GpuBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn chunk_len(&self, rank_len: usize, ranks: usize) -> usize {
        let ranks = ranks.max(1) as u64;
        let bytes = ranks * rank_len as u64 * 4;
        if bytes <= self.info.max_binding_bytes {
            return rank_len;
        }
        let per_rank = self.info.max_binding_bytes / (4 * ranks);
        let align = super::PARAM_ALIGN_ELEMENTS as u64;
        ((per_rank / align).max(1) * align) as usize
    }

    fn create_arena(
        &self,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
    ) -> Result<Arena> {
        let gpu = GpuArena::new(&self.shared, format, ranks, rank_len, chunk_len)?;
        Ok(Arena::new(
            format,
            ranks,
            rank_len,
            chunk_len,
            ArenaStorage::Gpu(gpu),
        ))
    }

    fn copy_elements(
        &self,
        src: &Arena,
        src_rank: usize,
        src_offset: usize,
        dst: &mut Arena,
        dst_rank: usize,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        check_same_format(src, dst)?;
        let (from, to) = (self.gpu(src)?, self.gpu(dst)?);
        let per_word = src.format().elements_per_word();
        if !src_offset.is_multiple_of(per_word) || !dst_offset.is_multiple_of(per_word) {
            return Err(Error::value("copy_elements offsets must be word aligned"));
        }
        let words = src.format().words_for(len);
        let mut encoder = self
            .shared
            .device
            .create_command_encoder(&Default::default());
        let mut copied = 0;
        // Walk both chunkings at once, copying the largest run that stays inside one chunk
        // of each.
        while copied < words {
            let (s_buf, s_off, s_left) = from.locate(src_rank, src_offset / per_word + copied);
            let (d_buf, d_off, d_left) = to.locate(dst_rank, dst_offset / per_word + copied);
            let run = s_left.min(d_left).min(words - copied);
            encoder.copy_buffer_to_buffer(
                s_buf,
                s_off as u64 * 4,
                d_buf,
                d_off as u64 * 4,
                Some(run as u64 * 4),
            );
            copied += run;
        }
        self.shared.queue.submit([encoder.finish()]);
        self.shared.take_uncaptured()
    }

    fn copy_arena(&self, src: &Arena, dst: &mut Arena) -> Result<()> {
        check_same_format(src, dst)?;
        let (from, to) = (self.gpu(src)?, self.gpu(dst)?);
        if src.ranks() != dst.ranks()
            || src.rank_len() != dst.rank_len()
            || src.chunk_len() != dst.chunk_len()
        {
            return Err(Error::value("copy_arena: arenas differ in shape"));
        }
        let mut encoder = self
            .shared
            .device
            .create_command_encoder(&Default::default());
        for (a, b) in from.chunks.iter().zip(&to.chunks) {
            encoder.copy_buffer_to_buffer(&a.buffer, 0, &b.buffer, 0, Some(a.buffer.size()));
        }
        self.shared.queue.submit([encoder.finish()]);
        self.shared.take_uncaptured()
    }

    fn dp_sgd_step(
        &self,
        params: &mut Arena,
        grads: &Arena,
        means: &mut Arena,
        learning_rate: f32,
    ) -> Result<()> {
        check_step_arenas(params, grads, means)?;
        let (param_format, grad_format) = (params.format(), grads.format());
        let ranks = params.ranks();
        let pipeline = self.pipeline("dp_sgd_step", param_format, grad_format);
        let (p, g, m) = (self.gpu(params)?, self.gpu(grads)?, self.gpu(means)?);
        let device = &self.shared.device;
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            for ((pc, gc), mc) in p.chunks.iter().zip(&g.chunks).zip(&m.chunks) {
                let uniforms = StepUniforms {
                    pairs: (pc.len / 2) as u32,
                    ranks: ranks as u32,
                    param_rank_words: param_format.words_for(pc.len) as u32,
                    grad_rank_words: grad_format.words_for(gc.len) as u32,
                    learning_rate,
                    divisor: ranks as f32,
                    _pad: [0; 2],
                };
                let uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("dp_sgd_step uniforms"),
                    contents: bytemuck::bytes_of(&uniforms),
                    usage: wgpu::BufferUsages::UNIFORM,
                });
                let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("dp_sgd_step"),
                    layout: &self.step_layout,
                    entries: &[
                        wgpu::BindGroupEntry {
                            binding: 0,
                            resource: uniform.as_entire_binding(),
                        },
                        wgpu::BindGroupEntry {
                            binding: 1,
                            resource: gc.buffer.as_entire_binding(),
                        },
                        wgpu::BindGroupEntry {
                            binding: 2,
                            resource: pc.buffer.as_entire_binding(),
                        },
                        wgpu::BindGroupEntry {
                            binding: 3,
                            resource: mc.buffer.as_entire_binding(),
                        },
                    ],
                });
                pass.set_bind_group(0, &bind_group, &[]);
                let (x, y) = self.grid(pc.len / 2);
                pass.dispatch_workgroups(x, y, 1);
            }
        }
        self.shared.queue.submit([encoder.finish()]);
        self.shared.take_uncaptured()
    }

    fn synchronize(&self) -> BoxFuture<'_, Result<()>> {
        let (sender, receiver) = oneshot::channel();
        self.shared
            .queue
            .on_submitted_work_done(move || sender.send(()));
        Box::pin(async move {
            self.shared.poll_wait()?;
            receiver.await;
            self.shared.take_uncaptured()
        })
    }
}
