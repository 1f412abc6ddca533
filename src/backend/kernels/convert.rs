//! Storage-format conversion, the plain-Rust reference. The CPU backend runs it as it is
//! (`backend/cpu/mod.rs`); its GPU twins are the dispatch in `backend/gpu/convert.rs` and the
//! shader `shaders/convert.wgsl`.

use super::{Arena, Chunking, ParamStarts, check_flags, host_words, host_words_mut};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// The arguments of a conversion ([`Backend::convert`](crate::backend::Backend::convert),
/// [`convert_reference`]).
pub struct ConvertArgs<'a> {
    /// The arena read.
    pub src: &'a Arena,
    /// An arena of the same ranks and layout in another storage format (written).
    pub dst: &'a mut Arena,
    /// Where each parameter starts in a rank.
    pub starts: &'a ParamStarts,
    /// One flag per parameter: converted or left alone.
    pub active: &'a [bool],
}

/// Converts the parameters flagged in `active` of every rank of `src` into `dst`, an arena of
/// the same ranks and layout in another storage format: `dst = round(src)`, each value decoded
/// exactly and rounded once to `dst`'s format (round to nearest even, overflow to ±inf, as c10
/// does; float64 → 16-bit rounds once through [`StorageFormat::store_f64`]). Widening is exact.
/// DiLoCo's compressed pseudo-gradients go through it to the wire format and back. Inactive
/// parameters are left alone. A `ValueError` for arenas of different ranks or lengths.
///
/// # Errors
/// A `ValueError` when the arenas differ in ranks or length or `active` does not hold one
/// flag per parameter of `starts`; a `RuntimeError` when either arena lives on a GPU device.
pub fn convert_reference(args: ConvertArgs<'_>) -> Result<()> {
    check_convert(&args, Chunking::Any)?;
    let ConvertArgs {
        src,
        dst,
        starts,
        active,
    } = args;
    let (from_format, to_format) = (src.format(), dst.format());
    let (ranks, len) = (src.ranks(), src.rank_len());
    let (from_words, to_words) = (from_format.words_for(len), to_format.words_for(len));
    let from = host_words(src)?;
    let to = host_words_mut(dst)?;
    let wide = from_format == StorageFormat::F64 || to_format == StorageFormat::F64;
    for rank in 0..ranks {
        let (from, to) = (
            &from[rank * from_words..(rank + 1) * from_words],
            &mut to[rank * to_words..(rank + 1) * to_words],
        );
        for range in starts.active_ranges(active, len) {
            for i in range {
                if wide {
                    to_format.store_f64(to, i, from_format.load_f64(from, i));
                } else {
                    to_format.store(to, i, from_format.load(from, i));
                }
            }
        }
    }
    Ok(())
}

/// Checks the arenas and flags of a conversion (shared by every implementation; the GPU
/// backend's arenas are also [`Chunking::Same`]).
pub(crate) fn check_convert(args: &ConvertArgs<'_>, chunking: Chunking) -> Result<()> {
    let (src, dst) = (args.src, &*args.dst);
    if src.ranks() != dst.ranks()
        || src.rank_len() != dst.rank_len()
        || (chunking == Chunking::Same && src.chunk_len() != dst.chunk_len())
    {
        return Err(Error::value(format!(
            "convert: arenas do not match ({src:?} vs {dst:?})"
        )));
    }
    check_flags("convert", args.active, args.starts)
}
