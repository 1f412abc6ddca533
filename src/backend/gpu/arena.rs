//! A replica arena in device memory: one buffer per chunk, each laid out `[rank][chunk
//! elements]` and no larger than one storage binding.
//!
//! Two ways in and out:
//!
//! * **Mapped** (native, on adapters whose device memory *is* host memory: software
//!   rasterizers such as lavapipe and SwiftShader, with `MAPPABLE_PRIMARY_BUFFERS`): the chunk
//!   buffers are storage buffers that can also be mapped, and uploads and readbacks map them
//!   directly — one host copy each way, no staging buffer, no device-side copy.
//! * **Staged** (everywhere else, and always in browsers, where WebGPU never offers that
//!   feature): uploads go through `Queue::write_buffer`, readbacks through a copy into a
//!   `MAP_READ` staging buffer.
//!
//! A mapped readback holds the chunk mapped for the duration of one host copy; a submission
//! that uses the same arena from another thread during that window fails validation (as it
//! would with any mapped buffer). Writes need `&mut Arena`, so they cannot race that way.

use std::sync::{Arc, Mutex};

use super::shared::GpuShared;
use crate::backend::oneshot;
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

pub(crate) struct GpuChunk {
    pub(crate) buffer: wgpu::Buffer,
    /// Elements per rank in this chunk.
    pub(crate) len: usize,
    /// Words per rank in this chunk.
    pub(crate) rank_words: usize,
}

pub(crate) struct GpuArena {
    pub(crate) shared: Arc<GpuShared>,
    pub(crate) chunks: Vec<GpuChunk>,
    /// Words per rank per full chunk (every chunk but possibly the last).
    chunk_words: usize,
    ranks: usize,
    rank_words: usize,
    /// The chunk buffers are mappable and transfers map them directly (never on wasm32).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    mapped: bool,
    /// Serializes this arena's mapped readbacks (two threads may read one arena at once; a
    /// buffer can only be mapped once at a time).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    map_lock: Mutex<()>,
}

/// A dropped arena's buffers are kept for the next arenas of their size (`super::spare`),
/// unless the device is lost.
impl Drop for GpuArena {
    fn drop(&mut self) {
        if self.shared.lost().is_some() {
            return;
        }
        for chunk in self.chunks.drain(..) {
            self.shared.spare.give(chunk.buffer);
        }
    }
}

/// Whether arenas on this device should be mappable storage buffers: only natively, with the
/// feature, and on a CPU-side device, where every memory type is ordinary cached host memory
/// (on a discrete GPU mappable storage would live across the bus; on some integrated GPUs
/// mappable memory is uncached, which makes host reads slow).
fn use_mapped(shared: &GpuShared) -> bool {
    if cfg!(target_arch = "wasm32") {
        return false;
    }
    shared
        .device
        .features()
        .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
        && shared.device.adapter_info().device_type == wgpu::DeviceType::Cpu
}

/// Byte range to map so that it starts on a `MAP_ALIGNMENT` boundary and covers
/// `[offset, offset + len)` (both multiples of 4): `(start, end, offset - start)`.
#[cfg(not(target_arch = "wasm32"))]
fn map_range(offset: u64, len: u64) -> (u64, u64, usize) {
    let start = offset / wgpu::MAP_ALIGNMENT * wgpu::MAP_ALIGNMENT;
    (start, offset + len, (offset - start) as usize)
}

/// One run of words in one chunk buffer: `(buffer, first word, words)`.
#[cfg(all(not(target_arch = "wasm32"), feature = "mpi"))]
type Run<'a> = (&'a wgpu::Buffer, usize, usize);

/// Appends the little-endian words in `bytes` (a multiple of 4 long) to `out`.
fn extend_words(out: &mut Vec<u32>, bytes: &[u8]) {
    match bytemuck::try_cast_slice::<u8, u32>(bytes) {
        Ok(words) => out.extend_from_slice(words),
        Err(_) => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
    }
}

impl GpuArena {
    pub(crate) fn new(
        shared: &Arc<GpuShared>,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
        clear: bool,
    ) -> Result<GpuArena> {
        if chunk_len == 0 || !chunk_len.is_multiple_of(2) || !rank_len.is_multiple_of(2) {
            return Err(Error::value(format!(
                "arena lengths must be even and positive: rank_len {rank_len}, chunk_len {chunk_len}"
            )));
        }
        let mapped = use_mapped(shared);
        let mut usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        if mapped {
            usage |= wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE;
        }
        let mut chunks = Vec::new();
        // Kept buffers taken for this arena, cleared below in one submission (unless the caller
        // writes every element first: `clear` false).
        let mut reused: Vec<wgpu::Buffer> = Vec::new();
        let mut start = 0;
        while start < rank_len {
            let len = chunk_len.min(rank_len - start);
            let rank_words = format.words_for(len);
            let bytes = ranks
                .checked_mul(rank_words)
                .and_then(|w| w.checked_mul(4))
                .ok_or_else(|| Error::value("arena size overflows"))?
                as u64;
            let size = bytes.max(4);
            let buffer = match shared.spare.take(size) {
                Some(buffer) => {
                    reused.push(buffer.clone());
                    buffer
                }
                None => {
                    let buffer = shared.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("distopt arena chunk"),
                        size,
                        usage,
                        mapped_at_creation: false,
                    });
                    shared.take_uncaptured()?;
                    buffer
                }
            };
            chunks.push(GpuChunk {
                buffer,
                len,
                rank_words,
            });
            start += len;
        }
        if clear && !reused.is_empty() {
            // A new arena is zeros: a kept buffer holds its last arena's values.
            let mut encoder = shared.device.create_command_encoder(&Default::default());
            for buffer in &reused {
                encoder.clear_buffer(buffer, 0, None);
            }
            shared.queue.submit([encoder.finish()]);
            shared.take_uncaptured()?;
        }
        Ok(GpuArena {
            shared: shared.clone(),
            chunks,
            chunk_words: format.words_for(chunk_len),
            ranks,
            rank_words: format.words_for(rank_len),
            mapped,
            map_lock: Mutex::new(()),
        })
    }

    /// Where word `word` of rank `rank` lives: the chunk buffer, the word offset inside it, and
    /// how many words of this rank follow in the same chunk.
    pub(crate) fn locate(&self, rank: usize, word: usize) -> (&wgpu::Buffer, usize, usize) {
        let chunk = &self.chunks[word / self.chunk_words];
        let local = word % self.chunk_words;
        (
            &chunk.buffer,
            rank * chunk.rank_words + local,
            chunk.rank_words - local,
        )
    }

    /// The `(buffer, word offset, words)` runs that hold `words` words of rank `rank` from
    /// word `first_word`, one per chunk touched.
    pub(crate) fn runs(
        &self,
        rank: usize,
        first_word: usize,
        words: usize,
    ) -> Vec<(&wgpu::Buffer, usize, usize)> {
        let mut runs = Vec::new();
        let mut done = 0;
        while done < words {
            let (buffer, offset, left) = self.locate(rank, first_word + done);
            let run = left.min(words - done);
            runs.push((buffer, offset, run));
            done += run;
        }
        runs
    }

    pub(crate) fn write(&self, rank: usize, first_word: usize, words: &[u32]) {
        if words.is_empty() {
            return;
        }
        let runs = self.runs(rank, first_word, words.len());
        #[cfg(not(target_arch = "wasm32"))]
        if self.mapped && self.write_mapped(&runs, words) {
            return;
        }
        let mut done = 0;
        for (buffer, offset, run) in runs {
            self.shared.queue.write_buffer(
                buffer,
                offset as u64 * 4,
                bytemuck::cast_slice(&words[done..done + run]),
            );
            done += run;
        }
    }

    /// Maps every run's buffer range, resolving the mappings with one blocking poll; `None`
    /// (with nothing left mapped) when any mapping fails.
    #[cfg(not(target_arch = "wasm32"))]
    fn map_runs(
        &self,
        runs: &[(&wgpu::Buffer, usize, usize)],
        mode: wgpu::MapMode,
    ) -> Option<Vec<(u64, u64, usize)>> {
        let ranges: Vec<(u64, u64, usize)> = runs
            .iter()
            .map(|&(_, offset, words)| map_range(offset as u64 * 4, words as u64 * 4))
            .collect();
        let results: Arc<Mutex<Vec<Option<bool>>>> = Arc::new(Mutex::new(vec![None; runs.len()]));
        for (k, (&(buffer, _, _), &(start, end, _))) in runs.iter().zip(&ranges).enumerate() {
            let results = results.clone();
            buffer.map_async(mode, start..end, move |result| {
                let mut slots = results.lock().unwrap_or_else(|e| e.into_inner());
                slots[k] = Some(result.is_ok());
            });
        }
        let polled = self.shared.poll_wait().is_ok();
        let slots = results.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if polled && slots.iter().all(|s| *s == Some(true)) {
            return Some(ranges);
        }
        // Undo whatever did map (or is still pending: unmap cancels a pending mapping).
        for (&(buffer, _, _), slot) in runs.iter().zip(&slots) {
            if *slot != Some(false) {
                buffer.unmap();
            }
        }
        None
    }

    /// Writes `words` through mapped ranges of the chunk buffers; false (having written
    /// nothing) when the buffers could not be mapped.
    #[cfg(not(target_arch = "wasm32"))]
    fn write_mapped(&self, runs: &[(&wgpu::Buffer, usize, usize)], words: &[u32]) -> bool {
        let Some(ranges) = self.map_runs(runs, wgpu::MapMode::Write) else {
            return false;
        };
        let mut done = 0;
        let mut ok = true;
        for (&(buffer, _, run), &(start, end, skip)) in runs.iter().zip(&ranges) {
            match buffer.get_mapped_range_mut(start..end) {
                Ok(mut view) => view
                    .slice(skip..skip + run * 4)
                    .copy_from_slice(bytemuck::cast_slice(&words[done..done + run])),
                Err(_) => ok = false,
            }
            buffer.unmap();
            done += run;
        }
        if !ok {
            // A run could not be viewed (not expected after a successful mapping): write
            // everything again the portable way.
            let mut done = 0;
            for &(buffer, offset, run) in runs {
                self.shared.queue.write_buffer(
                    buffer,
                    offset as u64 * 4,
                    bytemuck::cast_slice(&words[done..done + run]),
                );
                done += run;
            }
        }
        true
    }

    /// Reads the pieces through mapped ranges of the chunk buffers (each buffer mapped once,
    /// over the span its pieces cover); `None` when the buffers could not be mapped (the
    /// caller then reads through a staging buffer).
    #[cfg(not(target_arch = "wasm32"))]
    fn read_mapped(&self, pieces: &[(&wgpu::Buffer, usize, usize)]) -> Option<Vec<u32>> {
        let _guard = self.map_lock.lock().unwrap_or_else(|e| e.into_inner());
        // (buffer, first word, words) per distinct buffer.
        let mut spans: Vec<(&wgpu::Buffer, usize, usize)> = Vec::new();
        for &(buffer, offset, words) in pieces {
            match spans.iter_mut().find(|s| s.0 == buffer) {
                Some(span) => {
                    let end = (span.1 + span.2).max(offset + words);
                    span.1 = span.1.min(offset);
                    span.2 = end - span.1;
                }
                None => spans.push((buffer, offset, words)),
            }
        }
        let ranges = self.map_runs(&spans, wgpu::MapMode::Read)?;
        let views: Vec<Option<wgpu::BufferView>> = spans
            .iter()
            .zip(&ranges)
            .map(|(span, &(start, end, _))| span.0.get_mapped_range(start..end).ok())
            .collect();
        let mut out = None;
        if views.iter().all(Option::is_some) {
            let total: usize = pieces.iter().map(|p| p.2).sum();
            let mut words = crate::recycle::with_capacity(total);
            for &(buffer, offset, len) in pieces {
                let k = spans.iter().position(|s| s.0 == buffer).unwrap_or(0);
                if let (Some(view), Some(&(start, _, _))) = (&views[k], ranges.get(k)) {
                    let from = (offset as u64 * 4 - start) as usize;
                    extend_words(&mut words, &view[from..from + len * 4]);
                }
            }
            out = Some(words);
        }
        drop(views);
        for span in &spans {
            span.0.unmap();
        }
        out
    }

    /// The one mapped run holding rank `rank`'s words `first_word..first_word + words`, with
    /// this arena's map lock held; `None` when the arena is not mapped or the words span two
    /// chunk buffers.
    #[cfg(all(not(target_arch = "wasm32"), feature = "mpi"))]
    fn single_run(
        &self,
        rank: usize,
        first_word: usize,
        words: usize,
    ) -> Option<(Run<'_>, std::sync::MutexGuard<'_, ()>)> {
        if !self.mapped || words == 0 {
            return None;
        }
        let runs = self.runs(rank, first_word, words);
        let [run] = runs[..] else {
            return None;
        };
        Some((run, self.map_lock.lock().unwrap_or_else(|e| e.into_inner())))
    }

    /// Runs `work` on rank `rank`'s words `first_word..first_word + words`, mapped in place
    /// for reading and writing: `work` finds the buffer's contents there and what it leaves is
    /// the buffer's new contents. No copy is made. `None` (without calling `work`) when the
    /// arena is not mapped, the words span two chunk buffers, or the mapping fails; the caller
    /// then reads and writes a copy (`read_range`, `write`).
    ///
    /// A write mapping is used for both: wgpu maps the buffer's own memory and zeroes only
    /// what was never initialized, and arenas are mapped only on CPU-side adapters
    /// (`use_mapped`), whose memory is coherent host memory, so the mapping shows the
    /// current contents (wgpu invalidates caches only for read mappings, which coherent
    /// memory does not need).
    #[cfg(all(not(target_arch = "wasm32"), feature = "mpi"))]
    pub(crate) fn update_in_place<R>(
        &self,
        rank: usize,
        first_word: usize,
        words: usize,
        work: impl FnOnce(&mut [u32]) -> R,
    ) -> Option<R> {
        let (run, _guard) = self.single_run(rank, first_word, words)?;
        let ranges = self.map_runs(&[run], wgpu::MapMode::Write)?;
        let (start, end, skip) = ranges[0];
        let out = run
            .0
            .get_mapped_range_mut(start..end)
            .ok()
            .and_then(|mut view| {
                let mut bytes = view.slice(skip..skip + words * 4);
                let ptr = bytes.as_raw_element_ptr().as_ptr();
                if !ptr.cast::<u32>().is_aligned() {
                    return None;
                }
                // SAFETY: `ptr` points at `words * 4` bytes of this buffer mapped for writing,
                // 4-aligned (checked), that nothing else accesses while `view` lives (the device
                // cannot use a mapped buffer; the map lock keeps other mappings out; `work` gets
                // the only reference, for no longer than `view`). Arenas are mapped only on
                // CPU-side adapters (`use_mapped`), whose mapped memory is ordinary cached host
                // memory, initialized by wgpu (zeroed on creation), so reading it through `&mut`
                // (which `WriteOnly` exists to forbid on write-combining memory) is sound here.
                let words = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u32>(), words) };
                Some(work(words))
            });
        run.0.unmap();
        out
    }

    /// Reads the listed `(buffer, word offset, words)` pieces, in order, into one vector.
    async fn read_pieces(&self, pieces: &[(&wgpu::Buffer, usize, usize)]) -> Result<Vec<u32>> {
        let total: usize = pieces.iter().map(|p| p.2).sum();
        if total == 0 {
            return Ok(Vec::new());
        }
        #[cfg(not(target_arch = "wasm32"))]
        if self.mapped {
            if let Some(words) = self.read_mapped(pieces) {
                self.shared.take_uncaptured()?;
                return Ok(words);
            }
        }
        self.read_staged(pieces, total).await
    }

    /// Copies the pieces into one staging buffer and reads it back.
    async fn read_staged(
        &self,
        pieces: &[(&wgpu::Buffer, usize, usize)],
        total: usize,
    ) -> Result<Vec<u32>> {
        // A lost device would never map the staging buffer: say so instead of waiting.
        if let Some(reason) = self.shared.lost() {
            return Err(super::shared::device_lost_error(&reason));
        }
        let device = &self.shared.device;
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("distopt readback"),
            size: total as u64 * 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = device.create_command_encoder(&Default::default());
        let mut at = 0u64;
        for &(buffer, offset, words) in pieces {
            encoder.copy_buffer_to_buffer(
                buffer,
                offset as u64 * 4,
                &staging,
                at,
                Some(words as u64 * 4),
            );
            at += words as u64 * 4;
        }
        self.shared.queue.submit([encoder.finish()]);
        let (sender, receiver) = oneshot::channel();
        staging
            .slice(..)
            .map_async(wgpu::MapMode::Read, move |result| sender.send(result));
        self.shared.poll_wait()?;
        receiver
            .await
            .map_err(|e| Error::runtime(format!("reading the GPU buffer failed: {e}")))?;
        self.shared.take_uncaptured()?;
        let view = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| Error::runtime(format!("reading the GPU buffer failed: {e}")))?;
        let mut words = crate::recycle::with_capacity(total);
        extend_words(&mut words, &view);
        drop(view);
        staging.unmap();
        Ok(words)
    }

    /// `words` words of rank `rank` starting at word `first_word`.
    pub(crate) async fn read_range(
        &self,
        rank: usize,
        first_word: usize,
        words: usize,
    ) -> Result<Vec<u32>> {
        let pieces = self.runs(rank, first_word, words);
        self.read_pieces(&pieces).await
    }

    /// Every rank, rank-major (`[rank][rank_words]`).
    pub(crate) async fn read_all(&self) -> Result<Vec<u32>> {
        let mut pieces = Vec::new();
        for rank in 0..self.ranks {
            for chunk in &self.chunks {
                pieces.push((&chunk.buffer, rank * chunk.rank_words, chunk.rank_words));
            }
        }
        let words = self.read_pieces(&pieces).await?;
        debug_assert_eq!(words.len(), self.ranks * self.rank_words);
        Ok(words)
    }
}
