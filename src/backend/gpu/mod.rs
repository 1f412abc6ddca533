//! The wgpu backend: one `.wgsl` file per kernel family (see `shaders/`), pipelines created
//! once per (kernel, storage formats) and cached, arenas resident in device buffers. Each
//! per-parameter kernel is dispatched from the file of its name beside the shader's
//! (`sgd.rs` for `shaders/sgd.wgsl`, `adam.rs`, `average.rs`, `scaled_sum.rs`,
//! `lerp.rs`, `convert.rs`; what they share in `per_param.rs`); the data-parallel
//! step (`shaders/dp_sgd_step.wgsl`) and the copies are dispatched from this file.

mod adam;
mod arena;
mod assemble;
mod average;
mod bindings;
mod contract;
mod convert;
mod kernel;
mod lerp;
mod per_param;
mod scaled_sum;
mod sgd;
mod shader_error;
pub mod shaders;
mod shared;
mod spare;

use std::sync::{Arc, Mutex};

pub(crate) use arena::GpuArena;
use contract::{StepUniforms, WORKGROUP_SIZE};
use kernel::Kernel;
pub(crate) use shared::GpuShared;
pub use shared::{DEFAULT_MAX_BINDING_BYTES, device_lost_error};

use super::kernels::{
    AdamArenas, AdamScalars, AverageArgs, ConvertArgs, LerpArgs, ParamStarts, ScaledSumArgs,
    SgdArgs,
};
use super::{Arena, ArenaStorage, Backend, BackendInfo, BackendKind, BoxFuture, oneshot};
use super::{check_same_format, check_step_arenas};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// Options for [`GpuBackend::with_options`]. Build them with
/// `GpuOptions::default().with_…(..)` (the struct may gain fields).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GpuOptions {
    /// Largest storage binding to use (bytes, capped by the adapter's limit); arenas larger
    /// than this are processed in chunks. Tests lower it to exercise chunking cheaply.
    pub max_binding_bytes: u64,
    /// Largest workgroup count per dimension to use (capped by the adapter's limit); more
    /// workgroups spill into a second dimension.
    pub max_workgroups_per_dimension: u32,
}

impl GpuOptions {
    /// With the largest storage binding to use set to `bytes`.
    pub fn with_max_binding_bytes(mut self, bytes: u64) -> Self {
        self.max_binding_bytes = bytes;
        self
    }

    /// With the largest workgroup count per dimension set to `count`.
    pub fn with_max_workgroups_per_dimension(mut self, count: u32) -> Self {
        self.max_workgroups_per_dimension = count;
        self
    }
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            max_binding_bytes: DEFAULT_MAX_BINDING_BYTES,
            max_workgroups_per_dimension: 65_535,
        }
    }
}

/// The wgpu backend.
pub struct GpuBackend {
    shared: Arc<GpuShared>,
    info: BackendInfo,
    /// Runs the float64 arenas, which live on the host (WebGPU has no 64-bit float).
    host: super::CpuBackend,
    kernels: Kernels,
    /// Bound where a kernel's optional state buffer is absent (never read then).
    placeholder: wgpu::Buffer,
}

/// Every kernel family, compiled once when the backend opens.
struct Kernels {
    dp_sgd_step: Kernel,
    sgd: Kernel,
    adam: Kernel,
    average: Kernel,
    scaled_sum: Kernel,
    copy: Kernel,
    lerp: Kernel,
    convert: Kernel,
}

impl std::fmt::Debug for GpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBackend")
            .field("info", &self.info)
            .finish()
    }
}

impl GpuBackend {
    /// Opens the best adapter wgpu finds (high performance preferred) with default options.
    /// A `RuntimeError` when there is none (in a browser: when WebGPU is unavailable).
    ///
    /// # Errors
    /// As [`Self::with_options`].
    pub async fn new() -> Result<GpuBackend> {
        Self::with_options(GpuOptions::default()).await
    }

    /// Opens the best adapter with `options`.
    ///
    /// # Errors
    /// A `RuntimeError` when WebGPU is unavailable (in a browser), no adapter is found, the
    /// device cannot be opened, a kernel's WGSL cannot be assembled (an unknown or duplicate
    /// `// #import`, an unreadable binding), or the device reports an error (or is lost) while
    /// the kernels are set up.
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
        let lost = Arc::new(Mutex::new(None));
        {
            let sink = lost.clone();
            device.set_device_lost_callback(move |reason, message| {
                log::error!("wgpu: the device was lost ({reason:?}): {message}");
                let mut slot = sink.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert_with(|| format!("{reason:?}: {message}"));
            });
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
        let kernels = Kernels {
            dp_sgd_step: Kernel::new(&device, &contract::DP_SGD_STEP)?,
            sgd: Kernel::new(&device, &contract::SGD)?,
            adam: Kernel::new(&device, &contract::ADAM)?,
            average: Kernel::new(&device, &contract::AVERAGE)?,
            scaled_sum: Kernel::new(&device, &contract::SCALED_SUM)?,
            copy: Kernel::new(&device, &contract::COPY)?,
            lerp: Kernel::new(&device, &contract::LERP)?,
            convert: Kernel::new(&device, &contract::CONVERT)?,
        };
        let placeholder = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("distopt placeholder"),
            size: 256,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let shared = Arc::new(GpuShared {
            device,
            queue,
            uncaptured,
            lost,
            spare: spare::Spare::default(),
        });
        shared.take_uncaptured()?;
        Ok(GpuBackend {
            shared,
            info,
            host: super::CpuBackend::new(),
            kernels,
            placeholder,
        })
    }

    pub(crate) fn gpu<'a>(&self, arena: &'a Arena) -> Result<&'a GpuArena> {
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

    /// A new arena on this device (`clear`: zeros even in a kept buffer, see `spare`). float64
    /// arenas stay on the host: WebGPU has no 64-bit float (see `StorageFormat::F64`).
    fn new_arena(
        &self,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
        clear: bool,
    ) -> Result<Arena> {
        if format == StorageFormat::F64 {
            return self.host.create_arena(format, ranks, rank_len, chunk_len);
        }
        // Rows of no elements have no chunk: any chunk length describes them (the CPU backend
        // accepts them too), and none is allocated.
        let chunking = if rank_len == 0 { 2 } else { chunk_len };
        let gpu = GpuArena::new(&self.shared, format, ranks, rank_len, chunking, clear)?;
        Ok(Arena::new(
            format,
            ranks,
            rank_len,
            chunk_len,
            ArenaStorage::Gpu(gpu),
        ))
    }

    /// The 2-D workgroup grid covering `pairs` invocations.
    pub(crate) fn grid(&self, pairs: usize) -> (u32, u32) {
        let groups = pairs.div_ceil(WORKGROUP_SIZE as usize).max(1);
        let max_x = self.info.max_workgroups_per_dimension as usize;
        if groups <= max_x {
            (groups as u32, 1)
        } else {
            (max_x as u32, groups.div_ceil(max_x) as u32)
        }
    }

    /// One dispatch of `kernel` in `pass` over `pairs` invocations, `buffers` bound by their
    /// binding names.
    pub(crate) fn dispatch(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        kernel: &Kernel,
        buffers: &[(&str, &wgpu::Buffer)],
        pairs: usize,
    ) -> Result<()> {
        pass.set_bind_group(0, &kernel.bind(&self.shared.device, buffers)?, &[]);
        let (x, y) = self.grid(pairs);
        pass.dispatch_workgroups(x, y, 1);
        Ok(())
    }

    /// Bytes of buffers this device keeps from dropped arenas for the next arenas of their
    /// size (at most 512 MiB; a new arena that takes one is cleared, a scratch arena is not).
    pub fn cached_buffer_bytes(&self) -> u64 {
        self.shared.spare.bytes()
    }

    /// Frees the buffers this device keeps from dropped arenas (see
    /// [`cached_buffer_bytes`](Self::cached_buffer_bytes)).
    pub fn release_cached_buffers(&self) {
        self.shared.spare.release();
    }

    /// Copies `src` to `dst` (float32 arenas of the same shape) with a compute shader that has
    /// the kernels' access pattern (`shaders/copy.wgsl`): the roofline a memory-bound kernel is
    /// measured against on this adapter (benchmarks). Submits the work; synchronize to wait.
    ///
    /// # Errors
    /// A `ValueError` for arenas of another format or shape, a `RuntimeError` for host arenas
    /// or a device error.
    pub fn shader_copy(&self, src: &Arena, dst: &mut Arena) -> Result<()> {
        if src.format() != StorageFormat::F32
            || dst.format() != StorageFormat::F32
            || src.ranks() != dst.ranks()
            || src.rank_len() != dst.rank_len()
            || src.chunk_len() != dst.chunk_len()
        {
            return Err(Error::value(
                "shader_copy: float32 arenas of the same shape expected",
            ));
        }
        let (from, to) = (self.gpu(src)?, self.gpu(dst)?);
        let kernel = &self.kernels.copy;
        let pipeline = kernel.pipeline(&self.shared, &[])?;
        let device = &self.shared.device;
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            for (a, b) in from.chunks.iter().zip(&to.chunks) {
                // Every rank of the chunk, as one run of whole eight-element groups.
                let octets = (a.buffer.size() / 32) as u32;
                let uniforms = contract::CopyUniforms {
                    octets,
                    _pad: [0; 3],
                };
                let uniform = self.shared.uniform_buffer("copy uniforms", &uniforms);
                self.dispatch(
                    &mut pass,
                    kernel,
                    &[("copy", &uniform), ("src", &a.buffer), ("dst", &b.buffer)],
                    octets as usize,
                )?;
            }
        }
        self.shared.queue.submit([encoder.finish()]);
        self.shared.take_uncaptured()
    }

    /// The number of pipelines created so far (they are cached: this stops growing).
    pub fn cached_pipelines(&self) -> usize {
        let k = &self.kernels;
        k.dp_sgd_step.cached()
            + k.sgd.cached()
            + k.adam.cached()
            + k.average.cached()
            + k.scaled_sum.cached()
            + k.lerp.cached()
            + k.convert.cached()
    }
}

/// Whether `arena` lives on the host: float64 arenas do (WebGPU has no 64-bit float), and the
/// host backend runs them.
fn is_host(arena: &Arena) -> bool {
    matches!(arena.storage, ArenaStorage::Host(_))
}

impl Backend for GpuBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn lost(&self) -> Option<String> {
        self.shared.lost()
    }

    fn destroy_device_for_test(&self) {
        self.shared.device.destroy();
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
        self.new_arena(format, ranks, rank_len, chunk_len, true)
    }

    fn create_scratch_arena(
        &self,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
    ) -> Result<Arena> {
        self.new_arena(format, ranks, rank_len, chunk_len, false)
    }

    fn copy_arena(&self, src: &Arena, dst: &mut Arena) -> Result<()> {
        check_same_format(src, dst)?;
        if is_host(src) {
            return self.host.copy_arena(src, dst);
        }
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

    fn dp_sgd_step_with_divisor(
        &self,
        params: &mut Arena,
        grads: &Arena,
        means: &mut Arena,
        learning_rate: f32,
        divisor: f32,
    ) -> Result<()> {
        if is_host(params) {
            return self.host.dp_sgd_step_with_divisor(
                params,
                grads,
                means,
                learning_rate,
                divisor,
            );
        }
        check_step_arenas(params, grads, means, divisor)?;
        let (param_format, grad_format) = (params.format(), grads.format());
        let ranks = params.ranks();
        let kernel = &self.kernels.dp_sgd_step;
        let pipeline = kernel.pipeline(
            &self.shared,
            &[
                ("PARAM_FORMAT", param_format.shader_code()),
                ("GRAD_FORMAT", grad_format.shader_code()),
            ],
        )?;
        let (p, g, m) = (self.gpu(params)?, self.gpu(grads)?, self.gpu(means)?);
        let device = &self.shared.device;
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            for ((pc, gc), mc) in p.chunks.iter().zip(&g.chunks).zip(&m.chunks) {
                let uniforms = StepUniforms {
                    // Chunks hold whole parameters' 64-element slots: eight-element groups and
                    // whole vec4<u32> words per rank.
                    octets: (pc.len / 8) as u32,
                    ranks: ranks as u32,
                    param_rank_quads: (param_format.words_for(pc.len) / 4) as u32,
                    grad_rank_quads: (grad_format.words_for(gc.len) / 4) as u32,
                    learning_rate,
                    divisor,
                    _pad: [0; 2],
                };
                let uniform = self
                    .shared
                    .uniform_buffer("dp_sgd_step uniforms", &uniforms);
                self.dispatch(
                    &mut pass,
                    kernel,
                    &[
                        ("step", &uniform),
                        ("grads", &gc.buffer),
                        ("params", &pc.buffer),
                        ("means", &mc.buffer),
                    ],
                    pc.len / 8,
                )?;
            }
        }
        self.shared.queue.submit([encoder.finish()]);
        self.shared.take_uncaptured()
    }

    fn sgd(&self, args: SgdArgs<'_>) -> Result<()> {
        if is_host(args.params) {
            return self.host.sgd(args);
        }
        self.sgd_on_device(args)
    }

    fn adam(
        &self,
        arenas: AdamArenas<'_>,
        starts: &ParamStarts,
        scalars: &[AdamScalars],
    ) -> Result<()> {
        if is_host(arenas.params) {
            return self.host.adam(arenas, starts, scalars);
        }
        self.adam_on_device(arenas, starts, scalars)
    }

    fn average(&self, args: AverageArgs<'_>) -> Result<()> {
        if is_host(args.arena) {
            return self.host.average(args);
        }
        self.average_on_device(args)
    }

    fn scaled_sum(&self, args: ScaledSumArgs<'_>) -> Result<()> {
        if is_host(args.arena) {
            return self.host.scaled_sum(args);
        }
        self.scaled_sum_on_device(args)
    }

    fn lerp(&self, args: LerpArgs<'_>) -> Result<()> {
        if is_host(args.params) {
            return self.host.lerp(args);
        }
        self.lerp_on_device(args)
    }

    fn convert(&self, args: ConvertArgs<'_>) -> Result<()> {
        if is_host(args.src) || is_host(args.dst) {
            return self.host.convert(args);
        }
        self.convert_on_device(args)
    }

    fn copy_regions(
        &self,
        src: &Arena,
        dst: &mut Arena,
        regions: &[super::CopyRegion],
    ) -> Result<()> {
        if is_host(src) && is_host(dst) {
            return self.host.copy_regions(src, dst, regions);
        }
        super::check_copy_regions(src, dst, regions)?;
        let (from, to) = (self.gpu(src)?, self.gpu(dst)?);
        let format = src.format();
        let mut encoder = self
            .shared
            .device
            .create_command_encoder(&Default::default());
        for region in regions {
            let words = format.words_for(region.len);
            let (src_first, dst_first) = (
                format.word_of(region.src_offset),
                format.word_of(region.dst_offset),
            );
            let mut copied = 0;
            // Walk both chunkings at once, copying the largest run inside one chunk of each.
            while copied < words {
                let (s_buf, s_off, s_left) = from.locate(region.src_rank, src_first + copied);
                let (d_buf, d_off, d_left) = to.locate(region.dst_rank, dst_first + copied);
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
        }
        self.shared.queue.submit([encoder.finish()]);
        self.shared.take_uncaptured()
    }

    fn copy_between_ranks(
        &self,
        arena: &mut Arena,
        from: usize,
        to: usize,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        if is_host(arena) {
            return self.host.copy_between_ranks(arena, from, to, offset, len);
        }
        arena.check_range(from, offset, len)?;
        arena.check_range(to, offset, len)?;
        let format = arena.format();
        let gpu = self.gpu(arena)?;
        let (first, words) = (format.word_of(offset), format.words_for(len));
        // WebGPU forbids a copy within one buffer: go through a scratch buffer on the device.
        let scratch = self.shared.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("distopt rank copy"),
            size: (words as u64 * 4).max(4),
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self
            .shared
            .device
            .create_command_encoder(&Default::default());
        let mut copied = 0;
        for (buffer, src, run) in gpu.runs(from, first, words) {
            let (at, bytes) = (copied as u64 * 4, run as u64 * 4);
            encoder.copy_buffer_to_buffer(buffer, src as u64 * 4, &scratch, at, Some(bytes));
            copied += run;
        }
        copied = 0;
        for (buffer, dst, run) in gpu.runs(to, first, words) {
            let (at, bytes) = (copied as u64 * 4, run as u64 * 4);
            encoder.copy_buffer_to_buffer(&scratch, at, buffer, dst as u64 * 4, Some(bytes));
            copied += run;
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
