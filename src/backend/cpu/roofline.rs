//! The same-traffic roofline of a host kernel: the loads and stores a kernel makes per element,
//! on all of the backend's threads, with no arithmetic. A kernel's throughput against this
//! figure (measured in the same run) says how close it comes to what the memory system allows
//! for its access pattern, which a plain copy (one read, one write per element) does not.

use std::hint::black_box;

use super::host_words::HostWords;
use super::parts::{PartWork, run_best, split_words};
use super::threads::run_parts;
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// Scratch arrays laid out as the CPU backend lays out arenas (staggered, huge pages), on
/// which [`same_traffic`] is timed.
pub struct SameTraffic {
    threads: usize,
    read: Vec<HostWords>,
    update: Vec<HostWords>,
    write: Vec<HostWords>,
}

impl SameTraffic {
    /// `read` arrays loaded, `update` arrays loaded and stored, `write` arrays stored, each of
    /// `words` words (touched once here, so timing excludes first-touch faults), streamed on
    /// `threads` threads.
    ///
    /// # Errors
    /// A `RuntimeError` when the arrays do not fit the memory budget ([`crate::budget`]).
    pub fn new(
        threads: usize,
        read: usize,
        update: usize,
        write: usize,
        words: usize,
    ) -> Result<Self> {
        let arrays = |count: usize, fill: u32| -> Result<Vec<HostWords>> {
            (0..count)
                .map(|k| {
                    let what = format!("a roofline array of {words} words");
                    let mut w = HostWords::zeroed(words, &what)?;
                    w.fill(fill + k as u32);
                    Ok(w)
                })
                .collect()
        };
        Ok(SameTraffic {
            threads,
            read: arrays(read, 1)?,
            update: arrays(update, 101)?,
            write: arrays(write, 201)?,
        })
    }

    /// One pass of [`same_traffic`] over the arrays.
    ///
    /// # Errors
    /// A `ValueError` when no array was asked for.
    pub fn run(&mut self) -> Result<()> {
        let read: Vec<&[u32]> = self.read.iter().map(|w| &w[..]).collect();
        let mut update: Vec<&mut [u32]> = self.update.iter_mut().map(|w| &mut w[..]).collect();
        let mut write: Vec<&mut [u32]> = self.write.iter_mut().map(|w| &mut w[..]).collect();
        same_traffic(self.threads, &read, &mut update, &mut write)
    }
}

/// One element range of every array.
struct Part<'a> {
    read: Vec<&'a [u32]>,
    update: Vec<&'a mut [u32]>,
    write: Vec<&'a mut [u32]>,
}

/// Streams over equal-length word arrays: every word of `read` is loaded, every word of
/// `update` is loaded and stored back unchanged, every word of `write` is stored (zeros; it is
/// not loaded), split into `threads` equal ranges. A mask that is zero at run time but unknown
/// to the compiler keeps every load and store.
///
/// # Errors
/// A `ValueError` when the arrays differ in length or none is given.
pub fn same_traffic(
    threads: usize,
    read: &[&[u32]],
    update: &mut [&mut [u32]],
    write: &mut [&mut [u32]],
) -> Result<()> {
    let len = read
        .iter()
        .map(|a| a.len())
        .chain(update.iter().map(|a| a.len()))
        .chain(write.iter().map(|a| a.len()))
        .next()
        .ok_or_else(|| Error::value("same_traffic: no arrays"))?;
    let lengths_agree = read.iter().all(|a| a.len() == len)
        && update.iter().all(|a| a.len() == len)
        && write.iter().all(|a| a.len() == len);
    if !lengths_agree {
        return Err(Error::value("same_traffic: the arrays differ in length"));
    }
    let parts = threads.clamp(1, len.div_ceil(4096).max(1));
    let bounds: Vec<usize> = (0..=parts).map(|p| len * p / parts).collect();
    let mut work: Vec<Part<'_>> = (0..parts)
        .map(|_| Part {
            read: Vec::new(),
            update: Vec::new(),
            write: Vec::new(),
        })
        .collect();
    for a in read {
        for (k, part) in work.iter_mut().enumerate() {
            part.read.push(&a[bounds[k]..bounds[k + 1]]);
        }
    }
    for a in update.iter_mut() {
        for (k, head) in split_words(a, StorageFormat::F32, &bounds)
            .into_iter()
            .enumerate()
        {
            work[k].update.push(head);
        }
    }
    for a in write.iter_mut() {
        for (k, head) in split_words(a, StorageFormat::F32, &bounds)
            .into_iter()
            .enumerate()
        {
            work[k].write.push(head);
        }
    }
    let mask = black_box(0u32);
    run_parts(work, |part| run_best(Stream { part, mask }));
    Ok(())
}

/// One part's stream, compiled for the best vector extension ([`run_best`]).
struct Stream<'a> {
    part: Part<'a>,
    mask: u32,
}

impl PartWork for Stream<'_> {
    #[inline(always)]
    fn run(mut self) {
        stream(&mut self.part, self.mask);
    }
}

#[inline(always)]
fn stream(part: &mut Part<'_>, mask: u32) {
    const BLOCK: usize = 1024;
    let len = part
        .read
        .first()
        .map(|a| a.len())
        .or_else(|| part.update.first().map(|a| a.len()))
        .or_else(|| part.write.first().map(|a| a.len()))
        .unwrap_or(0);
    let mut acc = [0u32; BLOCK];
    let mut at = 0;
    while at < len {
        let n = BLOCK.min(len - at);
        let acc = &mut acc[..n];
        acc.fill(0);
        for a in &part.read {
            for (x, &w) in acc.iter_mut().zip(&a[at..at + n]) {
                *x |= w;
            }
        }
        for a in part.update.iter_mut() {
            for (w, &x) in a[at..at + n].iter_mut().zip(acc.iter()) {
                *w ^= x & mask;
            }
        }
        for a in part.write.iter_mut() {
            for (w, &x) in a[at..at + n].iter_mut().zip(acc.iter()) {
                // Zero, which the compiler cannot know: the store depends on every load.
                *w = x & mask;
            }
        }
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_every_array_and_keeps_the_updated_ones() {
        for threads in [1, 2, 3] {
            let read = vec![5u32; 10_000];
            let mut update = (0..10_000u32).collect::<Vec<_>>();
            let mut write = vec![7u32; 10_000];
            same_traffic(threads, &[&read], &mut [&mut update], &mut [&mut write]).unwrap();
            assert!(update.iter().enumerate().all(|(i, &w)| w == i as u32));
            assert!(write.iter().all(|&w| w == 0), "written arrays are stored");
        }
        let mut scratch = SameTraffic::new(2, 2, 1, 1, 4096).unwrap();
        scratch.run().unwrap();
    }

    #[test]
    fn refuses_arrays_of_different_lengths_or_none() {
        let (a, b) = (vec![0u32; 4], vec![0u32; 5]);
        assert!(same_traffic(1, &[&a, &b], &mut [], &mut []).is_err());
        assert!(same_traffic(1, &[], &mut [], &mut []).is_err());
    }
}
