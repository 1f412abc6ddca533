//! Collectives and copies over a [`Replicas`]' format buckets: the masked all-reduce that
//! averaging, post-local SGD and DiLoCo share, and the copies between replicas that ZeRO's
//! shards make.

use super::{Replicas, Values};
use crate::backend::CopyRegion;
use crate::comm::{AllReduceMeanArgs, Communicator, MeanOrder, Subgroups};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

impl Replicas {
    /// All-reduce-mean of the `selected` parameters' values (`selected[j]` for every global
    /// `j`) within every group of `subgroups`, one collective per format bucket that holds a
    /// selected parameter. `arith` is the format the mean is computed in; `None` computes each
    /// bucket in its own format. The bytes reported to the communicator are what the selected
    /// elements occupy in the arithmetic format.
    ///
    /// # Errors
    /// A `ValueError` when `selected` does not hold one flag per parameter; the world's errors
    /// ([`Communicator::all_reduce_mean`]: a `ValueError` when these replicas do not hold its local
    /// ranks or `subgroups` partitions another world, a `RuntimeError` for a GPU error or a lost
    /// device).
    pub fn all_reduce_mean(
        &mut self,
        world: &dyn Communicator,
        which: Values,
        subgroups: Subgroups,
        selected: &[bool],
        arith: Option<StorageFormat>,
    ) -> Result<()> {
        let live = vec![true; world.world_size()];
        self.all_reduce_mean_live(world, which, subgroups, &live, selected, arith)
    }

    /// [`Replicas::all_reduce_mean`] over the `live` ranks only (one flag per world rank): within
    /// every group, the mean over the group's live ranks, written to them; the other ranks keep
    /// their values (see [`Communicator::all_reduce_mean_live`]).
    ///
    /// # Errors
    /// Those of `all_reduce_mean`, and of [`Communicator::all_reduce_mean_live`] (a `ValueError`
    /// for a mask of another world size or with no live rank; a `RuntimeError` for a rank left
    /// out of a world whose membership is fixed).
    pub fn all_reduce_mean_live(
        &mut self,
        world: &dyn Communicator,
        which: Values,
        subgroups: Subgroups,
        live: &[bool],
        selected: &[bool],
        arith: Option<StorageFormat>,
    ) -> Result<()> {
        if selected.len() != self.len() {
            return Err(Error::value(format!(
                "a selection of {} parameters for a model of {}",
                selected.len(),
                self.len()
            )));
        }
        let backend = self.backend().clone();
        for b in 0..self.buckets().len() {
            let bucket = &self.buckets()[b];
            let active = bucket.mask(selected);
            if !active.contains(&true) {
                continue;
            }
            let arith = arith.unwrap_or(bucket.format());
            let elements: usize = bucket
                .members()
                .iter()
                .filter(|&&j| selected[j])
                .map(|&j| self.numel(j))
                .sum();
            let (arena, starts) = self.buckets_mut()[b].arena_with_starts(which);
            world.all_reduce_mean_live(
                backend.as_ref(),
                arena,
                live,
                AllReduceMeanArgs {
                    groups: subgroups,
                    arith,
                    starts,
                    active: &active,
                    bytes_per_rank: (elements * arith.element_bytes()) as u64,
                    // PyTorch's averagers: `flat /= group size`, then the all-reduce.
                    order: MeanOrder::DivideThenSum,
                },
            )?;
        }
        Ok(())
    }

    /// Every rank's copy region of each parameter in `params` (all of one bucket), at the
    /// parameter's own offset on both sides: a copy between two arenas laid out like that
    /// bucket (its parameters, gradients, or state made for it). Rank after rank, `params` in
    /// their order; a parameter of no elements has none.
    pub(crate) fn same_place_regions(&self, params: &[usize]) -> Vec<CopyRegion> {
        (0..self.ranks())
            .flat_map(|rank| {
                params
                    .iter()
                    .map(move |&j| (rank, self.place(j)))
                    .filter(|(_, place)| place.numel > 0)
                    .map(|(rank, place)| CopyRegion {
                        src_rank: rank,
                        src_offset: place.offset,
                        dst_rank: rank,
                        dst_offset: place.offset,
                        len: place.numel,
                    })
            })
            .collect()
    }

    /// Copies `pairs` `(j, k)`: this replicas' parameter `j` of rank `src_rank` into `dst`'s
    /// parameter `k` of rank `dst_rank`, parameters or gradients, on the device. Each pair must
    /// agree in dtype and element count.
    ///
    /// # Errors
    /// A `ValueError` when a pair differs in dtype or element count, or `src_rank` or `dst_rank` is
    /// out of range; a `RuntimeError` when the replicas live on different backends' devices, or for
    /// a GPU error or a lost device.
    pub fn copy_to(
        &self,
        which: Values,
        src_rank: usize,
        dst: &mut Replicas,
        dst_rank: usize,
        pairs: &[(usize, usize)],
    ) -> Result<()> {
        let mut by_bucket: Vec<(usize, usize, Vec<CopyRegion>)> = Vec::new();
        for &(j, k) in pairs {
            let (from, to) = (self.place(j), dst.place(k));
            if self.dtype(j) != dst.dtype(k) || from.numel != to.numel {
                return Err(Error::value(format!(
                    "cannot copy parameter {j} ({} of {} elements) into parameter {k} ({} of {})",
                    self.dtype(j),
                    from.numel,
                    dst.dtype(k),
                    to.numel
                )));
            }
            let region = CopyRegion {
                src_rank,
                src_offset: from.offset,
                dst_rank,
                dst_offset: to.offset,
                len: from.numel,
            };
            match by_bucket
                .iter_mut()
                .find(|(a, b, _)| (*a, *b) == (from.bucket, to.bucket))
            {
                Some((_, _, regions)) => regions.push(region),
                None => by_bucket.push((from.bucket, to.bucket, vec![region])),
            }
        }
        let backend = self.backend().clone();
        for (from, to, regions) in by_bucket {
            backend.copy_regions(
                self.buckets()[from].arena(which),
                dst.buckets_mut()[to].arena_mut(which),
                &regions,
            )?;
        }
        Ok(())
    }
}
