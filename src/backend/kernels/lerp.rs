//! torch's `lerp_` over two arenas (Streaming DiLoCo's merge of the synced and the local
//! parameters, torchft's `fragment_update_alpha`), the plain-Rust reference. The CPU backend
//! runs it as it is (`backend/cpu/mod.rs`); its GPU twins are the dispatch in
//! `backend/gpu/lerp.rs` and the shader `shaders/lerp.wgsl`.

use super::{
    Arena, Chunking, ParamStarts, check_flags, check_same_layout, fma_f32, host_words,
    host_words_mut,
};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// The arguments of a lerp ([`Backend::lerp`](crate::backend::Backend::lerp),
/// [`lerp_reference`]): `params.lerp_(end, weight)` for the flagged parameters.
pub struct LerpArgs<'a> {
    /// `self` of `self.lerp_(end, weight)`: read, and written with the result.
    pub params: &'a mut Arena,
    /// `end`, an arena of the same layout.
    pub end: &'a Arena,
    /// Where each parameter starts in a rank.
    pub starts: &'a ParamStarts,
    /// One flag per parameter: computed or left alone.
    pub active: &'a [bool],
    /// The weight (finite).
    pub weight: f64,
}

/// torch's two-sided lerp in a format's compute precision: `(coefficient, base is end)`,
/// `(w, false)` for a small weight (`|w| < 0.5`: `self + w·(end - self)`), else `(w - 1,
/// true)` (`end + (w - 1)·(end - self)`), with `w` in float32 for the 32- and 16-bit formats
/// (PyTorch's opmath) and in float64 for float64.
pub(crate) fn lerp_coefficient(format: StorageFormat, weight: f64) -> (f64, bool) {
    let small = weight.abs() < 0.5;
    let coefficient = if format == StorageFormat::F64 {
        if small { weight } else { weight - 1.0 }
    } else {
        let w = weight as f32;
        f64::from(if small { w } else { w - 1.0 })
    };
    (coefficient, !small)
}

/// Checks the arenas, flags and weight of a lerp (shared by every implementation; the GPU
/// backend's arenas are also [`Chunking::Same`]).
pub(crate) fn check_lerp(args: &LerpArgs<'_>, chunking: Chunking) -> Result<()> {
    check_same_layout("lerp end", args.params, args.end, chunking)?;
    check_flags("lerp", args.active, args.starts)?;
    if !args.weight.is_finite() {
        return Err(Error::value(format!(
            "lerp weight must be finite, got {}",
            args.weight
        )));
    }
    Ok(())
}

/// torch's `params.lerp_(end, weight)` over two arenas of one layout, every rank at once, for
/// the parameters flagged in `active`: ATen's two-sided `lerp_vec` (whose scalar remainder the
/// compiler contracts alike), `fma(w, end - params, params)` for `|w| < 0.5`, else `fma(w - 1,
/// end - params, end)`, computed in the format's precision (float32 for the 32- and 16-bit
/// formats, the weight and the difference included) and rounded once to the format. Other
/// parameters are left alone.
///
/// # Errors
/// A `ValueError` when `end` differs from `params` in ranks, length or format, `active` does
/// not hold one flag per parameter of `starts`, or the weight is not finite; a `RuntimeError`
/// when an arena lives on a GPU device.
pub fn lerp_reference(args: LerpArgs<'_>) -> Result<()> {
    check_lerp(&args, Chunking::Any)?;
    let LerpArgs {
        params,
        end,
        starts,
        active,
        weight,
    } = args;
    let format = params.format();
    let (ranks, len) = (params.ranks(), params.rank_len());
    let (coefficient, from_end) = lerp_coefficient(format, weight);
    let end = host_words(end)?;
    let current = host_words_mut(params)?;
    for rank in 0..ranks {
        for range in starts.active_ranges(active, len) {
            for i in rank * len + range.start..rank * len + range.end {
                if format == StorageFormat::F64 {
                    let (s, e) = (format.load_f64(current, i), format.load_f64(end, i));
                    let base = if from_end { e } else { s };
                    format.store_f64(current, i, coefficient.mul_add(e - s, base));
                } else {
                    let (s, e) = (format.load(current, i), format.load(end, i));
                    let base = if from_end { e } else { s };
                    format.store(current, i, fma_f32(coefficient as f32, e - s, base));
                }
            }
        }
    }
    Ok(())
}
