//! The [`Backend`] trait: the fused kernels every backend runs.

use std::fmt;

use super::arena::{Arena, CopyRegion};
use super::info::BackendInfo;
use super::kernels::{
    AdamArenas, AdamScalars, AverageArgs, ConvertArgs, LerpArgs, ParamStarts, ScaledSumArgs,
    SgdArgs,
};
use super::platform::{BoxFuture, MaybeSendSync};
use crate::dtype::StorageFormat;
use crate::error::Result;

/// A fused-kernel backend. Algorithms are written once against this trait; they never know
/// whether a GPU or the host's cores run them. Arenas belong to the backend that created
/// them; passing another backend's arena is a `RuntimeError`.
///
/// Every kernel is a required method, implemented by both backends: nothing falls back to a
/// host loop behind a backend's back, and a backend that wraps another (to record or
/// instrument calls) must forward each one. The one provided method that computes,
/// [`host_sgd_step`](Self::host_sgd_step), is an optional shortcut (the default `None` makes
/// the caller pack arenas for [`dp_sgd_step`](Self::dp_sgd_step)), not a fallback.
pub trait Backend: MaybeSendSync + fmt::Debug {
    /// What this backend runs on.
    fn info(&self) -> &BackendInfo;

    /// Why this backend can no longer run anything (a GPU device that was lost), or `None`.
    fn lost(&self) -> Option<String> {
        None
    }

    /// Destroys the backend's device, as a driver reset would (a test hook for the
    /// device-lost path; nothing on a CPU backend).
    fn destroy_device_for_test(&self) {}

    /// Elements per rank per chunk for an arena of `rank_len` elements per rank and up to
    /// `ranks` ranks, so that every chunk fits in one storage binding.
    fn chunk_len(&self, rank_len: usize, ranks: usize) -> usize;

    /// A zero-filled arena.
    ///
    /// # Errors
    /// A `ValueError` when the arena's size overflows `usize` (the GPU backend also refuses, for
    /// rows of some elements, a zero or odd `chunk_len` or an odd `rank_len`; rows of no
    /// elements are accepted with any `chunk_len` on both); a `RuntimeError` when a host arena does not fit
    /// the memory budget ([`crate::budget`]) or the allocator refuses it, or when the GPU device
    /// refuses a buffer (beyond its limits, out of memory) or is lost.
    fn create_arena(
        &self,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
    ) -> Result<Arena>;

    /// An arena whose contents are unspecified (it may hold the values of an arena dropped
    /// before): for work that writes every element whose value it uses before reading it.
    /// The CPU backend's is
    /// zero-filled like [`create_arena`](Self::create_arena); the GPU backend skips the clear
    /// of a buffer it kept from a dropped arena.
    ///
    /// # Errors
    /// As [`create_arena`](Self::create_arena).
    fn create_scratch_arena(
        &self,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
    ) -> Result<Arena>;

    /// Copies a whole arena into another of the same format and shape.
    ///
    /// # Errors
    /// A `ValueError` when the arenas differ in format or shape; a `RuntimeError` for an arena this
    /// backend cannot use (another backend's: see the trait's documentation), or when the GPU
    /// device reports an error or is lost.
    fn copy_arena(&self, src: &Arena, dst: &mut Arena) -> Result<()>;

    /// The synchronous data-parallel SGD step over whole arenas, one dispatch per chunk:
    /// `means[i] = round(Σ_r grads[r][i] / R)`, `params[r][i] = round(params[0][i] - lr·means[i])`.
    /// `grads` has R ranks, `params` R ranks, `means` one.
    ///
    /// # Errors
    /// As [`Backend::dp_sgd_step_with_divisor`] with the divisor R: arenas without ranks are a
    /// `ValueError`.
    fn dp_sgd_step(
        &self,
        params: &mut Arena,
        grads: &Arena,
        means: &mut Arena,
        learning_rate: f32,
    ) -> Result<()> {
        let divisor = params.ranks() as f32;
        self.dp_sgd_step_with_divisor(params, grads, means, learning_rate, divisor)
    }

    /// [`Backend::dp_sgd_step`] dividing the float32 sum by `divisor` instead of the rank
    /// count: `means[i] = round((0 + Σ_r grads[r][i]) / divisor)` (a true float32 division),
    /// `params[r][i] = round(params[0][i] - lr·means[i])`. One rank of gradients holding a
    /// world's summed gradients, divided by the world size, is the step of a world whose
    /// gradients were summed elsewhere (one rank per process). `divisor` must be positive
    /// and finite (a `ValueError` otherwise).
    ///
    /// # Errors
    /// A `ValueError` when `divisor` is not positive and finite, or the arenas do not match
    /// (`grads` with other ranks than `params`, `means` with more than one rank, another `rank_len`
    /// or `chunk_len`, `means` in another format than `params`, arenas without ranks); a
    /// `RuntimeError` for an arena this backend cannot use (another backend's:
    /// see the trait's documentation), or when the GPU device reports an error or is lost.
    fn dp_sgd_step_with_divisor(
        &self,
        params: &mut Arena,
        grads: &Arena,
        means: &mut Arena,
        learning_rate: f32,
        divisor: f32,
    ) -> Result<()>;

    /// The data-parallel step computed straight from host tensors, for a backend whose
    /// kernels run on the host: per parameter, the mean gradient and `copies` buffers of the
    /// updated value, the same bits as [`Backend::dp_sgd_step`] over packed arenas. `None`
    /// (the default) when this backend has no such path: the caller packs arenas instead.
    fn host_sgd_step(
        &self,
        params: &[crate::backend::cpu::host_step::HostStepParam<'_>],
        ranks: usize,
        learning_rate: f32,
        copies: usize,
    ) -> Option<Vec<crate::backend::cpu::host_step::HostStepResult>> {
        let _ = (params, ranks, learning_rate, copies);
        None
    }

    /// `torch.optim.SGD`'s step over every rank and parameter of an arena (one dispatch per
    /// chunk). `scalars` has one entry per (rank, parameter), rank-major.
    ///
    /// # Errors
    /// A `ValueError` when `grads` or `momentum` differ from `params` in ranks, length or format
    /// (on the GPU backend also in chunking), when `starts` is empty or `scalars` does not hold one
    /// entry per (rank, parameter), or when an active entry has momentum and no momentum arena is
    /// given. A `RuntimeError` for an arena this backend cannot use (another backend's:
    /// see the trait's documentation), or when the GPU device reports an error or is lost.
    fn sgd(&self, args: SgdArgs<'_>) -> Result<()>;

    /// `torch.optim.Adam`/`AdamW`'s step over every rank and parameter of an arena.
    ///
    /// # Errors
    /// A `ValueError` when an arena differs from the parameters in ranks, length or format (on the
    /// GPU backend also in chunking), when `starts` is empty or `scalars` does not hold one entry
    /// per (rank, parameter), or when an active `amsgrad` entry has no `max_exp_avg_sq` arena. A
    /// `RuntimeError` for an arena this backend cannot use (another
    /// backend's: see the trait's documentation), or when the GPU device reports an error or is
    /// lost.
    fn adam(
        &self,
        arenas: AdamArenas<'_>,
        starts: &ParamStarts,
        scalars: &[AdamScalars],
    ) -> Result<()>;

    /// Averages every group of `group_size` consecutive ranks of `arena` over the parameters
    /// flagged in `active` (see [`super::kernels::average_reference`]), all groups in one dispatch.
    ///
    /// An empty `starts` (an arena with no parameters) and an arena without ranks have nothing
    /// to average: the call checks its arguments and changes nothing, on every backend.
    ///
    /// # Errors
    /// A `ValueError` when `group_size` is 0 or does not divide the arena's ranks, `active` does
    /// not hold one flag per parameter of `starts`, or `starts` does not fit the arena (it must
    /// start at 0 and ascend on 64-element slots within a rank's elements); a `RuntimeError` for
    /// an arena this backend cannot use (another backend's: see the trait's documentation), or
    /// when the GPU device reports an error or is lost.
    fn average(&self, args: AverageArgs<'_>) -> Result<()>;

    /// The data-parallel gradient all-reduce (see [`super::kernels::scaled_sum_reference`]): every
    /// rank with a scale contributes its values times the scale (zeros where not `present`),
    /// ranks without one contribute zeros; the sum over all ranks, in rank order, is written to
    /// the ranks with a scale. One dispatch for every rank and parameter.
    ///
    /// # Errors
    /// A `ValueError` when `reduced` does not hold one flag per parameter, `scales` one entry per
    /// rank or `present` one flag per (rank, parameter); a `RuntimeError` for an arena this backend
    /// cannot use (another backend's: see the trait's documentation), or when the GPU device
    /// reports an error or is lost.
    fn scaled_sum(&self, args: ScaledSumArgs<'_>) -> Result<()>;

    /// torch's `params.lerp_(end, weight)` over two arenas of one layout (see
    /// [`super::kernels::lerp_reference`]): for every rank and every element of the parameters
    /// flagged in `active`, the two-sided lerp as one fused multiply-add in the parameters'
    /// compute precision, rounded once to their format, one dispatch per chunk.
    ///
    /// An empty `starts` (arenas with no parameters) has nothing to compute: the call checks its
    /// arguments and changes nothing, on every backend.
    ///
    /// # Errors
    /// A `ValueError` when `end` differs from `params` in ranks, length or format (on the GPU
    /// backend also in chunking), `active` does not hold one flag per parameter, `starts` does
    /// not fit the arenas (see [`Backend::average`]) or the weight is not finite; a
    /// `RuntimeError` for an arena this backend cannot use (another backend's: see the trait's
    /// documentation), or when the GPU device reports an error or is lost.
    fn lerp(&self, args: LerpArgs<'_>) -> Result<()>;

    /// Converts the parameters flagged in `active` of every rank of `src` into `dst`, an arena
    /// of the same ranks, layout and chunking in another storage format (see
    /// [`super::kernels::convert_reference`]), one dispatch per chunk.
    ///
    /// # Errors
    /// A `ValueError` when the arenas differ in ranks or length (on the GPU backend also in
    /// chunking) or `active` does not hold one flag per parameter; a `RuntimeError` for an arena
    /// this backend cannot use (another backend's: see the trait's documentation), or when the GPU
    /// device reports an error or is lost.
    fn convert(&self, args: ConvertArgs<'_>) -> Result<()>;

    /// Copies many element ranges from `src` to `dst` (arenas of the same format) as one
    /// batch.
    ///
    /// # Errors
    /// A `ValueError` when the arenas differ in format, or a region's rank or elements are out of
    /// range or its offsets are not word aligned; a `RuntimeError` for an arena this backend cannot
    /// use (another backend's: see the trait's documentation), or when the GPU device reports an
    /// error or is lost.
    fn copy_regions(&self, src: &Arena, dst: &mut Arena, regions: &[CopyRegion]) -> Result<()>;

    /// Copies elements `offset..offset + len` (word aligned) of rank `from` to rank `to` of the
    /// same arena.
    ///
    /// # Errors
    /// A `ValueError` when `from` or `to` is out of range or `offset + len` exceeds the rank's
    /// elements; a `RuntimeError` for an arena this backend cannot use (another backend's: see the
    /// trait's documentation), or when the GPU device reports an error or is lost.
    fn copy_between_ranks(
        &self,
        arena: &mut Arena,
        from: usize,
        to: usize,
        offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Resolves when every operation submitted so far has finished.
    ///
    /// # Errors
    /// On the GPU backend, a `RuntimeError` when the device reported an error since the last check,
    /// was lost, or could not be polled; the CPU backend never fails.
    fn synchronize(&self) -> BoxFuture<'_, Result<()>>;
}
