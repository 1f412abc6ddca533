//! Benchmark workloads, defined once for every front end that times them: the command line
//! (`distopt bench step`) and the JS bindings (`StepBench`, the browser bench page) time the
//! same work on the same data.

use crate::backend::{Arena, Backend, layout_params};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::replicas::Values;
use crate::rng::SplitMix64;
use crate::tensor::{HostData, Tensor};

/// The learning rate of timed steps: small, so that repeated steps keep the values finite.
pub const LEARNING_RATE: f32 = 1e-3;

/// The random stream every benchmark draws its data from.
const STREAM: u64 = 0xbe7c;

/// `n` deterministic values in `[-1, 1)` for `seed`. The parameters of a benchmark use seed 0
/// and rank `r`'s gradients seed `r + 1`. The vector is checked against the memory budget.
///
/// # Errors
/// A `RuntimeError` when `n` values do not fit the memory budget or the allocator refuses them.
pub fn values(seed: u64, n: usize) -> Result<Vec<f64>> {
    let what = format!("{n} benchmark values");
    crate::budget::check(n.saturating_mul(8), &what)?;
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| Error::runtime(format!("out of memory: {what}")))?;
    let mut rng = SplitMix64::new(seed, STREAM);
    out.extend((0..n).map(|_| rng.signed_unit()));
    Ok(out)
}

/// [`values`] as a one-dimensional host tensor of `dtype` (each value rounded to it).
///
/// # Errors
/// As [`values`].
pub fn tensor(dtype: DType, seed: u64, n: usize) -> Result<Tensor> {
    Tensor::new(&[n], HostData::from_f64(dtype, &values(seed, n)?))
}

/// Writes [`values`]`(seed, …)` into every row in `ranks` of `arena` (one parameter of
/// `elements` elements at offset 0).
///
/// # Errors
/// A `ValueError` when a rank of `ranks` is outside the arena or `elements` exceed its rows; a
/// `RuntimeError` when the values or their packed words do not fit the memory budget.
pub fn fill_rows(
    arena: &mut Arena,
    dtype: DType,
    elements: usize,
    seed_of_rank: impl Fn(usize) -> u64,
    ranks: std::ops::Range<usize>,
) -> Result<()> {
    let mut last: Option<(u64, Vec<u32>)> = None;
    for rank in ranks {
        let seed = seed_of_rank(rank);
        if last.as_ref().is_none_or(|(s, _)| *s != seed) {
            let data = HostData::from_f64(dtype, &values(seed, elements)?);
            last = Some((
                seed,
                crate::transfer::encode_data(&data, arena.format(), "benchmark rows")?,
            ));
        }
        let (_, words) = last.as_ref().expect("set above");
        arena.write(rank, 0, words)?;
    }
    Ok(())
}

/// The data-parallel SGD step resident on a backend: R ranks' parameters (seed 0, every rank
/// alike) and gradients (rank `r`: seed `r + 1`) of one parameter of N elements, and the means'
/// arena. Each [`ResidentStep::step`] is one fused dispatch (the mean of the gradients and the
/// SGD update of every rank); it moves [`ResidentStep::bytes`] bytes.
#[derive(Debug)]
pub struct ResidentStep {
    params: Arena,
    grads: Arena,
    means: Arena,
    ranks: usize,
    elements: usize,
    dtype: DType,
}

impl ResidentStep {
    /// Allocates and fills the arenas on `backend`. A `ValueError` for no rank or element or
    /// for float64 (the step computes float64 parameters in float32 storage: time float32); a
    /// `RuntimeError` when the arenas and their staging exceed the memory budget.
    ///
    /// # Errors
    /// A `ValueError` when `ranks` or `elements` is 0 or `dtype` is float64; a `RuntimeError` when
    /// the sizes overflow, the arenas and their staging exceed the memory budget, or the backend
    /// cannot create them (a GPU error, a lost device).
    pub fn new(
        backend: &dyn Backend,
        ranks: usize,
        elements: usize,
        dtype: DType,
    ) -> Result<ResidentStep> {
        if ranks == 0 || elements == 0 {
            return Err(Error::value(
                "the step benchmark needs at least one rank and one element",
            ));
        }
        if dtype == DType::Float64 {
            return Err(Error::value(
                "the step benchmark times float32, float16 or bfloat16 (the step computes \
                 float64 parameters in float32 storage)",
            ));
        }
        let too_large = || {
            Error::runtime(format!(
                "not enough memory for the step benchmark with R = {ranks}, N = {elements}: \
                 the sizes overflow the address space"
            ))
        };
        let (_, rank_len) = layout_params(&[elements]);
        let format = dtype.storage();
        // Three arenas ((2R + 1) rows), and one row's values and words while they are filled
        // (a GPU backend keeps the arenas on the device but stages them through the host).
        let arenas = (2 * ranks as u128 + 1) * rank_len as u128 * format.element_bytes() as u128;
        let staging = elements as u128 * 8 + rank_len as u128 * 4;
        let needed = usize::try_from(arenas + staging).map_err(|_| too_large())?;
        crate::budget::check(
            needed,
            &format!("the step benchmark with R = {ranks}, N = {elements}"),
        )?;
        let chunk_len = backend.chunk_len(rank_len, ranks);
        let mut params = backend.create_arena(format, ranks, rank_len, chunk_len)?;
        let mut grads = backend.create_arena(format, ranks, rank_len, chunk_len)?;
        let means = backend.create_arena(format, 1, rank_len, chunk_len)?;
        fill_rows(&mut params, dtype, elements, |_| 0, 0..ranks)?;
        fill_rows(&mut grads, dtype, elements, |r| r as u64 + 1, 0..ranks)?;
        Ok(ResidentStep {
            params,
            grads,
            means,
            ranks,
            elements,
            dtype,
        })
    }

    /// One step on `backend` (the one that made the arenas), queued: wait with
    /// `backend.synchronize()` to time it.
    ///
    /// # Errors
    /// As [`Backend::dp_sgd_step`]: a `RuntimeError` when `backend` cannot use the arenas (they
    /// live on another device), or for a GPU error or a lost device.
    pub fn step(&mut self, backend: &dyn Backend) -> Result<()> {
        backend.dp_sgd_step(
            &mut self.params,
            &self.grads,
            &mut self.means,
            LEARNING_RATE,
        )
    }

    /// Bytes one step moves: R gradient rows and the parameters read, R parameter rows and the
    /// means written, `(2R + 2) · N · element size`.
    pub fn bytes(&self) -> u64 {
        (2 * self.ranks as u64 + 2) * self.elements as u64 * self.dtype.size_bytes() as u64
    }

    /// The parameters' or the gradients' arena (one row per rank, the parameter at offset 0).
    pub fn arena(&self, values: Values) -> &Arena {
        match values {
            Values::Params => &self.params,
            Values::Grads => &self.grads,
        }
    }

    /// R.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// N.
    pub fn elements(&self) -> usize {
        self.elements
    }

    /// The dtype timed.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend;

    #[test]
    fn the_workload_is_the_step_of_its_seeds() {
        let backend = CpuBackend::with_threads(1);
        let mut bench = ResidentStep::new(&backend, 3, 5, DType::Float32).unwrap();
        assert_eq!(bench.bytes(), (2 * 3 + 2) * 5 * 4);
        bench.step(&backend).unwrap();
        let p0 = values(0, 5).unwrap();
        let g: Vec<Vec<f64>> = (1..=3).map(|s| values(s, 5).unwrap()).collect();
        for rank in 0..3 {
            let words =
                pollster::block_on(bench.arena(Values::Params).read_range(rank, 0, 5)).unwrap();
            for (i, &w) in words.iter().enumerate() {
                let mean = (g[0][i] as f32 + g[1][i] as f32 + g[2][i] as f32) / 3.0;
                let want = p0[i] as f32 - LEARNING_RATE * mean;
                assert!(
                    (f32::from_bits(w) - want).abs() <= 1e-6,
                    "rank {rank} element {i}"
                );
            }
        }
        assert!(
            values(0, 5)
                .unwrap()
                .iter()
                .all(|v| (-1.0..1.0).contains(v))
        );
        assert_ne!(values(0, 5).unwrap(), values(1, 5).unwrap());
        assert!(ResidentStep::new(&backend, 0, 5, DType::Float32).is_err());
        assert!(ResidentStep::new(&backend, 2, 5, DType::Float64).is_err());
        let huge = ResidentStep::new(&backend, 1 << 20, 1 << 40, DType::Float32).unwrap_err();
        assert!(huge.to_string().contains("memory"), "{huge}");
    }
}
