//! `Replicas`: the parameters and gradients of R ranks' copies of one model, resident in
//! replica arenas (one per storage format, laid out `[rank][param]`), so that optimizers and
//! collectives run over every rank and parameter of a dtype in one dispatch.

use std::sync::Arc;

use crate::backend::kernels::ParamStarts;
use crate::backend::{Arena, Backend, layout_params};
use crate::dtype::{DType, StorageFormat};
use crate::error::{Error, Result};
use crate::tensor::{HostData, Tensor, format_shape};

/// Where one parameter lives.
#[derive(Debug, Clone)]
pub(crate) struct ParamSlot {
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) numel: usize,
    /// Index into `Replicas::groups`.
    pub(crate) group: usize,
    /// First element in the rank's element space of the group's arenas.
    pub(crate) offset: usize,
}

/// The parameters of one storage format: their arenas and layout.
#[derive(Debug)]
pub(crate) struct ReplicaGroup {
    pub(crate) format: StorageFormat,
    /// Global parameter indices, in arena order.
    pub(crate) members: Vec<usize>,
    pub(crate) starts: ParamStarts,
    pub(crate) rank_len: usize,
    pub(crate) chunk_len: usize,
    pub(crate) params: Arena,
    pub(crate) grads: Arena,
}

impl ReplicaGroup {
    /// A zero-filled arena of this group's layout for `ranks` ranks (optimizer state).
    pub(crate) fn state_arena(&self, backend: &dyn Backend, ranks: usize) -> Result<Arena> {
        backend.create_arena(self.format, ranks, self.rank_len, self.chunk_len)
    }
}

/// R ranks' replicas of a list of parameters, and their gradients, on one backend.
///
/// ```
/// use std::sync::Arc;
/// use distopt::{CpuBackend, Tensor};
/// use distopt::replicas::Replicas;
/// let backend = Arc::new(CpuBackend::new());
/// let w = Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap();
/// let mut model = Replicas::replicate(backend, 4, &[w]).unwrap();
/// model.set_grad_blocking(3, 0, Some(&Tensor::from_f32(&[2], vec![0.5, 0.5]).unwrap())).unwrap();
/// assert!(model.has_grad(3, 0) && !model.has_grad(0, 0));
/// assert_eq!(model.param_blocking(2, 0).unwrap().values_f64().unwrap(), vec![1.0, 2.0]);
/// ```
#[derive(Debug)]
pub struct Replicas {
    backend: Arc<dyn Backend>,
    ranks: usize,
    pub(crate) slots: Vec<ParamSlot>,
    pub(crate) groups: Vec<ReplicaGroup>,
    /// `has_grad[rank * len + j]`.
    has_grad: Vec<bool>,
}

impl Replicas {
    /// Replicas from each rank's own parameter values (`per_rank[r][j]`). Every rank must hold
    /// the same number of parameters with the same shapes and dtypes.
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
                if p.shape() != first.shape() || p.dtype() != first.dtype() {
                    return Err(Error::value(format!(
                        "parameter {j} of rank {rank} is {} {}, rank 0's is {} {}",
                        p.dtype(),
                        format_shape(p.shape()),
                        first.dtype(),
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
        let mut slots: Vec<Option<ParamSlot>> = vec![None; templates.len()];
        let mut groups = Vec::new();
        for format in formats {
            let members: Vec<usize> = (0..templates.len())
                .filter(|&j| templates[j].dtype().storage() == format)
                .collect();
            let numels: Vec<usize> = members.iter().map(|&j| templates[j].numel()).collect();
            let (offsets, rank_len) = layout_params(&numels);
            let chunk_len = backend.chunk_len(rank_len, ranks);
            let group = groups.len();
            for (member, &j) in members.iter().enumerate() {
                slots[j] = Some(ParamSlot {
                    shape: templates[j].shape().to_vec(),
                    dtype: templates[j].dtype(),
                    numel: templates[j].numel(),
                    group,
                    offset: offsets[member],
                });
            }
            groups.push(ReplicaGroup {
                format,
                starts: ParamStarts(offsets.iter().map(|&o| o as u32).collect()),
                members,
                rank_len,
                chunk_len,
                params: backend.create_arena(format, ranks, rank_len, chunk_len)?,
                grads: backend.create_arena(format, ranks, rank_len, chunk_len)?,
            });
        }
        Ok(Replicas {
            backend,
            ranks,
            slots: slots
                .into_iter()
                .map(|s| s.expect("every parameter has a format"))
                .collect(),
            groups,
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
        self.slots.len()
    }

    /// Whether there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Parameter `j`'s shape.
    pub fn shape(&self, j: usize) -> &[usize] {
        &self.slots[j].shape
    }

    /// Parameter `j`'s dtype.
    pub fn dtype(&self, j: usize) -> DType {
        self.slots[j].dtype
    }

    /// Parameter `j`'s element count.
    pub fn numel(&self, j: usize) -> usize {
        self.slots[j].numel
    }

    /// Bytes of one rank's parameters.
    pub fn bytes_per_rank(&self) -> usize {
        self.slots
            .iter()
            .map(|s| s.numel * s.dtype.size_bytes())
            .sum()
    }

    fn check(&self, rank: usize, j: usize) -> Result<()> {
        if rank >= self.ranks {
            return Err(Error::new(
                crate::ErrorKind::IndexError,
                format!("rank {rank} out of range for {} ranks", self.ranks),
            ));
        }
        if j >= self.slots.len() {
            return Err(Error::new(
                crate::ErrorKind::IndexError,
                format!(
                    "parameter {j} out of range for {} parameters",
                    self.slots.len()
                ),
            ));
        }
        Ok(())
    }

    /// Copies rank `root`'s parameters to every other rank (a broadcast from `root`, as
    /// `DistributedDataParallel` does at construction), on the device.
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
        for group in &mut self.groups {
            world.broadcast(backend.as_ref(), &mut group.params, root, 0, group.rank_len)?;
        }
        Ok(())
    }

    /// Whether rank `rank` has a gradient for parameter `j`.
    pub fn has_grad(&self, rank: usize, j: usize) -> bool {
        self.has_grad
            .get(rank * self.slots.len() + j)
            .copied()
            .unwrap_or(false)
    }

    /// Encodes `tensors` (global index, value) of one group into one image per rank and writes
    /// it; `None` writes zeros.
    fn write_values(
        &mut self,
        rank: usize,
        values: &[(usize, Option<&Tensor>)],
        grads: bool,
    ) -> Result<()> {
        for (j, value) in values {
            self.check(rank, *j)?;
            if let Some(t) = value {
                let slot = &self.slots[*j];
                let what = if grads { "gradient" } else { "parameter" };
                if t.shape() != slot.shape.as_slice() {
                    return Err(Error::value(format!(
                        "{what} {j} of rank {rank} has shape {}, expected {}",
                        format_shape(t.shape()),
                        format_shape(&slot.shape)
                    )));
                }
                if t.dtype() != slot.dtype {
                    return Err(Error::type_error(format!(
                        "{what} {j} of rank {rank} has dtype {}, the parameter's is {}",
                        t.dtype(),
                        slot.dtype
                    )));
                }
                if t.is_on_device() {
                    return Err(Error::value(format!(
                        "{what} {j} of rank {rank} is device-resident: pass host tensors"
                    )));
                }
            }
        }
        for g in 0..self.groups.len() {
            let mine: Vec<&(usize, Option<&Tensor>)> = values
                .iter()
                .filter(|(j, _)| self.slots[*j].group == g)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let format = self.groups[g].format;
            for (j, value) in mine {
                let slot = &self.slots[*j];
                let mut words = crate::budget::zeroed(
                    format.words_for(slot.numel),
                    "a parameter's packed words",
                )?;
                if let Some(t) = value {
                    t.host_data()
                        .expect("checked host")
                        .encode_into(format, &mut words);
                }
                let arena = if grads {
                    &mut self.groups[g].grads
                } else {
                    &mut self.groups[g].params
                };
                arena.write(rank, slot.offset, &words)?;
            }
        }
        Ok(())
    }

    /// Overwrites every parameter of rank `rank`.
    pub fn set_params(&mut self, rank: usize, params: &[Tensor]) -> Result<()> {
        if params.len() != self.slots.len() {
            return Err(Error::value(format!(
                "{} parameters given for rank {rank}, the model has {}",
                params.len(),
                self.slots.len()
            )));
        }
        let values: Vec<(usize, Option<&Tensor>)> = params
            .iter()
            .enumerate()
            .map(|(j, t)| (j, Some(t)))
            .collect();
        self.write_values(rank, &values, false)
    }

    /// Overwrites parameter `j` of rank `rank`.
    pub fn set_param(&mut self, rank: usize, j: usize, value: &Tensor) -> Result<()> {
        self.write_values(rank, &[(j, Some(value))], false)
    }

    /// Sets every gradient of rank `rank` (`None`: no gradient, as `p.grad = None`).
    pub fn set_grads(&mut self, rank: usize, grads: &[Option<Tensor>]) -> Result<()> {
        if grads.len() != self.slots.len() {
            return Err(Error::value(format!(
                "{} gradients given for rank {rank}, the model has {} parameters",
                grads.len(),
                self.slots.len()
            )));
        }
        let values: Vec<(usize, Option<&Tensor>)> = grads
            .iter()
            .enumerate()
            .map(|(j, t)| (j, t.as_ref()))
            .collect();
        self.write_values(rank, &values, true)?;
        let len = self.slots.len();
        for (j, g) in grads.iter().enumerate() {
            self.has_grad[rank * len + j] = g.is_some();
        }
        Ok(())
    }

    /// Sets gradient `j` of rank `rank`.
    pub async fn set_grad(&mut self, rank: usize, j: usize, grad: Option<&Tensor>) -> Result<()> {
        self.write_values(rank, &[(j, grad)], true)?;
        let len = self.slots.len();
        self.has_grad[rank * len + j] = grad.is_some();
        Ok(())
    }

    /// Blocking [`Replicas::set_grad`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn set_grad_blocking(
        &mut self,
        rank: usize,
        j: usize,
        grad: Option<&Tensor>,
    ) -> Result<()> {
        pollster::block_on(self.set_grad(rank, j, grad))
    }

    /// `zero_grad(set_to_none=True)` on every rank.
    pub fn zero_grad(&mut self) {
        self.has_grad.fill(false);
    }

    /// `zero_grad(set_to_none=True)` on rank `rank` alone (the others keep their gradients).
    pub fn zero_grad_rank(&mut self, rank: usize) {
        let len = self.slots.len();
        if rank < self.ranks {
            self.has_grad[rank * len..(rank + 1) * len].fill(false);
        }
    }

    /// Marks the gradients of rank `rank` present or absent without touching their values.
    pub(crate) fn set_has_grad(&mut self, rank: usize, j: usize, present: bool) {
        let len = self.slots.len();
        self.has_grad[rank * len + j] = present;
    }

    async fn read(&self, rank: usize, j: usize, grads: bool) -> Result<Tensor> {
        self.check(rank, j)?;
        let slot = &self.slots[j];
        let group = &self.groups[slot.group];
        let arena = if grads { &group.grads } else { &group.params };
        let words = arena.read_range(rank, slot.offset, slot.numel).await?;
        Tensor::new(
            &slot.shape,
            HostData::decode(slot.dtype, group.format, &words, slot.numel),
        )
    }

    /// Parameter `j` of rank `rank`, read back to the host.
    pub async fn param(&self, rank: usize, j: usize) -> Result<Tensor> {
        self.read(rank, j, false).await
    }

    /// Blocking [`Replicas::param`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn param_blocking(&self, rank: usize, j: usize) -> Result<Tensor> {
        pollster::block_on(self.param(rank, j))
    }

    /// Gradient `j` of rank `rank`, or `None`.
    pub async fn grad(&self, rank: usize, j: usize) -> Result<Option<Tensor>> {
        if !self.has_grad(rank, j) {
            self.check(rank, j)?;
            return Ok(None);
        }
        self.read(rank, j, true).await.map(Some)
    }

    /// Every parameter of every rank (`[rank][param]`), one readback per arena.
    pub async fn all_params(&self) -> Result<Vec<Vec<Tensor>>> {
        self.read_all(false).await.map(|all| {
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
    pub async fn all_grads(&self) -> Result<Vec<Vec<Option<Tensor>>>> {
        self.read_all(true).await
    }

    async fn read_all(&self, grads: bool) -> Result<Vec<Vec<Option<Tensor>>>> {
        let len = self.slots.len();
        let mut out: Vec<Vec<Option<Tensor>>> = vec![vec![None; len]; self.ranks];
        for group in &self.groups {
            let arena = if grads { &group.grads } else { &group.params };
            let words = arena.read_all().await?;
            let rank_words = group.format.words_for(group.rank_len);
            for (rank, row) in out.iter_mut().enumerate() {
                for &j in &group.members {
                    if grads && !self.has_grad(rank, j) {
                        continue;
                    }
                    let slot = &self.slots[j];
                    let start = rank * rank_words + group.format.word_of(slot.offset);
                    let data =
                        HostData::decode(slot.dtype, group.format, &words[start..], slot.numel);
                    row[j] = Some(Tensor::new(&slot.shape, data)?);
                }
            }
        }
        Ok(out)
    }

    /// Blocking [`Replicas::all_params`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn all_params_blocking(&self) -> Result<Vec<Vec<Tensor>>> {
        pollster::block_on(self.all_params())
    }

    /// Blocking [`Replicas::all_grads`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn all_grads_blocking(&self) -> Result<Vec<Vec<Option<Tensor>>>> {
        pollster::block_on(self.all_grads())
    }
}
