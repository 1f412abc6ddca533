//! A parameter-server run: three workers own the layers of a small two-layer network, the
//! driver fetches them, computes gradients on a batch into a distributed autograd context, and
//! `DistributedOptimizer` steps every owner concurrently.
//!
//! ```text
//! cargo run --release --example parameter_server [-- --steps 30 --backend cpu|gpu|auto]
//! ```

use std::sync::Arc;
use std::time::Instant;

use distopt::BlockOn;
use distopt::backend::{BackendChoice, select_backend};
use distopt::optim::OptionMap;
use distopt::rpc::{DistributedOptimizer, LocalOptimizerKind, RpcWorld};
use distopt::{Result, Tensor};

const INPUTS: usize = 8;
const HIDDEN: usize = 16;
const SAMPLES: usize = 256;

/// A deterministic pseudo-random stream (splitmix64).
struct Random(u64);

impl Random {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let option = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let steps: usize = option("--steps").and_then(|s| s.parse().ok()).unwrap_or(30);
    let choice = BackendChoice::parse(&option("--backend").unwrap_or_else(|| "cpu".into()))?;
    let selection = select_backend(choice).block_on()?;
    println!(
        "backend: {} ({})",
        selection.backend.info().name,
        selection.reason
    );

    // The data: y = sum(sin(x)) plus a little structure a ReLU network can fit.
    let mut random = Random(7);
    let xs: Vec<f32> = (0..SAMPLES * INPUTS).map(|_| random.next()).collect();
    let ys: Vec<f32> = xs
        .chunks(INPUTS)
        .map(|x| x.iter().map(|v| v.sin()).sum::<f32>() * 0.5)
        .collect();

    let world = Arc::new(RpcWorld::new(
        &["worker0", "worker1", "worker2"],
        selection.backend,
    )?);
    let w1 = Tensor::from_f32(
        &[HIDDEN, INPUTS],
        (0..HIDDEN * INPUTS).map(|_| random.next() * 0.5).collect(),
    )?;
    let b1 = Tensor::from_f32(&[HIDDEN], vec![0.0; HIDDEN])?;
    let w2 = Tensor::from_f32(
        &[HIDDEN],
        (0..HIDDEN).map(|_| random.next() * 0.5).collect(),
    )?;
    let params = [
        world.remote("worker0", w1)?,
        world.remote("worker1", b1)?,
        world.remote("worker2", w2)?,
    ];
    let mut options = OptionMap::new();
    options.insert("lr".into(), 0.05.into());
    let optimizer = DistributedOptimizer::new(
        world.clone(),
        "Adam",
        &params,
        &options,
        LocalOptimizerKind::Functional,
    )?;
    for info in optimizer.local_optimizers() {
        println!(
            "  {} optimizes parameters {:?}",
            info.owner, info.param_indices
        );
    }

    println!(
        "{:>5} {:>10} {:>10} {:>10}",
        "step", "loss", "step ms", "total ms"
    );
    for step in 0..steps {
        let start = Instant::now();
        let values: Vec<Vec<f32>> = params
            .iter()
            .map(|p| {
                let v = p.to_here(&world).now_or_wait()?.values_f64()?;
                Ok(v.into_iter().map(|x| x as f32).collect())
            })
            .collect::<Result<_>>()?;
        let (w1, b1, w2) = (&values[0], &values[1], &values[2]);
        // Forward and backward of mean squared error, on the driver.
        let (mut g1, mut gb, mut g2) = (
            vec![0f32; HIDDEN * INPUTS],
            vec![0f32; HIDDEN],
            vec![0f32; HIDDEN],
        );
        let mut loss = 0f32;
        for (x, &y) in xs.chunks(INPUTS).zip(&ys) {
            let hidden: Vec<f32> = (0..HIDDEN)
                .map(|h| {
                    (b1[h] + (0..INPUTS).map(|i| w1[h * INPUTS + i] * x[i]).sum::<f32>()).max(0.0)
                })
                .collect();
            let out: f32 = hidden.iter().zip(w2).map(|(a, b)| a * b).sum();
            let error = out - y;
            loss += error * error / SAMPLES as f32;
            let d_out = 2.0 * error / SAMPLES as f32;
            for h in 0..HIDDEN {
                g2[h] += d_out * hidden[h];
                if hidden[h] > 0.0 {
                    let d_hidden = d_out * w2[h];
                    gb[h] += d_hidden;
                    for i in 0..INPUTS {
                        g1[h * INPUTS + i] += d_hidden * x[i];
                    }
                }
            }
        }
        let compute = start.elapsed();
        let context = world.context();
        let grads = [
            Tensor::from_f32(&[HIDDEN, INPUTS], g1)?,
            Tensor::from_f32(&[HIDDEN], gb)?,
            Tensor::from_f32(&[HIDDEN], g2)?,
        ];
        let step_start = Instant::now();
        for (param, grad) in params.iter().zip(grads) {
            world
                .record_gradient(context.id(), param, grad)
                .now_or_wait()?;
        }
        optimizer.step(context.id()).block_on()?;
        let step_ms = step_start.elapsed().as_secs_f64() * 1e3;
        if step % 5 == 0 || step + 1 == steps {
            println!(
                "{step:>5} {loss:>10.5} {step_ms:>10.3} {:>10.3}",
                (compute.as_secs_f64() * 1e3) + step_ms
            );
        }
    }
    Ok(())
}
