//! Movement between host tensors and arenas: encoding a host tensor into an arena's words,
//! writing it into one rank's row, and reading rows back as tensors. Every copy that depends on
//! the caller's input is checked against the memory budget first.
//!
//! Every crossing goes through here: `Replicas`' setters and getters, optimizer and DiLoCo
//! state (`StateArenas`), loaded state dicts, the step's row images and readback (the GPU
//! path of `sgd_step`, `to_device`), and the MPI world's staging of a device arena's row for a
//! host collective. Two bulk paths stay with their owners because they never materialize a
//! row: the CPU backend's step straight from host tensors (`backend::host_step`) and an
//! arena's whole readback (`Arena::read_all`).

use crate::backend::Arena;
#[cfg(any(feature = "mpi", feature = "nats"))]
use crate::backend::{ArenaStorage, kernels::host_words, kernels::host_words_mut};
use crate::dtype::{DType, StorageFormat};
use crate::error::{Error, Result};
use crate::tensor::{HostData, Tensor};

/// `tensor`'s values packed in `format` (a float64 tensor rounds to float32 in an F32 arena,
/// as the arenas store it). `what` names the copy in a budget error.
pub(crate) fn encode(tensor: &Tensor, format: StorageFormat, what: &str) -> Result<Vec<u32>> {
    let data = tensor
        .host_data()
        .ok_or_else(|| Error::value(format!("{what} must be a host tensor")))?;
    encode_data(data, format, what)
}

/// [`encode`] for host data.
pub(crate) fn encode_data(data: &HostData, format: StorageFormat, what: &str) -> Result<Vec<u32>> {
    let mut words = crate::budget::zeroed(format.words_for(data.len()), what)?;
    data.encode_into(format, &mut words);
    Ok(words)
}

/// One row of an arena in `format` with `rank_len` elements: each `(offset, values)` encoded at
/// its element offset (word aligned), zeros elsewhere, ready for one `Arena::write`. `what`
/// names the image in a budget error.
pub(crate) fn pack_row<'a>(
    format: StorageFormat,
    rank_len: usize,
    items: impl IntoIterator<Item = (usize, &'a HostData)>,
    what: &str,
) -> Result<Vec<u32>> {
    let words = format.words_for(rank_len);
    // An image a previous call gave back (see `recycle`) is already mapped: no page faults.
    let mut row = match crate::recycle::take::<u32>(words) {
        Some(mut row) => {
            row.resize(words, 0);
            row
        }
        None => crate::budget::zeroed(words, what)?,
    };
    for (offset, data) in items {
        data.encode_into(format, &mut row[format.word_of(offset)..]);
    }
    Ok(row)
}

/// Rank `rank`'s elements from `offset` of `arena`, read back as a `dtype` tensor of `shape`.
pub(crate) async fn read_tensor(
    arena: &Arena,
    rank: usize,
    offset: usize,
    shape: &[usize],
    dtype: DType,
) -> Result<Tensor> {
    let words = arena
        .read_range(rank, offset, shape.iter().product())
        .await?;
    decode_tensor(&words, arena.format(), shape, dtype)
}

/// The `dtype` tensor of `shape` from `offset` of rank `rank`'s row inside `words`, a
/// whole-arena readback (`Arena::read_all`) of an arena in `format` with `rank_len` elements
/// per row.
pub(crate) fn tensor_in_rows(
    words: &[u32],
    format: StorageFormat,
    rank_len: usize,
    rank: usize,
    offset: usize,
    shape: &[usize],
    dtype: DType,
) -> Result<Tensor> {
    let start = rank * format.words_for(rank_len) + format.word_of(offset);
    decode_tensor(&words[start..], format, shape, dtype)
}

/// The `dtype` tensor of `shape` stored in `format` at the start of `words`.
fn decode_tensor(
    words: &[u32],
    format: StorageFormat,
    shape: &[usize],
    dtype: DType,
) -> Result<Tensor> {
    let numel = shape.iter().product();
    Tensor::new(shape, HostData::decode(dtype, format, words, numel))
}

/// Runs `work` on the words of row 0 of `arena` covering elements `span` (word aligned): in
/// place on a host arena (the whole row; `work` gets element index 0 for its first word), on a
/// staged copy of a device arena that is written back afterwards (`work` gets `span.start`).
#[cfg(any(feature = "mpi", feature = "nats"))]
pub(crate) fn with_row_words(
    arena: &mut Arena,
    span: std::ops::Range<usize>,
    work: impl FnOnce(&mut [u32], usize) -> Result<()>,
) -> Result<()> {
    let format = arena.format();
    if matches!(arena.storage, ArenaStorage::Host(_)) {
        let rank_words = format.words_for(arena.rank_len());
        return work(&mut host_words_mut(arena)?[..rank_words], 0);
    }
    let mut words = readback(arena.read_range(0, span.start, span.len()))?;
    work(&mut words, span.start)?;
    arena.write(0, span.start, &words)
}

/// The words of row `rank`, elements `offset..offset + len` (word aligned), of any arena,
/// blocking on a device readback.
#[cfg(any(feature = "mpi", feature = "nats"))]
pub(crate) fn read_row_words(
    arena: &Arena,
    rank: usize,
    offset: usize,
    len: usize,
) -> Result<Vec<u32>> {
    if matches!(arena.storage, ArenaStorage::Host(_)) {
        arena.check_range(rank, offset, len)?;
        let format = arena.format();
        let start = rank * format.words_for(arena.rank_len()) + format.word_of(offset);
        return Ok(host_words(arena)?[start..start + format.words_for(len)].to_vec());
    }
    readback(arena.read_range(rank, offset, len))
}

/// Waits for a device readback: natively on the calling thread; in wasm, where a thread
/// cannot wait for the GPU, only a readback that is ready at once (a host arena's).
#[cfg(any(feature = "mpi", feature = "nats"))]
fn readback(read: impl std::future::Future<Output = Result<Vec<u32>>>) -> Result<Vec<u32>> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        pollster::block_on(read)
    }
    #[cfg(target_arch = "wasm32")]
    {
        let mut read = std::pin::pin!(read);
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        match read.as_mut().poll(&mut context) {
            std::task::Poll::Ready(words) => words,
            std::task::Poll::Pending => Err(crate::error::Error::runtime(
                "a rank of a networked world in wasm cannot wait for a GPU readback: its arenas must be on the CPU backend",
            )),
        }
    }
}
