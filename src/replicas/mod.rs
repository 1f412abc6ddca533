//! `Replicas`: the parameters and gradients of R ranks' copies of one model, resident in
//! replica arenas (one per storage format, laid out `[rank][param]`), so that optimizers and
//! collectives run over every rank and parameter of a dtype in one dispatch.

mod bucket;
mod collective;
mod state;

use std::sync::Arc;

pub use bucket::{FormatBucket, ParamPlace, Values};
pub use state::StateArenas;

use crate::backend::{Backend, layout_params};
use crate::dtype::{DType, StorageFormat};
use crate::error::{Error, Result};
use crate::tensor::{Tensor, format_shape};
use crate::transfer;

/// The error of a tensor whose dtype is not the one it must have: a `RuntimeError`, PyTorch's
/// kind for it (`param.grad = grad` of another dtype, an operation on tensors of mismatched
/// dtypes). See [`Replicas`] for where the library reports one.
pub(crate) fn dtype_mismatch(message: String) -> Error {
    Error::runtime(message)
}

/// The `IndexError` of a parameter index `j` (given to an optimizer, ZeRO or an averager)
/// outside a model of `params` parameters.
pub(crate) fn check_param_index(j: usize, params: usize) -> Result<()> {
    if j >= params {
        return Err(Error::new(
            crate::error::ErrorKind::IndexError,
            format!("parameter index {j} out of range for {params} parameters"),
        ));
    }
    Ok(())
}

/// One parameter: its shape, dtype and where it lives.
#[derive(Debug, Clone)]
struct ParamInfo {
    shape: Vec<usize>,
    dtype: DType,
    place: ParamPlace,
}

/// R ranks' replicas of a list of parameters, and their gradients, on one backend.
///
/// **Dtypes.** A parameter's dtype is fixed when the replicas are made. The one rule for a
/// tensor of another dtype, as PyTorch has it:
///
/// - a value written into a parameter ([`set_param`](Self::set_param),
///   [`set_params`](Self::set_params)) is cast to the parameter's dtype, rounded to nearest even,
///   as `param.copy_(value)` (and `module.load_state_dict`) cast;
/// - a gradient of another dtype than its parameter ([`set_grad`](Self::set_grad),
///   [`set_grads`](Self::set_grads)) is a `RuntimeError`, as `param.grad = grad` is in PyTorch
///   (`assigned grad has data of a different type`);
/// - ranks whose parameter `j` differs in dtype ([`Replicas::new`]) are a `ValueError`, as ranks
///   that differ in shape are: every disagreement between ranks held together is one (the step's
///   reference contract makes all of its input checks `ValueError`s), and there is no value to
///   cast to. (The stateless step reads rank 0's copy only, the reference's `p0j`, so another
///   rank's dtype is not read there.)
///
/// A shape that differs is a `ValueError` everywhere (the step's `parameter shape mismatch`
/// and `gradient shape mismatch`), and every refused call writes nothing.
///
/// ```
/// use distopt::BlockOn;
/// use std::sync::Arc;
/// use distopt::{CpuBackend, Tensor};
/// use distopt::replicas::Replicas;
/// let backend = Arc::new(CpuBackend::new());
/// let w = Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap();
/// let mut model = Replicas::replicate(backend, 4, &[w]).unwrap();
/// model.set_grad(3, 0, Some(&Tensor::from_f32(&[2], vec![0.5, 0.5]).unwrap())).block_on().unwrap();
/// assert!(model.has_grad(3, 0) && !model.has_grad(0, 0));
/// assert_eq!(model.param(2, 0).block_on().unwrap().values_f64().unwrap(), vec![1.0, 2.0]);
/// ```
#[derive(Debug)]
pub struct Replicas {
    backend: Arc<dyn Backend>,
    ranks: usize,
    params: Vec<ParamInfo>,
    buckets: Vec<FormatBucket>,
    /// `has_grad[rank * len + j]`.
    has_grad: Vec<bool>,
}

impl Replicas {
    /// Replicas from each rank's own parameter values (`per_rank[r][j]`). Every rank must hold
    /// the same number of parameters with the same shapes and dtypes.
    ///
    /// # Errors
    /// A `ValueError` when `per_rank` is empty, a rank holds another number of parameters than rank
    /// 0, a parameter differs from rank 0's in dtype (checked before its shape; see the dtype rule
    /// above) or shape, or a tensor is device-resident (pass host tensors); a `RuntimeError` when
    /// the arenas do not fit the memory budget or the backend fails (a GPU error, a lost device).
    pub fn new(backend: Arc<dyn Backend>, per_rank: &[Vec<Tensor>]) -> Result<Replicas> {
        let ranks = per_rank.len();
        if ranks == 0 {
            return Err(Error::value("Replicas need at least one rank"));
        }
        let count = per_rank[0].len();
        for (rank, params) in per_rank.iter().enumerate() {
            if params.len() != count {
                return Err(Error::value(format!(
                    "rank {rank} has {} parameters, rank 0 has {count}",
                    params.len()
                )));
            }
            for (j, p) in params.iter().enumerate() {
                let first = &per_rank[0][j];
                if p.dtype() != first.dtype() {
                    return Err(Error::value(format!(
                        "parameter {j} of rank {rank} is {}, rank 0's is {}: every rank must hold the same dtypes",
                        p.dtype(),
                        first.dtype()
                    )));
                }
                if p.shape() != first.shape() {
                    return Err(Error::value(format!(
                        "parameter {j} of rank {rank} has shape {}, rank 0's has {}",
                        format_shape(p.shape()),
                        format_shape(first.shape())
                    )));
                }
            }
        }
        let mut replicas = Replicas::allocate(backend, ranks, &per_rank[0])?;
        for (rank, params) in per_rank.iter().enumerate() {
            replicas.set_params(rank, params)?;
        }
        Ok(replicas)
    }

    /// `ranks` identical replicas of `params`.
    ///
    /// # Errors
    /// A `ValueError` when `ranks` is 0 or a tensor is device-resident (pass host tensors); a
    /// `RuntimeError` when the arenas do not fit the memory budget or the backend fails (a GPU
    /// error, a lost device).
    pub fn replicate(
        backend: Arc<dyn Backend>,
        ranks: usize,
        params: &[Tensor],
    ) -> Result<Replicas> {
        if ranks == 0 {
            return Err(Error::value("Replicas need at least one rank"));
        }
        let mut replicas = Replicas::allocate(backend, ranks, params)?;
        for rank in 0..ranks {
            replicas.set_params(rank, params)?;
        }
        Ok(replicas)
    }

    fn allocate(backend: Arc<dyn Backend>, ranks: usize, templates: &[Tensor]) -> Result<Replicas> {
        let mut formats: Vec<StorageFormat> =
            templates.iter().map(|t| t.dtype().storage()).collect();
        formats.sort();
        formats.dedup();
        let mut params: Vec<Option<ParamInfo>> = vec![None; templates.len()];
        let mut buckets = Vec::with_capacity(formats.len());
        for format in formats {
            let members: Vec<usize> = (0..templates.len())
                .filter(|&j| templates[j].dtype().storage() == format)
                .collect();
            let numels: Vec<usize> = members.iter().map(|&j| templates[j].numel()).collect();
            let (offsets, rank_len) = layout_params(&numels);
            for (member, &j) in members.iter().enumerate() {
                params[j] = Some(ParamInfo {
                    shape: templates[j].shape().to_vec(),
                    dtype: templates[j].dtype(),
                    place: ParamPlace {
                        bucket: buckets.len(),
                        offset: offsets[member],
                        numel: templates[j].numel(),
                    },
                });
            }
            buckets.push(FormatBucket::allocate(
                backend.as_ref(),
                format,
                members,
                &offsets,
                rank_len,
                ranks,
            )?);
        }
        Ok(Replicas {
            backend,
            ranks,
            params: params
                .into_iter()
                .map(|p| p.expect("every parameter has a format"))
                .collect(),
            buckets,
            has_grad: vec![false; ranks * templates.len()],
        })
    }

    /// The backend the arenas live on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Number of parameters per rank.
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// Whether there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Parameter `j`'s shape.
    pub fn shape(&self, j: usize) -> &[usize] {
        &self.params[j].shape
    }

    /// Parameter `j`'s dtype.
    pub fn dtype(&self, j: usize) -> DType {
        self.params[j].dtype
    }

    /// Parameter `j`'s element count.
    pub fn numel(&self, j: usize) -> usize {
        self.params[j].place.numel
    }

    /// Where parameter `j` lives: its format bucket and its range in a rank's row.
    pub fn place(&self, j: usize) -> ParamPlace {
        self.params[j].place
    }

    /// The format buckets (one per storage format of the parameters, in format order).
    pub fn buckets(&self) -> &[FormatBucket] {
        &self.buckets
    }

    /// The format buckets, to write (the optimizers' and collectives' kernels).
    pub(crate) fn buckets_mut(&mut self) -> &mut [FormatBucket] {
        &mut self.buckets
    }

    /// Bytes of one rank's parameters.
    pub fn bytes_per_rank(&self) -> usize {
        self.params
            .iter()
            .map(|p| p.place.numel * p.dtype.size_bytes())
            .sum()
    }

    fn check(&self, rank: usize, j: usize) -> Result<()> {
        if rank >= self.ranks {
            return Err(Error::new(
                crate::ErrorKind::IndexError,
                format!("rank {rank} out of range for {} ranks", self.ranks),
            ));
        }
        if j >= self.params.len() {
            return Err(Error::new(
                crate::ErrorKind::IndexError,
                format!(
                    "parameter {j} out of range for {} parameters",
                    self.params.len()
                ),
            ));
        }
        Ok(())
    }

    /// Checks that these replicas hold one replica per local rank of `world`, as an algorithm
    /// over `world` (DDP, ZeRO) needs when it is built.
    ///
    /// # Errors
    /// A `ValueError` naming both counts when they differ.
    pub(crate) fn check_local_ranks(&self, world: &dyn crate::comm::Communicator) -> Result<()> {
        if self.ranks != world.local_ranks().len() {
            return Err(Error::value(format!(
                "the replicas have {} ranks, this process holds {} of the world's {}",
                self.ranks,
                world.local_ranks().len(),
                world.world_size()
            )));
        }
        Ok(())
    }

    /// Copies rank `root`'s parameters to every other rank (a broadcast from `root`, as
    /// `DistributedDataParallel` does at construction), on the device.
    ///
    /// # Errors
    /// An `IndexError` when `root` is outside the world; the world's errors
    /// ([`Communicator::broadcast`](crate::comm::Communicator::broadcast): a `ValueError` when the
    /// replicas have no rank `root` or, over MPI, more than the process's one rank; a
    /// `RuntimeError` for a GPU error or a lost device).
    pub fn broadcast_params(
        &mut self,
        world: &dyn crate::comm::Communicator,
        root: usize,
    ) -> Result<()> {
        if root >= world.world_size() {
            return Err(Error::new(
                crate::ErrorKind::IndexError,
                format!(
                    "rank {root} out of range for a world of {} ranks",
                    world.world_size()
                ),
            ));
        }
        let backend = self.backend.clone();
        for bucket in &mut self.buckets {
            let rank_len = bucket.rank_len();
            world.broadcast(
                backend.as_ref(),
                bucket.arena_mut(Values::Params),
                root,
                0,
                rank_len,
            )?;
        }
        Ok(())
    }

    /// Copies local rank `from`'s parameters over local rank `to`'s, on the device (a healed
    /// rank's parameters).
    ///
    /// # Errors
    /// A `ValueError` when `from` or `to` is out of range; a `RuntimeError` for a GPU error or a
    /// lost device.
    pub fn copy_rank_params(&mut self, from: usize, to: usize) -> Result<()> {
        let backend = self.backend.clone();
        for bucket in &mut self.buckets {
            let rank_len = bucket.rank_len();
            backend.copy_between_ranks(bucket.arena_mut(Values::Params), from, to, 0, rank_len)?;
        }
        Ok(())
    }

    /// Heals world rank `joiner`'s parameters from world rank `source`'s over `world`
    /// ([`Communicator::heal_rows`](crate::comm::Communicator::heal_rows): a copy where this process holds both, a transfer between
    /// their processes otherwise).
    ///
    /// # Errors
    /// Those of [`Communicator::heal_rows`](crate::comm::Communicator::heal_rows).
    pub fn heal_params(
        &mut self,
        world: &dyn crate::comm::Communicator,
        source: usize,
        joiner: usize,
    ) -> Result<()> {
        let backend = self.backend.clone();
        for bucket in &mut self.buckets {
            world.heal_rows(
                backend.as_ref(),
                bucket.arena_mut(Values::Params),
                source,
                joiner,
            )?;
        }
        Ok(())
    }

    /// Whether rank `rank` has a gradient for parameter `j`.
    pub fn has_grad(&self, rank: usize, j: usize) -> bool {
        self.has_grad
            .get(rank * self.params.len() + j)
            .copied()
            .unwrap_or(false)
    }

    /// [`Replicas::write_values`] of one value per parameter, in parameter order; a
    /// `ValueError` when `values` holds another number.
    fn write_every<'a>(
        &mut self,
        rank: usize,
        values: impl ExactSizeIterator<Item = Option<&'a Tensor>>,
        which: Values,
    ) -> Result<()> {
        let (given, len) = (values.len(), self.params.len());
        if given != len {
            return Err(Error::value(match which {
                Values::Params => {
                    format!("{given} parameters given for rank {rank}, the model has {len}")
                }
                Values::Grads => format!(
                    "{given} gradients given for rank {rank}, the model has {len} parameters"
                ),
            }));
        }
        let values: Vec<(usize, Option<&Tensor>)> = values.enumerate().collect();
        self.write_values(rank, &values, which)
    }

    /// Writes `values` (global index, value) into rank `rank`'s row of the parameters or the
    /// gradients; `None` writes zeros. Every value is checked before anything is written.
    fn write_values(
        &mut self,
        rank: usize,
        values: &[(usize, Option<&Tensor>)],
        which: Values,
    ) -> Result<()> {
        let what = match which {
            Values::Params => "parameter",
            Values::Grads => "gradient",
        };
        for (j, value) in values {
            self.check(rank, *j)?;
            if let Some(t) = value {
                let param = &self.params[*j];
                // A parameter's value is copied in and cast (`param.copy_(value)`); a gradient
                // must have the parameter's dtype (`param.grad = grad`, which checks the dtype
                // before the size).
                if which == Values::Grads && t.dtype() != param.dtype {
                    return Err(dtype_mismatch(format!(
                        "assigned grad has data of a different type: gradient {j} of rank {rank} is {}, the parameter is {}",
                        t.dtype(),
                        param.dtype
                    )));
                }
                if t.shape() != param.shape.as_slice() {
                    return Err(Error::value(format!(
                        "{what} {j} of rank {rank} has shape {}, expected {}",
                        format_shape(t.shape()),
                        format_shape(&param.shape)
                    )));
                }
                if t.is_on_device() {
                    return Err(Error::value(format!(
                        "{what} {j} of rank {rank} is device-resident: pass host tensors"
                    )));
                }
            }
        }
        // Encode everything first: a refused allocation leaves the replicas as they were.
        let what = "a parameter's packed words";
        let mut encoded = Vec::with_capacity(values.len());
        for &(j, value) in values {
            let place = self.params[j].place;
            let format = self.buckets[place.bucket].format();
            encoded.push(match value {
                Some(t) => transfer::encode(t, format, what)?,
                None => crate::budget::zeroed(format.words_for(place.numel), what)?,
            });
        }
        for (&(j, _), words) in values.iter().zip(encoded) {
            let place = self.params[j].place;
            self.buckets[place.bucket]
                .arena_mut(which)
                .write(rank, place.offset, &words)?;
        }
        Ok(())
    }

    /// Overwrites every parameter of rank `rank`.
    ///
    /// # Errors
    /// A `ValueError` when `params` does not hold one tensor per parameter; for each tensor, as
    /// [`Replicas::set_param`]. Nothing is written when it fails.
    pub fn set_params(&mut self, rank: usize, params: &[Tensor]) -> Result<()> {
        self.write_every(rank, params.iter().map(Some), Values::Params)
    }

    /// Overwrites parameter `j` of rank `rank`.
    ///
    /// A value of another dtype is cast to the parameter's (`param.copy_(value)`: see the dtype
    /// rule above).
    ///
    /// # Errors
    /// An `IndexError` when `rank` or `j` is out of range; a `ValueError` when the tensor's shape
    /// differs from the parameter's or it is device-resident (pass host tensors); a `RuntimeError`
    /// when its packed copy does not fit the memory budget. Nothing is written when it fails.
    pub fn set_param(&mut self, rank: usize, j: usize, value: &Tensor) -> Result<()> {
        self.write_values(rank, &[(j, Some(value))], Values::Params)
    }

    /// Sets every gradient of rank `rank` (`None`: no gradient, as `p.grad = None`).
    ///
    /// # Errors
    /// A `ValueError` when `grads` does not hold one entry per parameter; for each gradient, as
    /// [`Replicas::set_grad`]. Nothing is written when it fails.
    pub fn set_grads(&mut self, rank: usize, grads: &[Option<Tensor>]) -> Result<()> {
        self.write_every(rank, grads.iter().map(Option::as_ref), Values::Grads)?;
        let len = self.params.len();
        for (j, g) in grads.iter().enumerate() {
            self.has_grad[rank * len + j] = g.is_some();
        }
        Ok(())
    }

    /// Sets gradient `j` of rank `rank` (`None`: no gradient). A gradient must have its
    /// parameter's dtype (`param.grad = grad`: see the dtype rule above).
    ///
    /// # Errors
    /// A `RuntimeError` when the gradient's dtype differs from the parameter's; otherwise as
    /// [`Replicas::set_param`] (a `None` gradient is checked for `rank` and `j` only). Nothing is
    /// written when it fails.
    pub async fn set_grad(&mut self, rank: usize, j: usize, grad: Option<&Tensor>) -> Result<()> {
        self.write_values(rank, &[(j, grad)], Values::Grads)?;
        let len = self.params.len();
        self.has_grad[rank * len + j] = grad.is_some();
        Ok(())
    }

    /// `zero_grad(set_to_none=True)` on every rank.
    pub fn zero_grad(&mut self) {
        self.has_grad.fill(false);
    }

    /// `zero_grad(set_to_none=True)` on rank `rank` alone (the others keep their gradients).
    pub fn zero_grad_rank(&mut self, rank: usize) {
        let len = self.params.len();
        if rank < self.ranks {
            self.has_grad[rank * len..(rank + 1) * len].fill(false);
        }
    }

    /// Marks the gradients of rank `rank` present or absent without touching their values.
    pub(crate) fn set_has_grad(&mut self, rank: usize, j: usize, present: bool) {
        let len = self.params.len();
        self.has_grad[rank * len + j] = present;
    }

    async fn read(&self, rank: usize, j: usize, which: Values) -> Result<Tensor> {
        self.check(rank, j)?;
        let param = &self.params[j];
        let arena = self.buckets[param.place.bucket].arena(which);
        transfer::read_tensor(arena, rank, param.place.offset, &param.shape, param.dtype).await
    }

    /// Parameter `j` of rank `rank`, read back to the host.
    ///
    /// # Errors
    /// An `IndexError` when `rank` or `j` is out of range; a `RuntimeError` when a GPU readback
    /// fails (a device error, a lost device).
    pub async fn param(&self, rank: usize, j: usize) -> Result<Tensor> {
        self.read(rank, j, Values::Params).await
    }

    /// Gradient `j` of rank `rank`, or `None`.
    ///
    /// # Errors
    /// An `IndexError` when `rank` or `j` is out of range; a `RuntimeError` when a GPU readback
    /// fails (a device error, a lost device).
    pub async fn grad(&self, rank: usize, j: usize) -> Result<Option<Tensor>> {
        if !self.has_grad(rank, j) {
            self.check(rank, j)?;
            return Ok(None);
        }
        self.read(rank, j, Values::Grads).await.map(Some)
    }

    /// Every parameter of every rank (`[rank][param]`), one readback per arena.
    ///
    /// # Errors
    /// A `RuntimeError` when a host arena's copy does not fit the memory budget or a GPU readback
    /// fails (a device error, a lost device).
    pub async fn all_params(&self) -> Result<Vec<Vec<Tensor>>> {
        self.read_all(Values::Params).await.map(|all| {
            all.into_iter()
                .map(|rank| {
                    rank.into_iter()
                        .map(|t| t.expect("parameters always exist"))
                        .collect()
                })
                .collect()
        })
    }

    /// Every gradient of every rank (`[rank][param]`, `None` where absent).
    ///
    /// # Errors
    /// As [`Replicas::all_params`].
    pub async fn all_grads(&self) -> Result<Vec<Vec<Option<Tensor>>>> {
        self.read_all(Values::Grads).await
    }

    async fn read_all(&self, which: Values) -> Result<Vec<Vec<Option<Tensor>>>> {
        let len = self.params.len();
        let mut out: Vec<Vec<Option<Tensor>>> = vec![vec![None; len]; self.ranks];
        for bucket in &self.buckets {
            let words = bucket.arena(which).read_all().await?;
            for (rank, row) in out.iter_mut().enumerate() {
                for &j in bucket.members() {
                    if which == Values::Grads && !self.has_grad(rank, j) {
                        continue;
                    }
                    let param = &self.params[j];
                    row[j] = Some(transfer::tensor_in_rows(
                        &words,
                        bucket.format(),
                        bucket.rank_len(),
                        rank,
                        param.place.offset,
                        &param.shape,
                        param.dtype,
                    )?);
                }
            }
        }
        Ok(out)
    }
}
