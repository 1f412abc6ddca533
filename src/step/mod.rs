//! The synchronous data-parallel SGD step.
//!
//! For each parameter j: the float32 sum of the ranks' gradients in rank order (a missing
//! gradient contributes zero), divided by R, stored in the parameter's dtype (`mean_gradients`);
//! then `θ − lr·ḡ` in float32 on rank 0's copy, stored in the parameter's dtype and copied to
//! every rank (`updated_replicas`). All parameters of one storage format, for all ranks, go
//! through one kernel dispatch.

mod json;
mod request;

pub use json::{step_output_to_json, step_request_from_json};
use request::validate_shapes;
pub use request::{ReplicaLists, StepRequest, StepSource, errors, read_replicas, validate};

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::host_step::HostStepParam;
use crate::backend::{Arena, Backend, CopyRegion, layout_params};
use crate::comm::Communicator;
use crate::dtype::{DType, StorageFormat};
use crate::error::{Error, Result};
use crate::tensor::{DeviceSlice, HostData, Storage, Tensor};
use crate::transfer;

/// What [`sgd_step`] returns.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// One tensor per parameter: the mean gradient, in the parameter's dtype and shape.
    pub mean_gradients: Vec<Tensor>,
    /// `updated_replicas[r][j]`: rank r's copy of updated parameter j. The copies are equal;
    /// host copies may share one buffer ([`ReplicaOutputs`]), which is invisible to the caller
    /// because tensors are immutable.
    pub updated_replicas: Vec<Vec<Tensor>>,
}

/// One synchronous data-parallel SGD step (see the module documentation).
///
/// Outputs keep each parameter's shape and dtype, and its location: a parameter whose rank-0
/// copy is on the host gets host outputs; one resident on the device gets device-resident
/// outputs (views into the step's result arenas) without any host round trip.
///
/// # Errors
/// As [`sgd_step_with`].
///
/// ```
/// use distopt::BlockOn;
/// use distopt::{CpuBackend, Tensor, sgd_step};
/// let p = || Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap();
/// let g = |a: f32, b: f32| Some(Tensor::from_f32(&[2], vec![a, b]).unwrap());
/// let out = sgd_step(&CpuBackend::new(), &[vec![p()], vec![p()]],
///                             &[vec![g(2.0, 4.0)], vec![g(4.0, 6.0)]], 0.1).block_on().unwrap();
/// assert_eq!(out.mean_gradients[0].values_f64().unwrap(), vec![3.0, 5.0]);
/// assert_eq!(out.updated_replicas[1][0].values_f64().unwrap(), vec![0.7f32 as f64, 1.5]);
/// ```
pub async fn sgd_step(
    backend: &dyn Backend,
    parameter_replicas: &[Vec<Tensor>],
    gradient_replicas: &[Vec<Option<Tensor>>],
    learning_rate: f64,
) -> Result<StepOutput> {
    sgd_step_with(
        backend,
        parameter_replicas,
        gradient_replicas,
        learning_rate,
        ReplicaOutputs::Shared,
    )
    .await
}

/// How a step returns the R updated replicas of a parameter, which are equal by definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReplicaOutputs {
    /// The R host tensors share one buffer (the default). Tensors are immutable, so each stays
    /// independent to the caller: nothing written to one can show in another.
    #[default]
    Shared,
    /// R separate host buffers, each written by the step (what a framework that copies the
    /// update to every replica does; the JavaScript face needs R typed arrays anyway).
    Separate,
}

/// [`sgd_step`], choosing how host outputs hold the updated replicas.
///
/// On the CPU backend, with every input on the host, the step reads the caller's tensors
/// directly in one fused multi-threaded pass and writes each output once (no packing into
/// arenas); otherwise it packs the inputs into one arena per storage format and runs the
/// backend's kernel. Both give the same bits.
///
/// # Errors
/// The `ValueError`s of [`validate`] (counts and shapes, naming the rank and parameter),
/// and a backend's errors (a device lost, an allocation refused).
pub async fn sgd_step_with(
    backend: &dyn Backend,
    parameter_replicas: &[Vec<Tensor>],
    gradient_replicas: &[Vec<Option<Tensor>>],
    learning_rate: f64,
    replicas: ReplicaOutputs,
) -> Result<StepOutput> {
    validate(parameter_replicas, gradient_replicas)?;
    if let Some(out) = host_step_output(
        backend,
        parameter_replicas,
        gradient_replicas,
        learning_rate,
        replicas,
    )? {
        return Ok(out);
    }
    let on_device: Vec<bool> = parameter_replicas[0]
        .iter()
        .map(Tensor::is_on_device)
        .collect();
    run_groups(
        backend,
        parameter_replicas,
        gradient_replicas,
        learning_rate as f32,
        parameter_replicas.len() as f32,
        &on_device,
        replicas,
    )
    .await
}

/// Runs the step's kernel once per storage format over validated lists: the sum of every
/// rank's gradients divided by `divisor`, applied to rank 0's parameters and written to every
/// rank. Parameter `j`'s outputs are views into the result arenas when `on_device[j]`, host
/// tensors otherwise.
async fn run_groups(
    backend: &dyn Backend,
    parameter_replicas: &[Vec<Tensor>],
    gradient_replicas: &[Vec<Option<Tensor>>],
    learning_rate: f32,
    divisor: f32,
    on_device: &[bool],
    replicas: ReplicaOutputs,
) -> Result<StepOutput> {
    let ranks = parameter_replicas.len();
    let count = parameter_replicas[0].len();
    let mut groups: BTreeMap<StorageFormat, Vec<usize>> = BTreeMap::new();
    for (j, param) in parameter_replicas[0].iter().enumerate() {
        groups
            .entry(step_format(param.dtype()))
            .or_default()
            .push(j);
    }
    let mut means: Vec<Option<Tensor>> = vec![None; count];
    let mut updated: Vec<Vec<Option<Tensor>>> = vec![vec![None; count]; ranks];
    for (format, members) in groups {
        let group = StepGroup::new(
            backend,
            format,
            &members,
            parameter_replicas,
            gradient_replicas,
        )?;
        group
            .run(
                backend,
                parameter_replicas,
                gradient_replicas,
                StepScalars {
                    learning_rate,
                    divisor,
                    on_device,
                },
                &mut means,
                &mut updated,
            )
            .await?;
    }
    if replicas == ReplicaOutputs::Separate {
        for rank in updated.iter_mut().skip(1) {
            for t in rank.iter_mut().flatten() {
                if let Some(data) = t.host_data() {
                    *t = Tensor::new(t.shape(), data.clone())?;
                }
            }
        }
    }
    Ok(StepOutput {
        mean_gradients: means
            .into_iter()
            .map(|t| t.expect("every parameter is in a group"))
            .collect(),
        updated_replicas: updated
            .into_iter()
            .map(|rank| {
                rank.into_iter()
                    .map(|t| t.expect("every parameter is in a group"))
                    .collect()
            })
            .collect(),
    })
}

/// The step straight from host tensors (see [`sgd_step_with`]), or `None` when some input is
/// resident on a device or the backend has no host path.
fn host_step_output(
    backend: &dyn Backend,
    parameter_replicas: &[Vec<Tensor>],
    gradient_replicas: &[Vec<Option<Tensor>>],
    learning_rate: f64,
    replicas: ReplicaOutputs,
) -> Result<Option<StepOutput>> {
    let ranks = parameter_replicas.len();
    let mut inputs = Vec::with_capacity(parameter_replicas[0].len());
    for (j, param) in parameter_replicas[0].iter().enumerate() {
        let Some(values) = param.host_data() else {
            return Ok(None);
        };
        let mut grads = Vec::with_capacity(ranks);
        for rank in gradient_replicas {
            match &rank[j] {
                None => grads.push(None),
                Some(g) => match g.host_data() {
                    Some(data) => grads.push(Some(data)),
                    None => return Ok(None),
                },
            }
        }
        inputs.push(HostStepParam {
            param: values,
            grads,
        });
    }
    let copies = match replicas {
        ReplicaOutputs::Shared => 1,
        ReplicaOutputs::Separate => ranks,
    };
    // The outputs: every parameter's mean and `copies` updated values.
    let mut out_bytes = 0usize;
    for input in &inputs {
        let each = crate::budget::bytes_of(
            input.param.len(),
            input.param.dtype().size_bytes(),
            "the step's outputs",
        )?;
        out_bytes = out_bytes.saturating_add(each.saturating_mul(copies + 1));
    }
    crate::budget::check(out_bytes, "the step's outputs")?;
    let Some(results) = backend.host_sgd_step(&inputs, ranks, learning_rate as f32, copies) else {
        return Ok(None);
    };
    let mut means = Vec::with_capacity(results.len());
    let mut updated: Vec<Vec<Tensor>> = vec![Vec::with_capacity(results.len()); ranks];
    for (result, param) in results.into_iter().zip(&parameter_replicas[0]) {
        let shape = param.shape();
        means.push(Tensor::new(shape, result.mean)?);
        let values: Vec<Tensor> = result
            .updated
            .into_iter()
            .map(|data| Tensor::new(shape, data))
            .collect::<Result<_>>()?;
        for (rank, out) in updated.iter_mut().enumerate() {
            out.push(values[rank % values.len()].clone());
        }
    }
    Ok(Some(StepOutput {
        mean_gradients: means,
        updated_replicas: updated,
    }))
}

/// How the step runs: the learning rate, what the gradient sum is divided by, and per
/// parameter whether its outputs stay on the device.
#[derive(Clone, Copy)]
struct StepScalars<'a> {
    learning_rate: f32,
    divisor: f32,
    on_device: &'a [bool],
}

/// [`sgd_step`] in a world of ranks: each process passes the parameter and gradient lists of
/// its local ranks ([`Communicator::local_ranks`]); every process of the world calls it.
///
/// A world held by this process alone (the simulated world) runs [`sgd_step`]. Otherwise (one
/// rank per process, over MPI) the ranks first exchange their lists' shapes, so that every
/// process reports the same error, naming the rank, for inputs `sgd_step` would reject; then
/// the float32 images of the gradients (a missing one is zeros) are all-reduced (summed) over
/// the world, and the backend's step kernel ([`Backend::dp_sgd_step_with_divisor`]) divides
/// the sum by the world size, rounds it to each parameter's dtype and applies the update to
/// rank 0's parameter values, broadcast from it (the shared original parameter), with the
/// same arithmetic as [`sgd_step`]. The sum's order is the transport's, as with any
/// all-reduce: bit-exact with [`sgd_step`] for two ranks, within rounding for more.
/// `updated_replicas` holds the local ranks' copies; a parameter whose local rank-0 copy is on
/// the device gets outputs resident in the step's arenas, as in [`sgd_step`].
///
/// # Errors
/// When this process holds the whole world, as [`sgd_step`] (the lists are not checked against the
/// world size then). Otherwise: a `ValueError` when the lists do not hold this process's ranks; the
/// `ValueError`s of [`validate`] for the whole world, the same on every process; a `RuntimeError`
/// when a rank sends malformed shapes or fewer parameter values than expected; the collectives'
/// errors ([`Communicator::all_gather_bytes`], [`Communicator::all_reduce_sum_f32`],
/// [`Communicator::broadcast_bytes`]); and the backend's (a `RuntimeError` for a readback, an arena
/// over the memory budget, a GPU error or a lost device).
pub async fn sgd_step_in(
    world: &dyn Communicator,
    backend: &dyn Backend,
    parameter_replicas: &[Vec<Tensor>],
    gradient_replicas: &[Vec<Option<Tensor>>],
    learning_rate: f64,
) -> Result<StepOutput> {
    let local = world.local_ranks();
    if local.len() == world.world_size() {
        return sgd_step(
            backend,
            parameter_replicas,
            gradient_replicas,
            learning_rate,
        )
        .await;
    }
    if parameter_replicas.len() != local.len() || gradient_replicas.len() != local.len() {
        return Err(Error::value(format!(
            "this process holds ranks {}..{} of {}: pass their {} parameter and gradient lists, not {} and {}",
            local.start,
            local.end,
            world.world_size(),
            local.len(),
            parameter_replicas.len(),
            gradient_replicas.len()
        )));
    }
    // Every rank's shapes and dtypes, so that every process validates the whole world.
    let describe = |rank: usize| -> Vec<u8> {
        let params: Vec<(&str, &[usize])> = parameter_replicas[rank]
            .iter()
            .map(|p| (p.dtype().name(), p.shape()))
            .collect();
        let grads: Vec<Option<(&str, &[usize])>> = gradient_replicas[rank]
            .iter()
            .map(|g| g.as_ref().map(|g| (g.dtype().name(), g.shape())))
            .collect();
        serde_json::to_vec(&(params, grads)).unwrap_or_default()
    };
    let described = world.all_gather_bytes((0..local.len()).map(describe).collect())?;
    type Described = (Vec<(String, Vec<usize>)>, Vec<Option<(String, Vec<usize>)>>);
    let all: Vec<Described> = described
        .iter()
        .map(|bytes| {
            serde_json::from_slice(bytes)
                .map_err(|e| Error::runtime(format!("a rank sent malformed shapes: {e}")))
        })
        .collect::<Result<_>>()?;
    let params: Vec<Vec<&[usize]>> = all
        .iter()
        .map(|(p, _)| p.iter().map(|(_, s)| s.as_slice()).collect())
        .collect();
    let grads: Vec<Vec<Option<&[usize]>>> = all
        .iter()
        .map(|(_, g)| {
            g.iter()
                .map(|g| g.as_ref().map(|(_, s)| s.as_slice()))
                .collect()
        })
        .collect();
    validate_shapes(&params, &grads)?;
    let world_size = world.world_size();
    let first = &parameter_replicas[0];
    // The gradients' float32 images, every parameter's after the previous one.
    let mut images = Vec::with_capacity(local.len());
    for grads in gradient_replicas {
        let mut image = Vec::new();
        for (j, grad) in grads.iter().enumerate() {
            match grad {
                Some(g) => image.extend(
                    g.to_host()
                        .await?
                        .values_f64()?
                        .into_iter()
                        .map(|v| v as f32),
                ),
                None => image.extend(std::iter::repeat_n(0f32, first[j].numel())),
            }
        }
        images.push(image);
    }
    let sums = world.all_reduce_sum_f32(&images)?;
    // Rank 0's parameter values: the shared original parameter.
    let mut originals = None;
    if local.start == 0 {
        let mut bytes = Vec::new();
        for p in first {
            for v in p.to_host().await?.values_f64()? {
                bytes.extend(v.to_le_bytes());
            }
        }
        originals = Some(bytes);
    }
    let originals = world.broadcast_bytes(0, originals)?;
    let originals: Vec<f64> = originals
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    // The backend's kernel finishes the step: rank 0's parameters and the world's summed
    // gradients (one rank of float32 gradients, divided by the world size) in the step's
    // arenas, the update written to every local rank.
    let (mut originals_list, mut sum_list) = (Vec::new(), Vec::new());
    let mut at = 0;
    for p in first {
        let n = p.numel();
        if originals.len() < at + n || sums.len() < at + n {
            return Err(Error::runtime(
                "rank 0 sent fewer parameter values than expected",
            ));
        }
        originals_list.push(Tensor::from_f64(
            p.dtype(),
            p.shape(),
            &originals[at..at + n],
        )?);
        sum_list.push(Some(Tensor::from_f32(
            p.shape(),
            sums[at..at + n].to_vec(),
        )?));
        at += n;
    }
    let mut gradient_lists = vec![vec![None; first.len()]; local.len()];
    gradient_lists[0] = sum_list;
    let on_device: Vec<bool> = first.iter().map(Tensor::is_on_device).collect();
    run_groups(
        backend,
        &vec![originals_list; local.len()],
        &gradient_lists,
        learning_rate as f32,
        world_size as f32,
        &on_device,
        ReplicaOutputs::Shared,
    )
    .await
}

/// The parameters of one storage format: their arena layout and the gradients' format.
struct StepGroup<'a> {
    format: StorageFormat,
    grad_format: StorageFormat,
    members: &'a [usize],
    offsets: Vec<usize>,
    rank_len: usize,
    chunk_len: usize,
}

impl<'a> StepGroup<'a> {
    fn new(
        backend: &dyn Backend,
        format: StorageFormat,
        members: &'a [usize],
        parameter_replicas: &[Vec<Tensor>],
        gradient_replicas: &[Vec<Option<Tensor>>],
    ) -> Result<StepGroup<'a>> {
        let numels: Vec<usize> = members
            .iter()
            .map(|&j| parameter_replicas[0][j].numel())
            .collect();
        let (offsets, rank_len) = layout_params(&numels);
        // Gradients travel in their own format when they all share one (float64 rounds to
        // float32 on the host, exactly what `g.to(float32)` does); mixed formats widen to
        // float32, which is exact for float16 and bfloat16.
        let mut grad_formats = gradient_replicas
            .iter()
            .flat_map(|rank| members.iter().filter_map(|&j| rank[j].as_ref()))
            .map(|g| step_format(g.dtype()));
        let grad_format = match grad_formats.next() {
            None => format,
            Some(first) if grad_formats.all(|f| f == first) => first,
            Some(_) => StorageFormat::F32,
        };
        let chunk_len = backend.chunk_len(rank_len, parameter_replicas.len());
        Ok(StepGroup {
            format,
            grad_format,
            members,
            offsets,
            rank_len,
            chunk_len,
        })
    }

    /// Fills rank `rank` of `arena` with `tensors` (indexed like `members`); host tensors are
    /// packed into one image and written at once, device tensors are copied on the device.
    async fn fill(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        rank: usize,
        tensors: &[Option<&Tensor>],
    ) -> Result<()> {
        let format = arena.format();
        // Host tensors first, as one row image; device tensors are copied after it (a write
        // lands before the copies submitted after it, so the copies are not overwritten).
        let mut on_device = Vec::new();
        let mut fetched = Vec::new();
        let mut on_host: Vec<(usize, &HostData)> = Vec::new();
        for (k, tensor) in tensors.iter().enumerate() {
            let Some(tensor) = tensor else { continue };
            let offset = self.offsets[k];
            match tensor.storage() {
                Storage::Device(slice) if slice.arena.format() == format => {
                    on_device.push((slice, offset))
                }
                // Host values are encoded straight from the caller's tensor.
                Storage::Host(data) => on_host.push((offset, data)),
                // Device values in another format are read back first.
                Storage::Device(_) => fetched.push((offset, tensor.to_host().await?)),
            }
        }
        on_host.extend(fetched.iter().map(|(offset, t)| {
            (
                *offset,
                t.host_data().expect("to_host returns a host tensor"),
            )
        }));
        // The arenas are scratch (`Backend::create_scratch_arena`): the image, zeros where no
        // host tensor lands, is written whenever some element's value would otherwise be left
        // from an earlier arena, that is when a tensor is missing (a missing gradient is zero).
        // Device tensors cover their own elements; the padding between parameters is never
        // read back.
        if !on_host.is_empty() || tensors.iter().any(Option::is_none) {
            let row = transfer::pack_row(
                format,
                self.rank_len,
                on_host,
                "the step's packed rank image",
            )?;
            arena.write(rank, 0, &row)?;
            crate::recycle::give(row);
        }
        for (slice, offset) in on_device {
            backend.copy_regions(
                &slice.arena,
                arena,
                &[CopyRegion {
                    src_rank: slice.rank,
                    src_offset: slice.offset,
                    dst_rank: rank,
                    dst_offset: offset,
                    len: slice.len,
                }],
            )?;
        }
        Ok(())
    }

    async fn run(
        &self,
        backend: &dyn Backend,
        parameter_replicas: &[Vec<Tensor>],
        gradient_replicas: &[Vec<Option<Tensor>>],
        scalars: StepScalars<'_>,
        means_out: &mut [Option<Tensor>],
        updated_out: &mut [Vec<Option<Tensor>>],
    ) -> Result<()> {
        let ranks = parameter_replicas.len();
        // Scratch arenas: `fill` writes every input element the kernel uses, and the kernel
        // writes every output element.
        let mut params =
            backend.create_scratch_arena(self.format, ranks, self.rank_len, self.chunk_len)?;
        let mut grads =
            backend.create_scratch_arena(self.grad_format, ranks, self.rank_len, self.chunk_len)?;
        let mut means =
            backend.create_scratch_arena(self.format, 1, self.rank_len, self.chunk_len)?;
        let originals: Vec<Option<&Tensor>> = self
            .members
            .iter()
            .map(|&j| Some(&parameter_replicas[0][j]))
            .collect();
        self.fill(backend, &mut params, 0, &originals).await?;
        for (rank, rank_grads) in gradient_replicas.iter().enumerate() {
            let tensors: Vec<Option<&Tensor>> = self
                .members
                .iter()
                .map(|&j| rank_grads[j].as_ref())
                .collect();
            self.fill(backend, &mut grads, rank, &tensors).await?;
        }
        backend.dp_sgd_step_with_divisor(
            &mut params,
            &grads,
            &mut means,
            scalars.learning_rate,
            scalars.divisor,
        )?;
        drop(grads);

        let on_device = scalars.on_device;
        let any_host = self.members.iter().any(|&j| !on_device[j]);
        // Every rank holds the same values: reading rank 0 (and the means) is enough.
        let (param_words, mean_words) = if any_host {
            (
                Some(params.read_range(0, 0, self.rank_len).await?),
                Some(means.read_range(0, 0, self.rank_len).await?),
            )
        } else {
            (None, None)
        };
        let (params, means) = (Arc::new(params), Arc::new(means));
        // The readbacks go back for the next step's (`recycle`) once decoded, below.
        for (k, &j) in self.members.iter().enumerate() {
            let original = &parameter_replicas[0][j];
            let (dtype, shape, offset, numel) = (
                original.dtype(),
                original.shape(),
                self.offsets[k],
                original.numel(),
            );
            match (&param_words, &mean_words, on_device[j]) {
                (Some(pw), Some(mw), false) => {
                    // One row each, read from element 0: rank 0 of a one-row arena.
                    let decode = |words: &[u32]| {
                        transfer::tensor_in_rows(
                            words,
                            self.format,
                            self.rank_len,
                            0,
                            offset,
                            shape,
                            dtype,
                        )
                    };
                    means_out[j] = Some(decode(mw)?);
                    let value = decode(pw)?;
                    for rank_out in updated_out.iter_mut() {
                        rank_out[j] = Some(value.clone());
                    }
                }
                _ => {
                    let slice = |arena: &Arc<Arena>, rank| DeviceSlice {
                        dtype,
                        arena: arena.clone(),
                        rank,
                        offset,
                        len: numel,
                    };
                    means_out[j] = Some(Tensor::from_device(shape.to_vec(), slice(&means, 0)));
                    for (rank, rank_out) in updated_out.iter_mut().enumerate() {
                        rank_out[j] =
                            Some(Tensor::from_device(shape.to_vec(), slice(&params, rank)));
                    }
                }
            }
        }
        for words in [param_words, mean_words].into_iter().flatten() {
            crate::recycle::give(words);
        }
        Ok(())
    }
}

/// The arena format a dtype takes in the step: float64 travels as float32, because the step's
/// arithmetic is float32 by definition (`p.to(float32)`, `g.to(float32)`), so no precision is
/// lost and the step runs on the GPU like every other dtype.
fn step_format(dtype: DType) -> StorageFormat {
    match dtype {
        DType::Float64 => StorageFormat::F32,
        other => other.storage(),
    }
}

/// Puts host tensors on `backend`'s device as device-resident tensors (one arena per dtype
/// format and list), so that later steps run without host transfers.
///
/// # Errors
/// A `RuntimeError` when a packed image or a host arena does not fit the memory budget, the GPU
/// device refuses an arena or is lost, or the readback of a device-resident input fails.
pub async fn to_device(backend: &dyn Backend, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut out: Vec<Option<Tensor>> = vec![None; tensors.len()];
    let mut groups: BTreeMap<StorageFormat, Vec<usize>> = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        groups.entry(t.dtype().storage()).or_default().push(i);
    }
    for (format, members) in groups {
        let numels: Vec<usize> = members.iter().map(|&i| tensors[i].numel()).collect();
        let (offsets, rank_len) = layout_params(&numels);
        let mut arena =
            backend.create_arena(format, 1, rank_len, backend.chunk_len(rank_len, 1))?;
        let mut hosts = Vec::with_capacity(members.len());
        for &i in &members {
            hosts.push(tensors[i].to_host().await?);
        }
        let row = transfer::pack_row(
            format,
            rank_len,
            offsets
                .iter()
                .zip(&hosts)
                .map(|(&offset, t)| (offset, t.host_data().expect("host tensor"))),
            "to_device's packed image",
        )?;
        arena.write(0, 0, &row)?;
        let arena = Arc::new(arena);
        for (k, &i) in members.iter().enumerate() {
            let slice = DeviceSlice {
                dtype: tensors[i].dtype(),
                arena: arena.clone(),
                rank: 0,
                offset: offsets[k],
                len: tensors[i].numel(),
            };
            out[i] = Some(Tensor::from_device(tensors[i].shape().to_vec(), slice));
        }
    }
    Ok(out
        .into_iter()
        .map(|t| t.expect("every tensor is in a group"))
        .collect())
}
