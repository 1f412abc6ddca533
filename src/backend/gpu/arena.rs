//! A replica arena in device memory: one buffer per chunk, each laid out `[rank][chunk
//! elements]` and no larger than one storage binding.

use std::sync::Arc;

use super::GpuShared;
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
}

impl GpuArena {
    pub(crate) fn new(
        shared: &Arc<GpuShared>,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
    ) -> Result<GpuArena> {
        if chunk_len == 0 || !chunk_len.is_multiple_of(2) || !rank_len.is_multiple_of(2) {
            return Err(Error::value(format!(
                "arena lengths must be even and positive: rank_len {rank_len}, chunk_len {chunk_len}"
            )));
        }
        let mut chunks = Vec::new();
        let mut start = 0;
        while start < rank_len {
            let len = chunk_len.min(rank_len - start);
            let rank_words = format.words_for(len);
            let bytes = (ranks * rank_words * 4) as u64;
            let buffer = shared.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("distopt arena chunk"),
                size: bytes.max(4),
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            shared.take_uncaptured()?;
            chunks.push(GpuChunk {
                buffer,
                len,
                rank_words,
            });
            start += len;
        }
        Ok(GpuArena {
            shared: shared.clone(),
            chunks,
            chunk_words: format.words_for(chunk_len),
            ranks,
            rank_words: format.words_for(rank_len),
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

    pub(crate) fn write(&self, rank: usize, first_word: usize, words: &[u32]) {
        let mut done = 0;
        while done < words.len() {
            let (buffer, offset, left) = self.locate(rank, first_word + done);
            let run = left.min(words.len() - done);
            self.shared.queue.write_buffer(
                buffer,
                offset as u64 * 4,
                bytemuck::cast_slice(&words[done..done + run]),
            );
            done += run;
        }
    }

    /// Copies the listed `(buffer, word offset, words)` pieces into one staging buffer and
    /// reads it back.
    async fn read_pieces(&self, pieces: &[(&wgpu::Buffer, usize, usize)]) -> Result<Vec<u32>> {
        let total: usize = pieces.iter().map(|p| p.2).sum();
        if total == 0 {
            return Ok(Vec::new());
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
        let words = bytemuck::cast_slice::<u8, u32>(&view).to_vec();
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
        let mut pieces = Vec::new();
        let mut done = 0;
        while done < words {
            let (buffer, offset, left) = self.locate(rank, first_word + done);
            let run = left.min(words - done);
            pieces.push((buffer, offset, run));
            done += run;
        }
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
