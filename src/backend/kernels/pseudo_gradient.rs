//! DiLoCo's pseudo-gradient, the plain-Rust reference. The CPU backend runs it as it is
//! (`backend/cpu/mod.rs`); its GPU twins are the dispatch in `backend/gpu/pseudo_gradient.rs`
//! and the shader `shaders/pseudo_gradient.wgsl`.

use super::{
    Arena, Chunking, ParamStarts, check_flags, check_same_layout, host_words, host_words_mut,
};
use crate::dtype::StorageFormat;
use crate::error::Result;

/// The arguments of DiLoCo's pseudo-gradient
/// ([`Backend::pseudo_gradient`](crate::backend::Backend::pseudo_gradient),
/// [`pseudo_gradient_reference`]): three arenas of one layout and the flags.
pub struct PseudoGradientArgs<'a> {
    /// The parameters after the inner steps (reset to `backup`).
    pub params: &'a mut Arena,
    /// The parameters at the last outer step.
    pub backup: &'a Arena,
    /// The pseudo-gradients (written).
    pub grads: &'a mut Arena,
    /// Where each parameter starts in a rank.
    pub starts: &'a ParamStarts,
    /// One flag per parameter: computed or left alone.
    pub active: &'a [bool],
}

/// Checks the arenas and flags of a pseudo-gradient (shared by every implementation; the GPU
/// backend's arenas are also [`Chunking::Same`]).
pub(crate) fn check_pseudo_gradient(
    args: &PseudoGradientArgs<'_>,
    chunking: Chunking,
) -> Result<()> {
    let params = &*args.params;
    check_same_layout("pseudo_gradient backup", params, args.backup, chunking)?;
    check_same_layout("pseudo_gradient grads", params, args.grads, chunking)?;
    check_flags("pseudo_gradient", args.active, args.starts)
}

/// DiLoCo's pseudo-gradient over three arenas of one layout, every rank at once, for the
/// parameters flagged in `active`: `grads = round(backup - params)` (one subtraction in the
/// format's precision: float32 for the 32- and 16-bit formats, rounded once to the format;
/// float64 for float64), then `params = backup` (the bits). Inactive parameters are left
/// alone in all three arenas.
///
/// # Errors
/// A `ValueError` when `backup` or `grads` differ from `params` in ranks, length or format, or
/// `active` does not hold one flag per parameter of `starts`; a `RuntimeError` when an arena
/// lives on a GPU device.
pub fn pseudo_gradient_reference(args: PseudoGradientArgs<'_>) -> Result<()> {
    check_pseudo_gradient(&args, Chunking::Any)?;
    let PseudoGradientArgs {
        params,
        backup,
        grads,
        starts,
        active,
    } = args;
    let format = params.format();
    let (ranks, len) = (params.ranks(), params.rank_len());
    let from = host_words(backup)?;
    let to = host_words_mut(grads)?;
    let current = host_words_mut(params)?;
    for rank in 0..ranks {
        for range in starts.active_ranges(active, len) {
            // Parameters start at multiples of 64 elements and run to the next start: whole
            // words in every format.
            let (start, end) = (rank * len + range.start, rank * len + range.end);
            match format {
                StorageFormat::F32 => {
                    let (o, p, g): (&[f32], &[f32], &mut [f32]) = (
                        bytemuck::cast_slice(&from[start..end]),
                        bytemuck::cast_slice(&current[start..end]),
                        bytemuck::cast_slice_mut(&mut to[start..end]),
                    );
                    for ((g, &o), &p) in g.iter_mut().zip(o).zip(p) {
                        *g = o - p;
                    }
                }
                StorageFormat::F64 => {
                    for i in start..end {
                        let d = format.load_f64(from, i) - format.load_f64(current, i);
                        format.store_f64(to, i, d);
                    }
                }
                _ => {
                    for i in start..end {
                        let d = format.load(from, i) - format.load(current, i);
                        format.store(to, i, d);
                    }
                }
            }
            let words = format.word_of(start)..format.word_of(end);
            current[words.clone()].copy_from_slice(&from[words]);
        }
    }
    Ok(())
}
