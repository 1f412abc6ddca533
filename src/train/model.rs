//! The model every task trains: a two-layer perceptron
//! (`features → hidden (tanh) → classes`, softmax cross-entropy) with hand-written backprop,
//! its deterministic initialization, and its evaluation over a set of samples.

use crate::error::{Error, Result};
use crate::rng::SplitMix64;
use crate::tensor::Tensor;

/// The two-layer perceptron's dimensions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mlp {
    d: usize,
    h: usize,
    c: usize,
}

/// Per-sample activations, reused across samples.
pub(crate) struct Scratch {
    hidden: Vec<f64>,
    logits: Vec<f64>,
    delta_hidden: Vec<f64>,
}

impl Scratch {
    pub(crate) fn new(mlp: &Mlp) -> Scratch {
        Scratch {
            hidden: vec![0.0; mlp.h],
            logits: vec![0.0; mlp.c],
            delta_hidden: vec![0.0; mlp.h],
        }
    }
}

impl Mlp {
    /// The perceptron `features → hidden (tanh) → classes`.
    pub(crate) fn new(features: usize, hidden: usize, classes: usize) -> Mlp {
        Mlp {
            d: features,
            h: hidden,
            c: classes,
        }
    }

    pub(crate) fn shapes(&self) -> Vec<Vec<usize>> {
        vec![
            vec![self.h, self.d],
            vec![self.h],
            vec![self.c, self.h],
            vec![self.c],
        ]
    }

    pub(crate) fn numel(&self) -> Option<usize> {
        let w1 = self.h.checked_mul(self.d)?;
        let w2 = self.c.checked_mul(self.h)?;
        w1.checked_add(self.h)?.checked_add(w2)?.checked_add(self.c)
    }

    pub(crate) fn check(&self, params: &[Vec<f64>]) -> Result<()> {
        let shapes = self.shapes();
        if params.len() != shapes.len() {
            return Err(Error::value(format!(
                "the model has {} parameters, {} given",
                shapes.len(),
                params.len()
            )));
        }
        for (j, (p, shape)) in params.iter().zip(&shapes).enumerate() {
            let numel: usize = shape.iter().product();
            if p.len() != numel {
                return Err(Error::value(format!(
                    "parameter {j} has {} elements, expected {numel}",
                    p.len()
                )));
            }
        }
        Ok(())
    }

    /// Forward (and, with `grads`, backward — accumulated, not averaged) for one sample.
    /// Returns the cross-entropy loss and whether the prediction was right.
    pub(crate) fn sample(
        &self,
        params: &[Vec<f64>],
        x: &[f64],
        label: usize,
        s: &mut Scratch,
        grads: Option<&mut [Vec<f64>]>,
    ) -> (f64, bool) {
        let (w1, b1, w2, b2) = (&params[0], &params[1], &params[2], &params[3]);
        let (d, h) = (self.d, self.h);
        for (k, a) in s.hidden.iter_mut().enumerate() {
            let row = &w1[k * d..(k + 1) * d];
            let z: f64 = b1[k] + row.iter().zip(x).map(|(w, x)| w * x).sum::<f64>();
            *a = libm::tanh(z);
        }
        for (k, z) in s.logits.iter_mut().enumerate() {
            let row = &w2[k * h..(k + 1) * h];
            *z = b2[k] + row.iter().zip(&s.hidden).map(|(w, a)| w * a).sum::<f64>();
        }
        let max = s.logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = s.logits.iter().map(|z| libm::exp(z - max)).sum();
        let log_sum = max + libm::log(sum);
        let loss = log_sum - s.logits[label];
        let predicted = s
            .logits
            .iter()
            .enumerate()
            .fold((0, f64::NEG_INFINITY), |best, (k, &z)| {
                if z > best.1 { (k, z) } else { best }
            })
            .0;
        if let Some(grads) = grads {
            // dL/dz2 = softmax − one-hot, kept in `logits`.
            for (k, z) in s.logits.iter_mut().enumerate() {
                *z = libm::exp(*z - log_sum) - if k == label { 1.0 } else { 0.0 };
            }
            s.delta_hidden.fill(0.0);
            let (gw1, rest) = grads.split_at_mut(1);
            let (gb1, rest) = rest.split_at_mut(1);
            let (gw2, gb2) = rest.split_at_mut(1);
            let (gw1, gb1, gw2, gb2) = (&mut gw1[0], &mut gb1[0], &mut gw2[0], &mut gb2[0]);
            for (k, &dz) in s.logits.iter().enumerate() {
                gb2[k] += dz;
                let row = &w2[k * h..(k + 1) * h];
                let grow = &mut gw2[k * h..(k + 1) * h];
                for ((g, (&a, &w)), dh) in grow
                    .iter_mut()
                    .zip(s.hidden.iter().zip(row))
                    .zip(s.delta_hidden.iter_mut())
                {
                    *g += dz * a;
                    *dh += dz * w;
                }
            }
            for (k, (&a, &dh)) in s.hidden.iter().zip(&s.delta_hidden).enumerate() {
                let dz = dh * (1.0 - a * a);
                gb1[k] += dz;
                for (g, &xi) in gw1[k * d..(k + 1) * d].iter_mut().zip(x) {
                    *g += dz * xi;
                }
            }
        }
        (loss, predicted == label)
    }
}

impl Mlp {
    /// The deterministic initial parameters (float32) for seed `seed`: weights drawn from
    /// N(0, 1/fan_in), biases zero.
    pub(crate) fn initial_params(&self, seed: u64) -> Result<Vec<Tensor>> {
        let mut rng = SplitMix64::new(seed, 2);
        self.shapes()
            .iter()
            .map(|shape| {
                let values: Vec<f32> = if shape.len() == 2 {
                    let std = 1.0 / (shape[1] as f64).sqrt();
                    (0..shape[0] * shape[1])
                        .map(|_| (rng.normal() * std) as f32)
                        .collect()
                } else {
                    vec![0.0; shape[0]]
                };
                Tensor::from_f32(shape, values)
            })
            .collect()
    }

    /// Mean loss of `params` over `samples` (indices into `inputs`, `features` values each, and
    /// `labels`) and its gradient (one vector per parameter). `samples` must be non-empty and
    /// in range.
    pub(crate) fn loss_and_grad(
        &self,
        params: &[Vec<f64>],
        inputs: &[f64],
        labels: &[usize],
        samples: impl ExactSizeIterator<Item = usize>,
    ) -> Result<(f64, Vec<Vec<f64>>)> {
        self.check(params)?;
        let n = samples.len();
        if n == 0 {
            return Err(Error::value("an empty batch has no loss"));
        }
        let mut grads: Vec<Vec<f64>> = self
            .shapes()
            .iter()
            .map(|s| vec![0.0; s.iter().product()])
            .collect();
        let mut scratch = Scratch::new(self);
        let mut loss = 0.0;
        for i in samples {
            let x = &inputs[i * self.d..(i + 1) * self.d];
            loss += self
                .sample(
                    params,
                    x,
                    labels[i],
                    &mut scratch,
                    Some(grads.as_mut_slice()),
                )
                .0;
        }
        let n = n as f64;
        for g in grads.iter_mut().flatten() {
            *g /= n;
        }
        Ok((loss / n, grads))
    }

    /// Mean loss and accuracy of `params` over every sample of `inputs` and `labels`.
    pub(crate) fn evaluate(
        &self,
        params: &[Vec<f64>],
        inputs: &[f64],
        labels: &[usize],
    ) -> Result<(f64, f64)> {
        self.check(params)?;
        if labels.is_empty() {
            return Err(Error::value("no samples to evaluate on"));
        }
        let mut scratch = Scratch::new(self);
        let (mut loss, mut correct) = (0.0, 0usize);
        for (i, &label) in labels.iter().enumerate() {
            let x = &inputs[i * self.d..(i + 1) * self.d];
            let (l, hit) = self.sample(params, x, label, &mut scratch, None);
            loss += l;
            correct += usize::from(hit);
        }
        let n = labels.len() as f64;
        Ok((loss / n, correct as f64 / n))
    }
}
