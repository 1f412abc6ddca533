//! The step's request: R ranks' parameters and gradients, however a front end holds them
//! (typed tensors, JSON, JavaScript values, shapes exchanged over MPI), read and checked in one
//! reference order so that every front end reports the same first defect with the same text:
//! the counts, then for each parameter and rank its dtype, its shape, its gradient's dtype and
//! its gradient's shape. Only rank 0's copy of a parameter is read for its values and dtype (the
//! reference's `p0j`): another rank's replica is checked for a supported dtype and rank 0's
//! shape, and its own values and dtype are not used (see `tests/properties.rs`).

use crate::error::{Error, Result};
use crate::tensor::{Tensor, format_shape};

/// A parsed `{"parameter_replicas", "gradient_replicas", "learning_rate"}` request.
#[derive(Debug, Clone)]
pub struct StepRequest {
    /// `[rank][param]`.
    pub parameter_replicas: Vec<Vec<Tensor>>,
    /// `[rank][param]`, `None` for a missing gradient.
    pub gradient_replicas: Vec<Vec<Option<Tensor>>>,
    /// The learning rate (rounded to float32 by the step).
    pub learning_rate: f64,
}

/// The error messages of the step's validation, shared by the typed API and the JSON front end
/// so that both report the same text. Every one is a `ValueError`.
pub mod errors {
    use super::{Error, format_shape};

    /// `parameter_replicas` is empty.
    pub fn no_replicas() -> Error {
        Error::value("no replicas: parameter_replicas is empty")
    }
    /// `gradient_replicas` has another length than `parameter_replicas`.
    pub fn gradient_replica_count(gradients: usize, ranks: usize) -> Error {
        Error::value(format!(
            "gradient replica count mismatch: {gradients} gradient replicas for {ranks} parameter replicas"
        ))
    }
    /// Rank `rank` holds another number of parameters than rank 0.
    pub fn param_count(rank: usize, count: usize, expected: usize) -> Error {
        Error::value(format!(
            "parameter count mismatch: rank {rank} has {count} parameters, rank 0 has {expected}"
        ))
    }
    /// Rank `rank` holds another number of gradients than rank 0 has parameters.
    pub fn gradient_count(rank: usize, count: usize, expected: usize) -> Error {
        Error::value(format!(
            "gradient count mismatch: rank {rank} has {count} gradients for {expected} parameters"
        ))
    }
    /// Parameter or gradient of a dtype that is not float32/float16/bfloat16/float64.
    pub fn unsupported_dtype(what: &str, dtype: &str, param: usize, rank: usize) -> Error {
        Error::value(format!(
            "unsupported dtype {dtype} for {what} {param} of rank {rank}: expected float32, float16, bfloat16 or float64"
        ))
    }
    /// Parameter `param` of rank `rank` has another shape than rank 0's.
    pub fn param_shape(param: usize, rank: usize, shape: &[usize], expected: &[usize]) -> Error {
        Error::value(format!(
            "parameter shape mismatch: parameter {param} of rank {rank} has shape {}, rank 0 has {}",
            format_shape(shape),
            format_shape(expected)
        ))
    }
    /// Gradient `param` of rank `rank` has another shape than its parameter.
    pub fn gradient_shape(param: usize, rank: usize, shape: &[usize], expected: &[usize]) -> Error {
        Error::value(format!(
            "gradient shape mismatch: gradient {param} of rank {rank} has shape {}, its parameter has shape {}",
            format_shape(shape),
            format_shape(expected)
        ))
    }
}

/// Replica lists as a front end holds them, read one entry at a time by [`read_replicas`] in
/// the reference order. An entry is read (and its dtype checked) only when the order reaches
/// it, so a defect further on is never reported first.
pub trait StepSource {
    /// One parameter or gradient as read (a tensor, or just its shape).
    type Item;
    /// The number of parameter ranks and of gradient ranks.
    fn ranks(&mut self) -> (usize, usize);
    /// Rank `rank`'s number of parameters and of gradients; an error where its lists are not
    /// lists.
    ///
    /// # Errors
    /// The source's error where rank `rank`'s lists are not lists (a `ValueError` naming them, as
    /// the JSON source reports it).
    fn counts(&mut self, rank: usize) -> Result<(usize, usize)>;
    /// Parameter `j` of rank `rank` (an unsupported dtype: [`errors::unsupported_dtype`]).
    ///
    /// # Errors
    /// [`errors::unsupported_dtype`] for an unsupported dtype, or the source's own error (a
    /// `ValueError`) for an entry it cannot read as a tensor.
    fn param(&mut self, rank: usize, j: usize) -> Result<Self::Item>;
    /// Gradient `j` of rank `rank`, `None` where it is missing.
    ///
    /// # Errors
    /// As [`StepSource::param`].
    fn grad(&mut self, rank: usize, j: usize) -> Result<Option<Self::Item>>;
    /// The shape of an item.
    fn shape(item: &Self::Item) -> &[usize];
}

/// Parameters `[rank][param]` and gradients `[rank][param]` of a [`StepSource`].
pub type ReplicaLists<T> = (Vec<Vec<T>>, Vec<Vec<Option<T>>>);

/// Reads and checks a [`StepSource`] in the reference order.
///
/// # Errors
/// The first defect, as a `ValueError` of [`errors`] (or the source's own error for an entry
/// it cannot read).
pub fn read_replicas<S: StepSource>(source: &mut S) -> Result<ReplicaLists<S::Item>> {
    let (ranks, grad_ranks) = source.ranks();
    if ranks == 0 {
        return Err(errors::no_replicas());
    }
    if grad_ranks != ranks {
        return Err(errors::gradient_replica_count(grad_ranks, ranks));
    }
    let counts = (0..ranks)
        .map(|rank| source.counts(rank))
        .collect::<Result<Vec<_>>>()?;
    let count = counts[0].0;
    for (rank, &(params, grads)) in counts.iter().enumerate() {
        if params != count {
            return Err(errors::param_count(rank, params, count));
        }
        if grads != count {
            return Err(errors::gradient_count(rank, grads, count));
        }
    }
    let mut params: Vec<Vec<S::Item>> = (0..ranks).map(|_| Vec::with_capacity(count)).collect();
    let mut grads: Vec<Vec<Option<S::Item>>> =
        (0..ranks).map(|_| Vec::with_capacity(count)).collect();
    for j in 0..count {
        for rank in 0..ranks {
            let param = source.param(rank, j)?;
            if rank > 0 {
                let (shape, expected) = (S::shape(&param), S::shape(&params[0][j]));
                if shape != expected {
                    return Err(errors::param_shape(j, rank, shape, expected));
                }
            }
            let grad = source.grad(rank, j)?;
            if let Some(g) = &grad {
                if S::shape(g) != S::shape(&param) {
                    return Err(errors::gradient_shape(
                        j,
                        rank,
                        S::shape(g),
                        S::shape(&param),
                    ));
                }
            }
            params[rank].push(param);
            grads[rank].push(grad);
        }
    }
    Ok((params, grads))
}

/// Replica lists held as shapes (`None`: a missing gradient).
struct Shapes<'a> {
    params: &'a [Vec<&'a [usize]>],
    grads: &'a [Vec<Option<&'a [usize]>>],
}

impl<'a> StepSource for Shapes<'a> {
    type Item = &'a [usize];
    fn ranks(&mut self) -> (usize, usize) {
        (self.params.len(), self.grads.len())
    }
    fn counts(&mut self, rank: usize) -> Result<(usize, usize)> {
        Ok((self.params[rank].len(), self.grads[rank].len()))
    }
    fn param(&mut self, rank: usize, j: usize) -> Result<&'a [usize]> {
        Ok(self.params[rank][j])
    }
    fn grad(&mut self, rank: usize, j: usize) -> Result<Option<&'a [usize]>> {
        Ok(self.grads[rank][j])
    }
    fn shape<'b>(item: &'b &'a [usize]) -> &'b [usize] {
        item
    }
}

/// Typed replica lists, read as they are.
struct Tensors<'a> {
    params: &'a [Vec<Tensor>],
    grads: &'a [Vec<Option<Tensor>>],
}

impl<'a> StepSource for Tensors<'a> {
    type Item = &'a Tensor;
    fn ranks(&mut self) -> (usize, usize) {
        (self.params.len(), self.grads.len())
    }
    fn counts(&mut self, rank: usize) -> Result<(usize, usize)> {
        Ok((self.params[rank].len(), self.grads[rank].len()))
    }
    fn param(&mut self, rank: usize, j: usize) -> Result<&'a Tensor> {
        Ok(&self.params[rank][j])
    }
    fn grad(&mut self, rank: usize, j: usize) -> Result<Option<&'a Tensor>> {
        Ok(self.grads[rank][j].as_ref())
    }
    fn shape<'b>(item: &'b &'a Tensor) -> &'b [usize] {
        item.shape()
    }
}

/// Checks the replica lists in the reference order (counts, then per parameter and rank the
/// shapes); the first defect found is the error.
///
/// # Errors
/// A `ValueError` of [`errors`] naming the rank and parameter.
pub fn validate(
    parameter_replicas: &[Vec<Tensor>],
    gradient_replicas: &[Vec<Option<Tensor>>],
) -> Result<()> {
    read_replicas(&mut Tensors {
        params: parameter_replicas,
        grads: gradient_replicas,
    })
    .map(|_| ())
}

/// [`validate`] on the shapes alone (`None`: a missing gradient).
pub(crate) fn validate_shapes(
    params: &[Vec<&[usize]>],
    grads: &[Vec<Option<&[usize]>>],
) -> Result<()> {
    read_replicas(&mut Shapes { params, grads }).map(|_| ())
}
