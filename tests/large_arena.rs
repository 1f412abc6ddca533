//! Arenas larger than one 128 MiB storage binding and dispatches of more than 65,535
//! workgroups, on the default GPU backend and on the CPU backend.
//!
//! * R = 2 and one float32 parameter of 2^25 elements: 256 MiB of parameters, more than one
//!   binding, so the GPU backend splits the arena into chunks.
//! * R = 1 and the same parameter: exactly one 128 MiB binding, 2^24 element pairs = 65,536
//!   workgroups of 256 in one dispatch, one more than fits in one dimension, so the dispatch
//!   spills into a second grid dimension.
//!
//! The values are small dyadic numbers that vary with the index (with periods that do not
//! divide any power of two, plus a slowly varying part), so every sum, mean and update is
//! exact and every element's expected value is known; an element read from the wrong chunk,
//! rank or workgroup shows up.

mod common;

use std::sync::Mutex;

use distopt::BlockOn;
use distopt::{Backend, CpuBackend, StepOutput, Tensor, sgd_step};

const ELEMENTS: usize = 1 << 25;
const LEARNING_RATE: f64 = 0.25;

/// The tests hold up to a few GiB each: run them one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn param(i: usize) -> f32 {
    (i >> 13) as f32 - 2048.0
}

fn grad(rank: usize, i: usize) -> f32 {
    match rank {
        0 => (i % 251) as f32 - 125.0,
        _ => (i % 509) as f32 * 0.5 - 127.0,
    }
}

/// The exact mean and update of element `i` with `ranks` ranks (all values are dyadic with
/// few bits, so float32 computes them exactly).
fn expected(ranks: usize, i: usize) -> (f32, f32) {
    let sum: f64 = (0..ranks).map(|r| f64::from(grad(r, i))).sum();
    let mean = sum / ranks as f64;
    let updated = f64::from(param(i)) - LEARNING_RATE * mean;
    (mean as f32, updated as f32)
}

fn inputs(ranks: usize) -> (Vec<Vec<Tensor>>, Vec<Vec<Option<Tensor>>>) {
    let p = Tensor::from_f32(&[ELEMENTS], (0..ELEMENTS).map(param).collect()).unwrap();
    let params = vec![vec![p]; ranks];
    let grads = (0..ranks)
        .map(|r| {
            let g = (0..ELEMENTS).map(|i| grad(r, i)).collect();
            vec![Some(Tensor::from_f32(&[ELEMENTS], g).unwrap())]
        })
        .collect();
    (params, grads)
}

fn values(tensor: &Tensor) -> Vec<f32> {
    assert_eq!(tensor.shape(), [ELEMENTS]);
    match tensor.to_host().block_on().unwrap().host_data().unwrap() {
        distopt::HostData::Float32(v) => v.clone(),
        other => panic!("expected float32 values, got {:?}", other.dtype()),
    }
}

fn check(output: &StepOutput, ranks: usize, who: &str) {
    assert_eq!(output.mean_gradients.len(), 1);
    assert_eq!(output.updated_replicas.len(), ranks);
    let mean = values(&output.mean_gradients[0]);
    let replicas: Vec<Vec<f32>> = output
        .updated_replicas
        .iter()
        .map(|r| {
            assert_eq!(r.len(), 1);
            values(&r[0])
        })
        .collect();
    for i in 0..ELEMENTS {
        let (want_mean, want_updated) = expected(ranks, i);
        assert_eq!(
            mean[i].to_bits(),
            want_mean.to_bits(),
            "{who}: mean[{i}] = {}, expected {want_mean}",
            mean[i]
        );
        for (rank, values) in replicas.iter().enumerate() {
            assert_eq!(
                values[i].to_bits(),
                want_updated.to_bits(),
                "{who}: updated_replicas[{rank}][0][{i}] = {}, expected {want_updated}",
                values[i]
            );
        }
    }
}

fn run(backend: &dyn Backend, ranks: usize, who: &str) {
    let (params, grads) = inputs(ranks);
    let output = sgd_step(backend, &params, &grads, LEARNING_RATE)
        .block_on()
        .unwrap_or_else(|e| panic!("{who}: {e}"));
    drop((params, grads));
    check(&output, ranks, who);
}

#[test]
fn arena_larger_than_one_binding_on_gpu() {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(gpu) = common::gpu_backend() else {
        return;
    };
    let info = gpu.info();
    assert!(
        info.max_binding_bytes <= 128 << 20,
        "the default binding is capped at 128 MiB"
    );
    let arena_bytes = 2 * ELEMENTS as u64 * 4;
    assert!(arena_bytes > info.max_binding_bytes);
    // The arena really is chunked.
    assert!(gpu.chunk_len(ELEMENTS, 2) < ELEMENTS);
    run(gpu.as_ref(), 2, "gpu, R = 2");
}

#[test]
fn more_than_65535_workgroups_in_one_dispatch_on_gpu() {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(gpu) = common::gpu_backend() else {
        return;
    };
    let info = gpu.info();
    // One binding of 128 MiB holds the whole arena, and its 2^24 pairs need 65,536
    // workgroups of 256: more than one dimension allows.
    assert!(info.max_workgroups_per_dimension <= 65_535);
    if gpu.chunk_len(ELEMENTS, 1) < ELEMENTS {
        eprintln!(
            "this adapter's storage bindings ({} bytes) are smaller than 128 MiB: the arena is chunked instead",
            info.max_binding_bytes
        );
    }
    run(gpu.as_ref(), 1, "gpu, R = 1");
}

#[test]
fn arena_larger_than_one_binding_on_cpu() {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    run(&CpuBackend::new(), 2, "cpu, R = 2");
}
