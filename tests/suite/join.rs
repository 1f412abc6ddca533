//! `Join` with `DistributedDataParallel` and `ZeroRedundancyOptimizer` beyond what the golden
//! cases pin down: the divisor DDP uses, `throw_on_early_termination`, `enable=False`, the
//! skew warning, the post-hook's choice of the last joiner, the constructor's and the lock-step
//! API's errors; and the scaled-sum kernel on the GPU against the CPU, bit for bit.
//!
//! Expected values are PyTorch's float32 arithmetic written out (`fl32(7 · fl32(1/3))` is
//! 2.3333334922790527, while `fl32(7 / 3)` is 2.3333332538604736).

use crate::common;

use std::sync::Arc;

use distopt::BlockOn;
use distopt::backend::kernels::{ParamStarts, ScaledSumArgs};
use distopt::comm::{Communicator, SimulatedWorld};
use distopt::ddp::DistributedDataParallel;
use distopt::join::{
    EARLY_TERMINATION, Join, JoinOptions, Joinable, MULTIPLE_PROCESS_GROUPS, NO_JOINABLES,
    exhausted_message, skew_warning,
};
use distopt::replicas::Replicas;
use distopt::warnings::{self, Channel};
use distopt::zero::{ZeroOptions, ZeroRedundancyOptimizer};
use distopt::{Backend, CpuBackend, ErrorKind, StorageFormat, Tensor};

fn t(values: &[f32]) -> Tensor {
    Tensor::from_f32(&[values.len()], values.to_vec()).unwrap()
}

fn world(size: usize) -> Arc<dyn Communicator> {
    Arc::new(SimulatedWorld::new(size).unwrap())
}

/// One float32 parameter of `len` zeros on `ranks` ranks.
fn model(backend: &Arc<dyn Backend>, ranks: usize, len: usize) -> Replicas {
    Replicas::replicate(backend.clone(), ranks, &[t(&vec![0.0; len])]).unwrap()
}

fn grads(model: &Replicas) -> Vec<Option<Vec<f64>>> {
    model
        .all_grads()
        .block_on()
        .unwrap()
        .into_iter()
        .map(|g| g[0].as_ref().map(|t| t.values_f64().unwrap()))
        .collect()
}

fn params(model: &Replicas) -> Vec<Vec<f64>> {
    model
        .all_params()
        .block_on()
        .unwrap()
        .into_iter()
        .map(|p| p[0].values_f64().unwrap())
        .collect()
}

/// Sets rank r's gradient of the model's one parameter.
fn set_grad(model: &mut Replicas, rank: usize, values: &[f32]) {
    model.set_grads(rank, &[Some(t(values))]).unwrap();
}

#[test]
fn ddp_multiplies_by_the_reciprocal_of_the_world_size_then_sums() {
    for (name, backend) in common::named_backends() {
        let mut m = model(&backend, 3, 2);
        let mut ddp = DistributedDataParallel::new(world(3), &mut m).unwrap();
        set_grad(&mut m, 0, &[7.0, 5.0]);
        set_grad(&mut m, 1, &[10.0, 0.0]);
        // Rank 2 has no gradient: it contributes zeros and receives the sum.
        ddp.synchronize_gradients(&mut m).unwrap();
        // fl32(7·fl32(1/3)) + fl32(10·fl32(1/3)); dividing would give 5.666666507720947 and
        // 1.6666666269302368.
        let want = vec![5.6666669845581055, 1.6666667461395264];
        assert_eq!(grads(&m), vec![Some(want.clone()); 3], "{name}");
    }
}

/// Rank 0 has one input, ranks 1 and 2 two: at the second iteration rank 0 has joined.
fn uneven(backend: &Arc<dyn Backend>, options: JoinOptions, zero_first: bool) -> Replicas {
    let w = world(3);
    let mut m = model(backend, 3, 1);
    let mut ddp = DistributedDataParallel::new(w.clone(), &mut m).unwrap();
    let groups = vec![(vec![0], Default::default())];
    let mut lr = serde_json::Map::new();
    lr.insert("lr".into(), 0.0.into());
    let mut zero =
        ZeroRedundancyOptimizer::new(w, &m, groups, "SGD", &lr, ZeroOptions::default()).unwrap();
    let mut join = if zero_first {
        Join::new(&mut [&mut zero as &mut dyn Joinable, &mut ddp], options)
    } else {
        Join::new(&mut [&mut ddp as &mut dyn Joinable, &mut zero], options)
    }
    .unwrap();
    join.iteration(&[true, true, true]).unwrap();
    for r in 0..3 {
        set_grad(&mut m, r, &[6.0]);
    }
    ddp.synchronize_gradients(&mut m).unwrap();
    zero.step(&mut m).unwrap();
    assert_eq!(join.active_ranks(), Some(3));
    join.iteration(&[false, true, true]).unwrap();
    set_grad(&mut m, 1, &[3.0]);
    set_grad(&mut m, 2, &[6.0]);
    ddp.synchronize_gradients(&mut m).unwrap();
    zero.step(&mut m).unwrap();
    assert_eq!(join.active_ranks(), Some(2));
    assert_eq!(join.shadow_iterations(), vec![1, 0, 0]);
    if zero_first {
        join.exit(&mut [&mut zero as &mut dyn Joinable, &mut ddp], &mut m)
    } else {
        join.exit(&mut [&mut ddp as &mut dyn Joinable, &mut zero], &mut m)
    }
    .unwrap();
    m
}

#[test]
fn a_joined_rank_contributes_zeros_and_keeps_its_own_gradient() {
    for (name, backend) in common::named_backends() {
        // divide_by_initial_world_size (the default): fl32(3/3) + fl32(6/3) over D = 3.
        let m = uneven(&backend, JoinOptions::default(), false);
        let g = grads(&m);
        // Rank 0 keeps the sum of its last own iteration: 2 + 2 + 2.
        assert_eq!(g[0], Some(vec![6.0]), "{name}");
        assert_eq!(g[1], Some(vec![3.0]), "{name}");
        assert_eq!(g[2], Some(vec![3.0]), "{name}");
        // Over the active ranks: 1.5 + 3.
        let divide_active = JoinOptions::default().with_divide_by_initial_world_size(false);
        let g = grads(&uneven(&backend, divide_active, false));
        assert_eq!(
            g,
            vec![Some(vec![6.0]), Some(vec![4.5]), Some(vec![4.5])],
            "{name}"
        );
        // DDP divides by the active ranks only as the first joinable (it then owns the
        // context's count of them); after ZeRO it divides by the world size.
        let g = grads(&uneven(&backend, divide_active, true));
        assert_eq!(
            g,
            vec![Some(vec![6.0]), Some(vec![3.0]), Some(vec![3.0])],
            "{name}"
        );
    }
}

#[test]
fn throw_on_early_termination_raises_each_ranks_own_error() {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let options = JoinOptions::default().with_throw_on_early_termination(true);
    let mut m = model(&backend, 3, 1);
    let mut ddp = DistributedDataParallel::new(world(3), &mut m).unwrap();
    let mut join = Join::new(&mut [&mut ddp as &mut dyn Joinable], options).unwrap();
    // Even inputs: nothing is raised.
    join.iteration(&[true, true, true]).unwrap();
    ddp.synchronize_gradients(&mut m).unwrap();
    join.iteration(&[false, true, true]).unwrap();
    let errors = ddp.synchronize_gradients(&mut m).unwrap_err();
    assert_eq!(errors.ranks(), vec![0, 1, 2]);
    let message = |r: usize| errors.get(r).unwrap().message().to_string();
    assert_eq!(message(0), "Rank 0 exhausted all inputs.");
    assert_eq!(message(0), exhausted_message(0));
    assert_eq!(
        message(1),
        "Detected at least one rank that exhausted inputs. Throwing across all ranks."
    );
    assert_eq!(message(2), EARLY_TERMINATION);
    assert!(
        errors
            .iter()
            .all(|(_, e)| e.kind() == ErrorKind::RuntimeError)
    );
    // The context has ended.
    let err = join.iteration(&[false, true, true]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RuntimeError);
    assert!(err.message().contains("has ended"), "{err}");
}

#[test]
fn even_inputs_with_throw_on_early_termination_end_normally() {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let options = JoinOptions::default().with_throw_on_early_termination(true);
    let mut m = model(&backend, 2, 1);
    let mut ddp = DistributedDataParallel::new(world(2), &mut m).unwrap();
    let mut join = Join::new(&mut [&mut ddp as &mut dyn Joinable], options).unwrap();
    for _ in 0..3 {
        join.iteration(&[true, true]).unwrap();
        set_grad(&mut m, 0, &[1.0]);
        set_grad(&mut m, 1, &[3.0]);
        ddp.synchronize_gradients(&mut m).unwrap();
    }
    join.exit(&mut [&mut ddp as &mut dyn Joinable], &mut m)
        .unwrap();
    assert_eq!(grads(&m), vec![Some(vec![2.0]); 2]);
}

/// Rank 0 has no input at all, rank 1 `inputs`: rank 0 shadows every iteration.
fn skewed(inputs: usize) -> Vec<warnings::Warning> {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut m = model(&backend, 2, 1);
    let mut ddp = DistributedDataParallel::new(world(2), &mut m).unwrap();
    let mut join = Join::new(&mut [&mut ddp as &mut dyn Joinable], JoinOptions::default()).unwrap();
    warnings::take();
    for _ in 0..inputs {
        join.iteration(&[false, true]).unwrap();
        set_grad(&mut m, 1, &[1.0]);
        ddp.synchronize_gradients(&mut m).unwrap();
    }
    join.exit(&mut [&mut ddp as &mut dyn Joinable], &mut m)
        .unwrap();
    assert_eq!(join.shadow_iterations(), vec![inputs as u64, 0]);
    warnings::take_records()
}

#[test]
fn more_than_a_thousand_shadow_iterations_warn_once_on_the_joined_rank() {
    assert!(
        skewed(1000).is_empty(),
        "1000 shadow iterations are not > 1000"
    );
    for inputs in [1001, 1004] {
        let records = skewed(inputs);
        assert_eq!(records.len(), 1, "{inputs}: {records:?}");
        let w = &records[0];
        assert_eq!(w.message, skew_warning(0));
        assert!(w.message.starts_with(
            "Detected uneven input skew of greater than 1000. This means that rank 0 has at least 1000 fewer inputs"
        ));
        assert_eq!(
            (w.channel, w.category.as_str()),
            (Channel::Warnings, "UserWarning")
        );
        assert_eq!(w.ranks, Some(vec![0]));
    }
}

/// Every rank's parameter set to its rank, then the ranks train with `inputs[r]` inputs (and
/// a zero learning rate: the parameters only move by the final broadcast).
fn final_model(inputs: &[usize], enable: bool) -> Vec<Vec<f64>> {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let w = inputs.len();
    let mut m = model(&backend, w, 2);
    let mut ddp = DistributedDataParallel::new(world(w), &mut m).unwrap();
    for r in 0..w {
        m.set_params(r, &[t(&[r as f32, -(r as f32)])]).unwrap();
    }
    let options = JoinOptions::default().with_enable(enable);
    let mut join = Join::new(&mut [&mut ddp as &mut dyn Joinable], options).unwrap();
    for step in 0..*inputs.iter().max().unwrap() {
        let has: Vec<bool> = inputs.iter().map(|&n| n > step).collect();
        join.iteration(&has).unwrap();
        ddp.synchronize_gradients(&mut m).unwrap();
    }
    join.exit(&mut [&mut ddp as &mut dyn Joinable], &mut m)
        .unwrap();
    params(&m)
}

#[test]
fn the_post_hook_broadcasts_the_model_of_the_largest_last_joiner() {
    // Ranks 0 and 2 never shadowed: rank 2's model wins.
    assert_eq!(final_model(&[2, 1, 2], true), vec![vec![2.0, -2.0]; 3]);
    assert_eq!(final_model(&[3, 1, 2], true), vec![vec![0.0, 0.0]; 3]);
    // Disabled, the context runs no hook (and even inputs are required).
    assert_eq!(
        final_model(&[2, 2, 2], false),
        vec![vec![0.0, 0.0], vec![1.0, -1.0], vec![2.0, -2.0]]
    );
}

#[test]
fn the_lock_step_api_reports_misuse() {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut m = model(&backend, 2, 1);
    let mut ddp = DistributedDataParallel::new(world(2), &mut m).unwrap();
    let err = Join::new(&mut [], JoinOptions::default()).unwrap_err();
    assert_eq!(
        (err.kind(), err.message()),
        (ErrorKind::ValueError, NO_JOINABLES)
    );
    assert_eq!(
        NO_JOINABLES,
        "The join context manager requires at least one joinable"
    );
    // Another world is another process group.
    let mut other = DistributedDataParallel::new(world(2), &mut m).unwrap();
    let err = Join::new(
        &mut [&mut ddp as &mut dyn Joinable, &mut other],
        JoinOptions::default(),
    )
    .unwrap_err();
    assert_eq!(
        (err.kind(), err.message()),
        (ErrorKind::ValueError, MULTIPLE_PROCESS_GROUPS)
    );
    let mut join = Join::new(&mut [&mut ddp as &mut dyn Joinable], JoinOptions::default()).unwrap();
    let err = join.iteration(&[true]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ValueError);
    assert!(
        err.message()
            .contains("1 input flags for the 2 local ranks"),
        "{err}"
    );
    join.iteration(&[false, true]).unwrap();
    let err = join.iteration(&[true, true]).unwrap_err();
    assert!(
        err.message()
            .contains("rank 0 ran out of inputs at an earlier iteration"),
        "{err}"
    );
    let err = join
        .exit(&mut [&mut other as &mut dyn Joinable], &mut m)
        .unwrap_err();
    assert_eq!(err.ranks(), vec![0, 1]);
    assert!(
        err.first()
            .message()
            .contains("joinables this Join was created with")
    );
    // Disabled: uneven inputs would hang PyTorch's ranks; here they are an error.
    let disabled = JoinOptions::default().with_enable(false);
    let mut join = Join::new(&mut [&mut other as &mut dyn Joinable], disabled).unwrap();
    let err = join.iteration(&[true, false]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RuntimeError);
    assert!(
        err.message()
            .contains("rank 1 has no input while rank 0 has one"),
        "{err}"
    );
    // The replicas must hold the world's ranks.
    let mut three = model(&backend, 3, 1);
    let err = ddp.synchronize_gradients(&mut three).unwrap_err();
    assert_eq!(err.first().kind(), ErrorKind::ValueError);
}

// ---------------------------------------------------------------------------------------------
// The scaled-sum kernel: GPU against CPU.

/// The library's SplitMix64 with the draws this test needs.
struct Rng(distopt::rng::SplitMix64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn value(&mut self) -> f32 {
        match self.below(20) {
            0 => 0.0,
            1 => -0.0,
            2 => f32::INFINITY,
            3 => 1e-40,
            4 => 6.0e4,
            _ => (self.next() as i64 as f64 / i64::MAX as f64 * 8.0) as f32,
        }
    }
}

/// Runs one random scaled sum on `backend` and returns every rank's words.
#[allow(clippy::too_many_arguments)]
fn scaled_sum_on(
    backend: &dyn Backend,
    format: StorageFormat,
    ranks: usize,
    numels: &[usize],
    values: &[Vec<f32>],
    reduced: &[bool],
    scales: &[Option<f64>],
    present: &[bool],
) -> Vec<u32> {
    let (offsets, rank_len) = distopt::backend::layout_params(numels);
    let chunk_len = backend.chunk_len(rank_len, ranks);
    let mut arena = backend
        .create_arena(format, ranks, rank_len, chunk_len)
        .unwrap();
    for (rank, values) in values.iter().enumerate() {
        let mut words = vec![0u32; format.words_for(rank_len)];
        for (i, &v) in values.iter().enumerate() {
            format.store(&mut words, i, v);
        }
        arena.write(rank, 0, &words).unwrap();
    }
    let starts = ParamStarts(offsets.iter().map(|&o| o as u32).collect());
    backend
        .scaled_sum(ScaledSumArgs {
            arena: &mut arena,
            arith: format,
            starts: &starts,
            reduced,
            scales,
            present,
        })
        .unwrap();
    pollster::block_on(arena.read_all()).unwrap()
}

#[test]
fn gpu_scaled_sum_matches_the_cpu_bit_for_bit() {
    let gpus: Vec<Arc<dyn Backend>> = [common::shared_gpu(), common::tiny_gpu()]
        .into_iter()
        .flatten()
        .collect();
    if gpus.is_empty() {
        return;
    }
    let cpu = CpuBackend::new();
    let mut rng = Rng(distopt::rng::SplitMix64::from_state(0x5eed_0707));
    let mut cases = 0;
    for format in [StorageFormat::F32, StorageFormat::F16, StorageFormat::BF16] {
        for _ in 0..40 {
            let ranks = 1 + rng.below(5);
            let params = 1 + rng.below(4);
            let numels: Vec<usize> = (0..params).map(|_| rng.below(700)).collect();
            let (_, rank_len) = distopt::backend::layout_params(&numels);
            let values: Vec<Vec<f32>> = (0..ranks)
                .map(|_| (0..rank_len).map(|_| rng.value()).collect())
                .collect();
            let reduced: Vec<bool> = (0..params).map(|_| rng.below(5) > 0).collect();
            let active = 1 + rng.below(ranks);
            let scales: Vec<Option<f64>> = (0..ranks)
                .map(|_| (rng.below(4) > 0).then_some(1.0 / active as f64))
                .collect();
            let present: Vec<bool> = (0..ranks * params).map(|_| rng.below(6) > 0).collect();
            let want = scaled_sum_on(
                &cpu, format, ranks, &numels, &values, &reduced, &scales, &present,
            );
            for gpu in &gpus {
                let got = scaled_sum_on(
                    gpu.as_ref(),
                    format,
                    ranks,
                    &numels,
                    &values,
                    &reduced,
                    &scales,
                    &present,
                );
                assert_eq!(
                    got, want,
                    "{format:?}, {ranks} ranks, numels {numels:?}, scales {scales:?}"
                );
            }
            cases += 1;
        }
    }
    assert_eq!(cases, 120);
}
