//! DiLoCo beyond the golden cases (which `tests/golden.rs` replays):
//!
//! * the pseudo-gradient kernel on every backend (CPU, GPU, GPU with chunked arenas and a 2-D
//!   grid) against a scalar reference written here, bit for bit, every storage format,
//!   special values included;
//! * a run saved and resumed at every step (mid-interval and right after a sync) into a
//!   fresh model, fresh optimizers and a fresh `DiLoCo` gives the bits of the straight run;
//! * a sync's all-reduce traffic in `CommStats`;
//! * typed errors for bad arguments and bad state dicts.

use crate::common;

use std::sync::Arc;

use distopt::BlockOn;
use distopt::backend::kernels::{AverageArgs, LerpArgs, MeanOrder, ParamStarts, average_reference};
use distopt::comm::{Communicator, SimulatedWorld};
use distopt::diloco::{Compression, DiLoCo, DiLoCoOptions};
use distopt::replicas::Replicas;
use distopt::{Backend, CpuBackend, DType, ErrorKind, StorageFormat, Tensor};
use serde_json::{Value, json};

/// SplitMix64.
struct Rng(distopt::rng::SplitMix64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in `[-1, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
    /// A value for the lerp kernel: mostly ordinary values over many binades, and NaN, ±inf,
    /// ±0, tiny (a float16 subnormal) and huge values. The products stay in the range where
    /// the device's fused multiply-add is exact (`exact_fma` in `shaders/optim_math.wgsl`:
    /// below 2^100 and, unless zero, from 2^-60).
    fn value(&mut self) -> f64 {
        match self.next_u64() % 16 {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => f64::NEG_INFINITY,
            3 => 0.0,
            4 => -0.0,
            5 => self.unit() * 1e-12,
            6 => self.unit() * 6e-6,
            7 => self.unit() * 1e29,
            _ => self.unit() * 2f64.powi((self.next_u64() % 40) as i32 - 20),
        }
    }
}

/// [`common::named_backends`], and a GPU backend whose tiny bindings force chunking.
fn backends() -> Vec<(&'static str, Arc<dyn Backend>)> {
    let mut out = common::named_backends();
    if let Some(gpu) = common::tiny_gpu() {
        out.push(("gpu-chunked", gpu));
    }
    out
}

fn dtype_of(format: StorageFormat) -> DType {
    match format {
        StorageFormat::F32 => DType::Float32,
        StorageFormat::F16 => DType::Float16,
        StorageFormat::BF16 => DType::BFloat16,
        StorageFormat::F64 => DType::Float64,
    }
}

/// `values` rounded to `dtype` (once), as exact f64s.
fn rounded(dtype: DType, values: &[f64]) -> Vec<f64> {
    Tensor::from_f64(dtype, &[values.len()], values)
        .unwrap()
        .values_f64()
        .unwrap()
}

fn encode(format: StorageFormat, values: &[f64]) -> Vec<u32> {
    let mut words = vec![0u32; format.words_for(values.len())];
    for (i, &v) in values.iter().enumerate() {
        if format == StorageFormat::F64 {
            format.store_f64(&mut words, i, v);
        } else {
            // Exact: every value is already one of the format's.
            format.store(&mut words, i, v as f32);
        }
    }
    words
}

fn decode(format: StorageFormat, words: &[u32], len: usize) -> Vec<f64> {
    (0..len).map(|i| format.load_f64(words, i)).collect()
}

fn same_bits(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// torch's `s.lerp_(e, w)` for one element, as ATen's `lerp_vec` computes it: in float32 for
/// the 32- and 16-bit formats (the weight, the difference and one fused multiply-add), in
/// float64 for float64, then rounded to the dtype.
fn torch_lerp(dtype: DType, s: f64, e: f64, w: f64) -> f64 {
    let small = w.abs() < 0.5;
    let exact = if dtype == DType::Float64 {
        let (c, base) = if small { (w, s) } else { (w - 1.0, e) };
        c.mul_add(e - s, base)
    } else {
        let (s, e, w) = (s as f32, e as f32, w as f32);
        let (c, base) = if small { (w, s) } else { (w - 1.0, e) };
        f64::from(c.mul_add(e - s, base))
    };
    rounded(dtype, &[exact])[0]
}

#[test]
fn lerp_kernel_matches_torch_lerp_bit_for_bit() {
    let mut rng = Rng(distopt::rng::SplitMix64::from_state(7));
    let formats = [
        StorageFormat::F32,
        StorageFormat::F16,
        StorageFormat::BF16,
        StorageFormat::F64,
    ];
    for (label, backend) in backends() {
        for format in formats {
            let dtype = dtype_of(format);
            for (ranks, rank_len, weight) in [
                (1usize, 64usize, 0.5),
                (3, 192, 0.3),
                (2, 1024, 0.9),
                (4, 704, 1.0),
                (2, 128, 0.0),
                (1, 256, 0.499),
            ] {
                let chunk_len = backend.chunk_len(rank_len, ranks);
                let mut params = backend
                    .create_arena(format, ranks, rank_len, chunk_len)
                    .unwrap();
                let mut end = backend
                    .create_arena(format, ranks, rank_len, chunk_len)
                    .unwrap();
                // Parameters of 1 to 4 slots of 64 elements; some of them not merged.
                let mut starts = Vec::new();
                let mut next = 0;
                while next < rank_len {
                    starts.push(next as u32);
                    next = (next + 64 * (1 + rng.next_u64() as usize % 4)).min(rank_len);
                }
                let mut active: Vec<bool> = starts
                    .iter()
                    .map(|_| !rng.next_u64().is_multiple_of(3))
                    .collect();
                active[0] = true;
                let param_of = |i: usize| starts.iter().rposition(|&s| s as usize <= i).unwrap();
                let starts = ParamStarts(starts.clone());
                let mut s_values = Vec::new();
                let mut e_values = Vec::new();
                for rank in 0..ranks {
                    let s = rounded(
                        dtype,
                        &(0..rank_len).map(|_| rng.value()).collect::<Vec<_>>(),
                    );
                    // Ends near the parameters (small differences, cancellation) or anywhere
                    // (differences the format cannot hold).
                    let e: Vec<f64> = s
                        .iter()
                        .map(|&x| {
                            if rng.next_u64().is_multiple_of(2) {
                                x * (1.0 + rng.unit() * 1e-3)
                            } else {
                                rng.value()
                            }
                        })
                        .collect();
                    let e = rounded(dtype, &e);
                    params.write(rank, 0, &encode(format, &s)).unwrap();
                    end.write(rank, 0, &encode(format, &e)).unwrap();
                    s_values.push(s);
                    e_values.push(e);
                }
                backend
                    .lerp(LerpArgs {
                        params: &mut params,
                        end: &end,
                        starts: &starts,
                        active: &active,
                        weight,
                    })
                    .unwrap();
                let what = format!(
                    "{label} {format:?} {ranks}x{rank_len} (chunk {chunk_len}), weight {weight}"
                );
                let p_words = pollster::block_on(params.read_all()).unwrap();
                let e_words = pollster::block_on(end.read_all()).unwrap();
                let rank_words = format.words_for(rank_len);
                for rank in 0..ranks {
                    let words = rank * rank_words..(rank + 1) * rank_words;
                    let got = decode(format, &p_words[words.clone()], rank_len);
                    let got_e = decode(format, &e_words[words], rank_len);
                    for i in 0..rank_len {
                        let (s, e) = (s_values[rank][i], e_values[rank][i]);
                        assert!(same_bits(got_e[i], e), "{what}: end[{rank}][{i}] changed");
                        let want = if active[param_of(i)] {
                            torch_lerp(dtype, s, e, weight)
                        } else {
                            s
                        };
                        assert!(
                            same_bits(got[i], want),
                            "{what}: params[{rank}][{i}] = lerp({s}, {e}) gave {}, expected {want}",
                            got[i]
                        );
                    }
                }
            }
        }
    }
}

/// The group average in both of its orders, on every backend (chunked GPU arenas included),
/// bit for bit the plain-Rust reference on a host arena: each value divided then summed
/// (PyTorch's averagers), or summed then divided (DiLoCo's all-reduce, torchft's), in the
/// format's own precision (DiLoCo's) or float32 (the averagers' promotion of 16-bit values).
/// For three ranks the two orders give different means: the order is honoured, not ignored.
#[test]
fn average_kernel_divides_each_value_or_the_sum_bit_for_bit_the_reference() {
    let mut rng = Rng(distopt::rng::SplitMix64::from_state(12));
    let host = CpuBackend::new();
    for (label, backend) in backends() {
        for format in [
            StorageFormat::F32,
            StorageFormat::F16,
            StorageFormat::BF16,
            StorageFormat::F64,
        ] {
            let dtype = dtype_of(format);
            let ariths = match format {
                StorageFormat::F16 | StorageFormat::BF16 => vec![format, StorageFormat::F32],
                _ => vec![format],
            };
            for arith in ariths {
                for (ranks, group_size, rank_len) in
                    [(3, 3, 320), (6, 3, 192), (4, 2, 704), (2, 1, 192)]
                {
                    let starts = ParamStarts(vec![0, 64, 128]);
                    let active = [true, false, true];
                    let values: Vec<Vec<f64>> = (0..ranks)
                        .map(|_| {
                            // Values a few units apart (sums that cancel) and any values.
                            let v: Vec<f64> = (0..rank_len)
                                .map(|i| {
                                    if i % 2 == 0 {
                                        1.0 + (rng.next_u64() % 9) as f64 * 2f64.powi(-10)
                                    } else {
                                        rng.value()
                                    }
                                })
                                .collect();
                            rounded(dtype, &v)
                        })
                        .collect();
                    let mut means = Vec::new();
                    for order in [MeanOrder::DivideThenSum, MeanOrder::SumThenDivide] {
                        let run = |backend: &dyn Backend, reference: bool| {
                            let chunk_len = backend.chunk_len(rank_len, ranks);
                            let mut arena = backend
                                .create_arena(format, ranks, rank_len, chunk_len)
                                .unwrap();
                            for (rank, v) in values.iter().enumerate() {
                                arena.write(rank, 0, &encode(format, v)).unwrap();
                            }
                            let args = AverageArgs {
                                arena: &mut arena,
                                group_size,
                                arith,
                                starts: &starts,
                                active: &active,
                                order,
                            };
                            if reference {
                                average_reference(args).unwrap();
                            } else {
                                backend.average(args).unwrap();
                            }
                            let words = pollster::block_on(arena.read_all()).unwrap();
                            decode(format, &words, ranks * rank_len)
                        };
                        let want = run(&host, true);
                        let got = run(backend.as_ref(), false);
                        let what = format!(
                            "{label} {format:?} in {arith:?}, {ranks} ranks in groups of {group_size}, {order:?}"
                        );
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert!(
                                same_bits(*g, *w),
                                "{what}: element {i}: {g}, the reference {w}"
                            );
                        }
                        means.push(want);
                    }
                    if group_size == 3 && arith == format && format != StorageFormat::F64 {
                        assert_ne!(means[0], means[1], "{label} {format:?}: the orders agree");
                    }
                }
            }
        }
    }
}

const WORLD: usize = 3;
const STEPS: usize = 7;
const SYNC_EVERY: i64 = 3;

fn shapes() -> Vec<(DType, Vec<usize>)> {
    vec![
        (DType::Float32, vec![5]),
        (DType::BFloat16, vec![3, 2]),
        (DType::Float32, vec![]),
        (DType::Float16, vec![4]),
        (DType::Float64, vec![2]),
    ]
}

fn initial_params() -> Vec<Tensor> {
    let mut rng = Rng(distopt::rng::SplitMix64::from_state(11));
    shapes()
        .iter()
        .map(|(dtype, shape)| {
            let n = shape.iter().product();
            Tensor::from_f64(
                *dtype,
                shape,
                &(0..n).map(|_| rng.unit()).collect::<Vec<_>>(),
            )
            .unwrap()
        })
        .collect()
}

/// `grads[t][rank][j]`, some missing.
fn all_grads() -> Vec<Vec<Vec<Option<Tensor>>>> {
    let mut rng = Rng(distopt::rng::SplitMix64::from_state(23));
    (0..STEPS)
        .map(|t| {
            (0..WORLD)
                .map(|rank| {
                    shapes()
                        .iter()
                        .enumerate()
                        .map(|(j, (dtype, shape))| {
                            let n: usize = shape.iter().product();
                            let values: Vec<f64> = (0..n).map(|_| rng.unit()).collect();
                            ((t + rank + j) % 4 != 0)
                                .then(|| Tensor::from_f64(*dtype, shape, &values).unwrap())
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

fn fresh(backend: &Arc<dyn Backend>, per_rank: &[Vec<Tensor>]) -> (Replicas, DiLoCo) {
    let world: Arc<dyn Communicator> = Arc::new(SimulatedWorld::new(WORLD).unwrap());
    let replicas = Replicas::new(backend.clone(), per_rank).unwrap();
    let inner = common::optimizer(
        &replicas,
        "AdamW",
        json!({"lr": 0.02, "betas": [0.9, 0.95], "weight_decay": 0.1, "amsgrad": true}),
    );
    let outer = common::optimizer(
        &replicas,
        "SGD",
        json!({"lr": 0.7, "momentum": 0.9, "nesterov": true}),
    );
    let diloco = DiLoCo::new(&replicas, inner, outer, SYNC_EVERY, world).unwrap();
    (replicas, diloco)
}

fn step(replicas: &mut Replicas, diloco: &mut DiLoCo, grads: &[Vec<Option<Tensor>>]) -> bool {
    diloco.zero_grad(replicas);
    for (rank, g) in grads.iter().enumerate() {
        replicas.set_grads(rank, g).unwrap();
    }
    diloco.step(replicas).unwrap()
}

/// Every rank's parameters as (dtype, bits) per element.
fn param_bits(replicas: &Replicas) -> Vec<Vec<Vec<u64>>> {
    replicas
        .all_params()
        .block_on()
        .unwrap()
        .iter()
        .map(|rank| {
            rank.iter()
                .map(|t| {
                    t.values_f64()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect()
                })
                .collect()
        })
        .collect()
}

#[test]
fn a_run_resumed_from_a_state_dict_at_any_step_has_the_straight_runs_bits() {
    let grads = all_grads();
    for (label, backend) in backends().into_iter().take(2) {
        let (mut replicas, mut diloco) = fresh(&backend, &vec![initial_params(); WORLD]);
        let mut straight = Vec::new();
        let mut synced = Vec::new();
        for (t, g) in grads.iter().enumerate() {
            if step(&mut replicas, &mut diloco, g) {
                synced.push(t);
            }
            straight.push(param_bits(&replicas));
        }
        assert_eq!(synced, [2, 5], "{label}");
        // Between syncs the ranks drift apart; right after one they agree.
        assert_ne!(straight[3][0], straight[3][1], "{label}");
        assert_eq!(straight[5][0], straight[5][2], "{label}");
        let final_states: Vec<Value> = (0..WORLD)
            .map(|r| diloco.state_dict(&replicas, r).block_on().unwrap())
            .collect();
        for stop in 1..STEPS {
            let (mut replicas, mut diloco) = fresh(&backend, &vec![initial_params(); WORLD]);
            for g in &grads[..stop] {
                step(&mut replicas, &mut diloco, g);
            }
            let saved: Vec<Value> = (0..WORLD)
                .map(|r| diloco.state_dict(&replicas, r).block_on().unwrap())
                .collect();
            assert_eq!(
                saved[0]["local_step"],
                json!(stop as i64 % SYNC_EVERY),
                "{label} stop {stop}"
            );
            // The model's parameters are saved apart from the optimizer, as in PyTorch.
            let params = replicas.all_params().block_on().unwrap();
            drop((replicas, diloco));
            let (mut replicas, mut diloco) = fresh(&backend, &params);
            for (rank, sd) in saved.iter().enumerate() {
                // Through text, as a checkpoint file would carry it.
                let sd: Value = serde_json::from_str(&sd.to_string()).unwrap();
                diloco.load_state_dict(&mut replicas, rank, &sd).unwrap();
            }
            assert_eq!(diloco.local_step(), stop as u64 % SYNC_EVERY as u64);
            for (t, g) in grads.iter().enumerate().skip(stop) {
                step(&mut replicas, &mut diloco, g);
                assert_eq!(
                    param_bits(&replicas),
                    straight[t],
                    "{label}: resumed after step {stop}, params after step {t}"
                );
            }
            for (rank, want) in final_states.iter().enumerate() {
                assert_eq!(
                    &diloco.state_dict(&replicas, rank).block_on().unwrap(),
                    want,
                    "{label}: resumed after step {stop}, final state dict of rank {rank}"
                );
            }
        }
    }
}

#[test]
fn a_sync_all_reduces_every_parameter_once_in_its_dtype() {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let world = Arc::new(SimulatedWorld::new(4).unwrap());
    let params = vec![
        Tensor::from_f32(&[10], vec![1.0; 10]).unwrap(),
        Tensor::from_f64(DType::BFloat16, &[6], &[2.0; 6]).unwrap(),
    ];
    let mut replicas = Replicas::replicate(backend, 4, &params).unwrap();
    let inner = common::optimizer(&replicas, "SGD", json!({"lr": 0.5}));
    let outer = common::optimizer(&replicas, "SGD", json!({"lr": 1.0}));
    let mut diloco = DiLoCo::new(&replicas, inner, outer, 2, world.clone()).unwrap();
    let grads = |rank: usize| {
        vec![
            Some(Tensor::from_f32(&[10], vec![rank as f32; 10]).unwrap()),
            None,
        ]
    };
    let per_step: Vec<Vec<Option<Tensor>>> = (0..4).map(grads).collect();
    assert!(!step(&mut replicas, &mut diloco, &per_step));
    assert_eq!(world.stats().collectives, 0);
    assert!(step(&mut replicas, &mut diloco, &per_step));
    let stats = world.stats();
    // One ring all-reduce per storage format over the 4 ranks: 2·3/4 of 40 and of 12 bytes.
    assert_eq!(stats.collectives, 2);
    assert_eq!(
        stats.all_reduce_bytes_by_group_size.get(&4).copied(),
        Some(60 + 18)
    );
    assert_eq!(stats.broadcast_bytes + stats.gather_bytes, 0);
    // Outer SGD with lr 1 lands on the mean: 1 - 0.5·2·mean(0, 1, 2, 3) = -0.5; the
    // parameter without gradients never moved.
    for rank in 0..4 {
        assert_eq!(
            replicas
                .param(rank, 0)
                .block_on()
                .unwrap()
                .values_f64()
                .unwrap(),
            vec![-0.5; 10]
        );
        assert_eq!(
            replicas
                .param(rank, 1)
                .block_on()
                .unwrap()
                .values_f64()
                .unwrap(),
            vec![2.0; 6]
        );
        // The outer step cleared the gradients.
        assert!(!replicas.has_grad(rank, 0) && !replicas.has_grad(rank, 1));
    }
}

#[test]
fn bad_arguments_and_state_dicts_are_typed_errors() {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let world: Arc<dyn Communicator> = Arc::new(SimulatedWorld::new(2).unwrap());
    let w = Tensor::from_f32(&[3], vec![1.0, 2.0, 3.0]).unwrap();
    let mut replicas = Replicas::replicate(backend.clone(), 2, std::slice::from_ref(&w)).unwrap();
    let sgd = |r: &Replicas| common::optimizer(r, "SGD", json!({"lr": 0.1}));
    for bad in [0, -1] {
        let err = DiLoCo::new(
            &replicas,
            sgd(&replicas),
            sgd(&replicas),
            bad,
            world.clone(),
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueError);
        assert_eq!(
            err.message(),
            format!("sync_every must be a positive integer, got {bad}")
        );
    }
    let three = Replicas::replicate(backend.clone(), 3, std::slice::from_ref(&w)).unwrap();
    let err = DiLoCo::new(&three, sgd(&three), sgd(&three), 2, world.clone()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ValueError);
    assert!(err.message().contains("3 ranks"), "{}", err.message());

    let mut diloco =
        DiLoCo::new(&replicas, sgd(&replicas), sgd(&replicas), 2, world.clone()).unwrap();
    let mut other = Replicas::replicate(backend, 2, &[w.clone(), w]).unwrap();
    let err = diloco.step(&mut other).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ValueError);

    let good = diloco.state_dict(&replicas, 1).block_on().unwrap();
    assert_eq!(good["local_step"], json!(0));
    assert_eq!(
        good["original_parameters"][0]["data"],
        json!([1.0, 2.0, 3.0])
    );
    let mut without_step = good.clone();
    without_step.as_object_mut().unwrap().remove("local_step");
    let mut wrong_shape = good.clone();
    wrong_shape["original_parameters"][0] =
        json!({"dtype": "float32", "shape": [2], "data": [1.0, 2.0]});
    let mut wrong_count = good.clone();
    wrong_count["original_parameters"] = json!([]);
    let mut negative = good.clone();
    negative["local_step"] = json!(-1);
    for (sd, text) in [
        (&without_step, "has no \"local_step\""),
        (&wrong_shape, "original_parameters[0] is float32 [2]"),
        (&wrong_count, "has 0 tensors, the model has 1 parameters"),
        (&negative, "\"local_step\" must be a non-negative integer"),
    ] {
        let err = diloco.load_state_dict(&mut replicas, 0, sd).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueError, "{}", err.message());
        assert!(err.message().contains(text), "{}", err.message());
    }
    let err = diloco.load_state_dict(&mut replicas, 2, &good).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::IndexError);
    diloco.load_state_dict(&mut replicas, 0, &good).unwrap();
}

/// A streaming run's parameters after every step, and the fragments each step synced.
type Trajectory = (Vec<Vec<Vec<Vec<u64>>>>, Vec<Vec<usize>>);

fn run_streaming(
    backend: &Arc<dyn Backend>,
    fragments: Option<Vec<Vec<usize>>>,
    outer: Value,
    world: Arc<dyn Communicator>,
) -> Trajectory {
    let mut replicas = Replicas::replicate(backend.clone(), WORLD, &initial_params()).unwrap();
    let inner = common::optimizer(&replicas, "SGD", json!({"lr": 0.05, "momentum": 0.9}));
    let outer = common::optimizer(&replicas, "SGD", outer);
    let mut diloco = match fragments {
        Some(f) => DiLoCo::streaming(&replicas, inner, outer, SYNC_EVERY, f, world).unwrap(),
        None => DiLoCo::new(&replicas, inner, outer, SYNC_EVERY, world).unwrap(),
    };
    let mut params = Vec::new();
    let mut synced = Vec::new();
    for g in all_grads() {
        diloco.zero_grad(&mut replicas);
        for (rank, g) in g.iter().enumerate() {
            replicas.set_grads(rank, g).unwrap();
        }
        synced.push(diloco.step_fragments(&mut replicas).unwrap());
        params.push(param_bits(&replicas));
    }
    (params, synced)
}

fn world() -> Arc<dyn Communicator> {
    Arc::new(SimulatedWorld::new(WORLD).unwrap())
}

#[test]
fn streaming_with_one_fragment_is_plain_diloco_bit_for_bit() {
    let outer = json!({"lr": 0.7, "momentum": 0.9, "nesterov": true});
    for (label, backend) in backends().into_iter().take(2) {
        let plain = run_streaming(&backend, None, outer.clone(), world());
        let one = distopt::diloco::split_fragments(shapes().len(), 1).unwrap();
        let streaming = run_streaming(&backend, Some(one), outer.clone(), world());
        assert_eq!(plain.1[2], [0], "{label}");
        assert_eq!(plain, streaming, "{label}");
    }
}

#[test]
fn streaming_fragments_sync_staggered_each_parameter_once_per_period() {
    const H: i64 = 6;
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let params = initial_params();
    let per_rank_bytes: u64 = params
        .iter()
        .map(|t| (t.numel() * t.dtype().size_bytes()) as u64)
        .sum();
    let fragments = distopt::diloco::split_fragments(params.len(), 3).unwrap();
    assert_eq!(fragments, [vec![0], vec![1, 2], vec![3, 4]]);
    let world = Arc::new(SimulatedWorld::new(WORLD).unwrap());
    let mut replicas = Replicas::replicate(backend, WORLD, &params).unwrap();
    let inner = common::optimizer(&replicas, "SGD", json!({"lr": 0.05}));
    let outer = common::optimizer(&replicas, "SGD", json!({"lr": 1.0}));
    let mut diloco =
        DiLoCo::streaming(&replicas, inner, outer, H, fragments.clone(), world.clone()).unwrap();
    assert_eq!(diloco.sync_schedule(), [2, 4, 0]);
    let mut rng = Rng(distopt::rng::SplitMix64::from_state(5));
    for period in 0..3 {
        let mut synced_params = Vec::new();
        for step in 1..=H as u64 {
            diloco.zero_grad(&mut replicas);
            for rank in 0..WORLD {
                let grads: Vec<Option<Tensor>> = params
                    .iter()
                    .map(|t| {
                        let values: Vec<f64> = (0..t.numel()).map(|_| rng.unit()).collect();
                        Some(Tensor::from_f64(t.dtype(), t.shape(), &values).unwrap())
                    })
                    .collect();
                replicas.set_grads(rank, &grads).unwrap();
            }
            let synced = diloco.step_fragments(&mut replicas).unwrap();
            let expected: Vec<usize> = match step {
                2 => vec![0],
                4 => vec![1],
                6 => vec![2],
                _ => vec![],
            };
            assert_eq!(synced, expected, "period {period}, step {step}");
            let now = param_bits(&replicas);
            for (j, _) in params.iter().enumerate() {
                // A parameter just synced is the same on every rank; one that has taken an
                // inner step since its last sync differs between ranks.
                let same = now.iter().all(|rank| rank[j] == now[0][j]);
                let just_synced = synced.iter().any(|&f| fragments[f].contains(&j));
                assert_eq!(same, just_synced, "period {period}, step {step}, param {j}");
            }
            synced_params.extend(synced.iter().flat_map(|&f| fragments[f].clone()));
        }
        synced_params.sort_unstable();
        assert_eq!(synced_params, [0, 1, 2, 3, 4], "period {period}");
        // Over a period, the all-reduces moved one whole model per rank (ring: 2·(W−1)/W).
        let stats = world.stats();
        let per_format: u64 = stats.all_reduce_bytes_by_group_size.values().sum();
        let expected = 2 * (WORLD as u64 - 1) * per_rank_bytes / WORLD as u64;
        assert!(
            per_format.abs_diff(expected) <= 4,
            "period {period}: {per_format} bytes, a whole model is {expected}"
        );
        world.reset_stats();
    }
    let err = DiLoCo::streaming(
        &replicas,
        common::optimizer(&replicas, "SGD", json!({"lr": 0.1})),
        common::optimizer(&replicas, "SGD", json!({"lr": 0.1})),
        2,
        fragments.clone(),
        world.clone(),
    )
    .unwrap_err();
    assert_eq!(
        err.message(),
        "sync_every (2) must be at least the number of fragments (3)"
    );
    for (bad, text) in [
        (
            vec![vec![0, 1], vec![1, 2, 3, 4]],
            "parameter 1 appears in more than one fragment",
        ),
        (
            vec![vec![0, 1], vec![2, 3]],
            "parameter 4 is in no fragment",
        ),
        (vec![vec![0, 1, 2, 3, 4], vec![]], "non-empty lists"),
    ] {
        let err = DiLoCo::streaming(
            &replicas,
            common::optimizer(&replicas, "SGD", json!({"lr": 0.1})),
            common::optimizer(&replicas, "SGD", json!({"lr": 0.1})),
            H,
            bad,
            world.clone(),
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueError);
        assert!(err.message().contains(text), "{}", err.message());
    }
}

#[test]
fn a_streaming_sync_with_outer_sgd_lr_1_averages_the_fragment_like_model_averaging() {
    // Outer SGD(lr=1) sets a fragment to backup − mean(backup − params_r): the ranks' mean,
    // within rounding. The same run with PeriodicModelAverager-style averaging of that
    // fragment at the same steps (distopt::averaging::average_parameters) must agree.
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let world = Arc::new(SimulatedWorld::new(4).unwrap());
    let shapes = [vec![7usize], vec![3, 3], vec![], vec![5]];
    let mut rng = Rng(distopt::rng::SplitMix64::from_state(99));
    let params: Vec<Tensor> = shapes
        .iter()
        .map(|s| {
            let n = s.iter().product();
            Tensor::from_f32(s, (0..n).map(|_| rng.unit() as f32).collect()).unwrap()
        })
        .collect();
    let fragments = vec![vec![0, 2], vec![1, 3]];
    let mut a = Replicas::replicate(backend.clone(), 4, &params).unwrap();
    let mut b = Replicas::replicate(backend, 4, &params).unwrap();
    let inner = common::optimizer(&a, "SGD", json!({"lr": 0.1}));
    let outer = common::optimizer(&a, "SGD", json!({"lr": 1.0}));
    let mut diloco =
        DiLoCo::streaming(&a, inner, outer, 4, fragments.clone(), world.clone()).unwrap();
    let mut plain_inner = common::optimizer(&b, "SGD", json!({"lr": 0.1}));
    for _ in 0..12 {
        diloco.zero_grad(&mut a);
        b.zero_grad();
        for rank in 0..4 {
            let grads: Vec<Option<Tensor>> = params
                .iter()
                .map(|t| {
                    let values = (0..t.numel()).map(|_| rng.unit() as f32).collect();
                    Some(Tensor::from_f32(t.shape(), values).unwrap())
                })
                .collect();
            a.set_grads(rank, &grads).unwrap();
            b.set_grads(rank, &grads).unwrap();
        }
        let synced = diloco.step_fragments(&mut a).unwrap();
        plain_inner.step(&mut b).unwrap();
        for &f in &synced {
            distopt::averaging::average_parameters(
                world.as_ref(),
                &mut b,
                distopt::comm::Subgroups::world(4),
                Some(&fragments[f]),
            )
            .unwrap();
        }
        let (pa, pb) = (
            a.all_params().block_on().unwrap(),
            b.all_params().block_on().unwrap(),
        );
        for rank in 0..4 {
            for j in 0..params.len() {
                let (x, y) = (
                    pa[rank][j].values_f64().unwrap(),
                    pb[rank][j].values_f64().unwrap(),
                );
                for (x, y) in x.iter().zip(&y) {
                    assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()), "{x} vs {y}");
                }
            }
        }
    }
}

#[test]
fn the_trainer_runs_diloco_meeting_only_at_syncs() {
    use distopt::train::{Algorithm, SyntheticTask, TaskConfig, TrainConfig, Trainer};
    let ranks = 4;
    let task = Arc::new(SyntheticTask::new(TaskConfig::default(), ranks).unwrap());
    let model_bytes: u64 = task
        .param_shapes()
        .iter()
        .map(|s| 4 * s.iter().product::<usize>() as u64)
        .sum();
    for (label, backend) in backends().into_iter().take(2) {
        let config = TrainConfig {
            algorithm: Algorithm::DiLoCo {
                sync_every: 5,
                fragments: 1,
                compress: Default::default(),
                fragment_sync_delay: 0,
                fragment_update_alpha: None,
            },
            ..TrainConfig::default()
        };
        let mut trainer = Trainer::new(backend, task.clone(), config).unwrap();
        let initial = trainer.evaluate().block_on().unwrap().mean_model_loss;
        for step in 1..=40u64 {
            let report = trainer.step().block_on().unwrap();
            assert_eq!(report.gradients_reduced, None, "{label} step {step}");
            let synced = step.is_multiple_of(5);
            assert_eq!(
                report.averaged,
                synced.then_some(ranks),
                "{label} step {step}"
            );
            // After a sync every replica holds the same parameters; between syncs they drift.
            assert_eq!(report.divergence == 0.0, synced, "{label} step {step}");
            // One ring all-reduce of the whole model per sync, nothing else.
            let syncs = step / 5;
            assert_eq!(
                report.bytes_communicated_per_rank,
                syncs * 2 * (ranks as u64 - 1) * model_bytes / ranks as u64,
                "{label} step {step}"
            );
        }
        let trained = trainer.evaluate().block_on().unwrap();
        assert!(
            trained.mean_model_loss < 0.5 * initial,
            "{label}: loss {initial} -> {}",
            trained.mean_model_loss
        );
    }
}

#[test]
fn distopt_train_algorithm_diloco_reports_its_syncs() {
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(common::distopt_exe())
            .args([
                "train",
                "--algorithm",
                "diloco",
                "--backend",
                "cpu",
                "--ranks",
                "4",
                "--steps",
                "24",
                "--json",
            ])
            .args(extra)
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, stdout, stderr) = run(&["--period", "6"]);
    assert!(ok, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let result = &report["results"][0];
    assert_eq!(result["algorithm"], "diloco", "{report}");
    assert_eq!(result["steps_averaged"], 4);
    assert_eq!(
        result["settings"],
        json!({"kind": "diloco", "sync_every": 6, "fragments": 1})
    );
    let (ok, stdout, stderr) = run(&["--period", "6", "--fragments", "3"]);
    assert!(ok, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    // Streaming: a fragment syncs every 2 steps.
    assert_eq!(report["results"][0]["steps_averaged"], 12);
    assert!(
        report["results"][0]["description"]
            .as_str()
            .unwrap()
            .starts_with("Streaming DiLoCo (3 fragments")
    );
    let (ok, _, stderr) = run(&["--period", "2", "--fragments", "3"]);
    assert!(!ok);
    assert!(
        stderr.contains("sync_every (2) must be at least the number of fragments (3)"),
        "{stderr}"
    );
    // torchft's Streaming DiLoCo knobs: in the settings when set, checked as torchft does.
    let (ok, stdout, stderr) = run(&[
        "--period",
        "6",
        "--fragments",
        "3",
        "--fragment-sync-delay",
        "1",
        "--fragment-update-alpha",
        "0.5",
    ]);
    assert!(ok, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let result = &report["results"][0];
    assert_eq!(result["steps_averaged"], 12);
    assert_eq!(
        result["settings"],
        json!({"kind": "diloco", "sync_every": 6, "fragments": 3,
               "fragment_sync_delay": 1, "fragment_update_alpha": 0.5})
    );
    let (ok, _, stderr) = run(&[
        "--period",
        "6",
        "--fragments",
        "3",
        "--fragment-sync-delay",
        "2",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("Fragment must be synced before it is reduced another time"),
        "{stderr}"
    );
}

/// The parameters of the compression tests: every dtype, sizes spanning several chunks of
/// the tiny-binding GPU backend.
fn compression_params(rng: &mut Rng) -> Vec<Tensor> {
    [
        (DType::Float32, 700usize),
        (DType::BFloat16, 300),
        (DType::Float16, 260),
        (DType::Float64, 70),
        (DType::Float32, 3),
    ]
    .iter()
    .map(|&(dtype, n)| {
        let values: Vec<f64> = (0..n).map(|_| rng.unit()).collect();
        Tensor::from_f64(dtype, &[n], &values).unwrap()
    })
    .collect()
}

/// A gradient for the inner step: magnitudes over many binades, a few beyond float16's range
/// (their float16 pseudo-gradients overflow to ±inf on the wire), a few tiny (float16
/// subnormals).
fn compression_grad(rng: &mut Rng, like: &Tensor) -> Tensor {
    let n = like.shape().iter().product::<usize>();
    let values: Vec<f64> = (0..n)
        .map(|i| match i % 37 {
            0 if like.dtype() != DType::Float16 => rng.unit() * 2e5,
            1 => rng.unit() * 1e-6,
            _ => rng.unit() * 2f64.powi((rng.next_u64() % 24) as i32 - 14),
        })
        .collect();
    Tensor::from_f64(like.dtype(), like.shape(), &values).unwrap()
}

/// `value` rounded once to `format` (c10's round to nearest even), as an exact f64.
fn round_to(format: StorageFormat, value: f64) -> f64 {
    let mut words = [0u32; 2];
    format.store_f64(&mut words, 0, value);
    format.load_f64(&words, 0)
}

/// The world's mean of `values` (one per rank) as the compressed all-reduce is documented
/// to compute it (torchft's all-reduce: the sum, then the division), written out on the host:
/// summed in rank order with every addition rounded to the wire format, then divided by the
/// world size and rounded to it.
fn wire_mean(wire: StorageFormat, values: &[f64]) -> f64 {
    let w = values.len() as f32;
    let sum = values[1..].iter().fold(values[0], |acc, &v| {
        round_to(wire, (acc as f32 + v as f32) as f64)
    });
    round_to(wire, ((sum as f32) / w) as f64)
}

/// The initial parameters, `before[rank][j]` (the parameters before the sync), `after[j]`
/// (rank 0's after it; every rank agrees) and the `DiLoCo`.
type OneSync = (Vec<Tensor>, Vec<Vec<Vec<f64>>>, Vec<Vec<f64>>, DiLoCo);

/// One sync with outer SGD lr 1 (parameters land on `backup - mean`): every rank's
/// parameters before the sync and after it.
fn one_compressed_sync(backend: &Arc<dyn Backend>, compression: Compression) -> OneSync {
    let mut rng = Rng(distopt::rng::SplitMix64::from_state(97));
    let initial = compression_params(&mut rng);
    let mut replicas = Replicas::replicate(backend.clone(), WORLD, &initial).unwrap();
    let inner = common::optimizer(&replicas, "SGD", json!({"lr": 1.0}));
    let outer = common::optimizer(&replicas, "SGD", json!({"lr": 1.0}));
    let mut diloco = DiLoCo::new(&replicas, inner, outer, 2, world())
        .unwrap()
        .with_compression(compression);
    let grads: Vec<Vec<Option<Tensor>>> = (0..WORLD)
        .map(|_| {
            initial
                .iter()
                .map(|p| Some(compression_grad(&mut rng, p)))
                .collect()
        })
        .collect();
    assert!(!step(&mut replicas, &mut diloco, &grads));
    let before: Vec<Vec<Vec<f64>>> = replicas
        .all_params()
        .block_on()
        .unwrap()
        .iter()
        .map(|rank| rank.iter().map(|t| t.values_f64().unwrap()).collect())
        .collect();
    let none = vec![vec![None; initial.len()]; WORLD];
    assert!(step(&mut replicas, &mut diloco, &none));
    let after: Vec<Vec<f64>> = (0..initial.len())
        .map(|j| {
            let p0 = replicas
                .param(0, j)
                .block_on()
                .unwrap()
                .values_f64()
                .unwrap();
            for rank in 1..WORLD {
                let p = replicas
                    .param(rank, j)
                    .block_on()
                    .unwrap()
                    .values_f64()
                    .unwrap();
                assert!(
                    p.iter().zip(&p0).all(|(a, b)| same_bits(*a, *b)),
                    "param {j}: ranks disagree after a sync"
                );
            }
            p0
        })
        .collect();
    (initial, before, after, diloco)
}

#[test]
fn a_compressed_sync_is_the_host_computation_of_its_rounding_rule_on_every_backend() {
    for compression in [Compression::BFloat16, Compression::Float16] {
        let wire = compression.wire_format().unwrap();
        for (label, backend) in backends() {
            let (initial, before, after, diloco) = one_compressed_sync(&backend, compression);
            assert_eq!(diloco.compression(), compression);
            let mut changed_by_compression = 0;
            for (j, p) in initial.iter().enumerate() {
                let format = p.dtype().storage();
                let p0 = p.values_f64().unwrap();
                for (i, &o) in p0.iter().enumerate() {
                    // The pseudo-gradient in the parameter's dtype (f32 arithmetic for the
                    // 32- and 16-bit formats, f64 for float64), then onto the wire.
                    let pseudo: Vec<f64> = (0..WORLD)
                        .map(|r| {
                            let x = before[r][j][i];
                            let d = if format == StorageFormat::F64 {
                                o - x
                            } else {
                                (o as f32 - x as f32) as f64
                            };
                            round_to(wire, round_to(format, d))
                        })
                        .collect();
                    // Back in the parameter's dtype: exact for float32/float64, rounded
                    // between bfloat16 and float16.
                    let mean = round_to(format, wire_mean(wire, &pseudo));
                    // Outer SGD lr 1: backup - mean in the format.
                    let want = if format == StorageFormat::F64 {
                        o - mean
                    } else {
                        round_to(format, (o as f32 - mean as f32) as f64)
                    };
                    let got = after[j][i];
                    assert!(
                        same_bits(got, want),
                        "{label} {compression:?}: param {j} ({:?}) element {i}: got {got}, want {want} (pseudo {pseudo:?})",
                        p.dtype()
                    );
                    // Within the wire format's rounding of the exact mean (finite cases).
                    let exact: f64 =
                        (0..WORLD).map(|r| o - before[r][j][i]).sum::<f64>() / WORLD as f64;
                    let ulp_of = |f: StorageFormat| match f {
                        StorageFormat::BF16 => 2f64.powi(-8),
                        StorageFormat::F16 => 2f64.powi(-11),
                        _ => 0.0,
                    };
                    let ulp = ulp_of(wire).max(ulp_of(format));
                    // Each of the W quotients and W - 1 additions rounds by at most half an
                    // ulp of the largest magnitude involved; so does the final parameter.
                    let scale = (0..WORLD)
                        .map(|r| (o - before[r][j][i]).abs())
                        .fold(o.abs().max(got.abs()), f64::max);
                    if got.is_finite() && scale < 1e4 {
                        let err = ((o - got) - exact).abs();
                        assert!(
                            // float16 subnormals: an absolute floor of a few 2^-24.
                            err <= 2.0 * WORLD as f64 * ulp * scale + 2f64.powi(-21),
                            "{label} {compression:?}: param {j} element {i}: mean {} vs exact {exact}",
                            o - got
                        );
                    }
                    if format != wire && !same_bits(round_to(format, o - exact), got) {
                        changed_by_compression += 1;
                    }
                }
            }
            // The compression is real: many float32/float64 results differ from the exact mean's.
            assert!(
                changed_by_compression > 100,
                "{label} {compression:?}: {changed_by_compression}"
            );
        }
    }
}

#[test]
fn compression_off_is_bit_identical_and_a_wire_format_equal_to_the_dtype_changes_nothing() {
    for (label, backend) in backends().into_iter().take(2) {
        let default = one_compressed_sync(&backend, Compression::None);
        let bf16 = one_compressed_sync(&backend, Compression::BFloat16);
        // The bfloat16 parameter (index 1) is sent as it is either way; the others are not.
        assert_eq!(default.2[1], bf16.2[1], "{label}");
        assert_ne!(default.2[0], bf16.2[0], "{label}");
        // Compression::None takes the uncompressed path: the reference all-reduce in each
        // parameter's dtype, bit for bit (the trajectory of a run that never set it).
        let outer = json!({"lr": 0.7, "momentum": 0.9, "nesterov": true});
        let plain = run_streaming(&backend, None, outer.clone(), world());
        let mut replicas = Replicas::replicate(backend.clone(), WORLD, &initial_params()).unwrap();
        let inner = common::optimizer(&replicas, "SGD", json!({"lr": 0.05, "momentum": 0.9}));
        let outer_opt = common::optimizer(&replicas, "SGD", outer);
        let mut diloco = DiLoCo::new(&replicas, inner, outer_opt, SYNC_EVERY, world()).unwrap();
        diloco.set_compression(Compression::BFloat16);
        diloco.set_compression(Compression::None);
        let mut params = Vec::new();
        for g in all_grads() {
            diloco.zero_grad(&mut replicas);
            for (rank, g) in g.iter().enumerate() {
                replicas.set_grads(rank, g).unwrap();
            }
            diloco.step_fragments(&mut replicas).unwrap();
            params.push(param_bits(&replicas));
        }
        assert_eq!(plain.0, params, "{label}");
    }
}

#[test]
fn comm_stats_count_two_bytes_per_element_when_compressed() {
    for (compression, expected) in [
        // 2·3/4 of 10·4, 6·2 and 4·8 bytes: each format in its own dtype.
        (Compression::None, 60 + 18 + 48),
        // 2·3/4 of 10·2, 6·2 and 4·2 bytes.
        (Compression::BFloat16, 30 + 18 + 12),
        (Compression::Float16, 30 + 18 + 12),
    ] {
        for (label, backend) in backends().into_iter().take(2) {
            let world = Arc::new(SimulatedWorld::new(4).unwrap());
            let params = vec![
                Tensor::from_f32(&[10], vec![1.0; 10]).unwrap(),
                Tensor::from_f64(DType::BFloat16, &[6], &[2.0; 6]).unwrap(),
                Tensor::from_f64(DType::Float64, &[4], &[3.0; 4]).unwrap(),
            ];
            let mut replicas = Replicas::replicate(backend, 4, &params).unwrap();
            let inner = common::optimizer(&replicas, "SGD", json!({"lr": 0.5}));
            let outer = common::optimizer(&replicas, "SGD", json!({"lr": 1.0}));
            let mut diloco = DiLoCo::new(&replicas, inner, outer, 1, world.clone())
                .unwrap()
                .with_compression(compression);
            let grads: Vec<Vec<Option<Tensor>>> = (0..4)
                .map(|rank| {
                    params
                        .iter()
                        .map(|p| {
                            let n = p.shape()[0];
                            Some(Tensor::from_f64(p.dtype(), &[n], &vec![rank as f64; n]).unwrap())
                        })
                        .collect()
                })
                .collect();
            assert!(step(&mut replicas, &mut diloco, &grads));
            let stats = world.stats();
            assert_eq!(stats.collectives, 3, "{label} {compression:?}");
            assert_eq!(
                stats.all_reduce_bytes_by_group_size.get(&4).copied(),
                Some(expected),
                "{label} {compression:?}"
            );
            // 1 - 0.5·mean(0, 1, 2, 3) = 0.25 exactly in every wire format.
            assert_eq!(
                replicas
                    .param(3, 0)
                    .block_on()
                    .unwrap()
                    .values_f64()
                    .unwrap(),
                vec![0.25; 10],
                "{label} {compression:?}"
            );
            assert_eq!(
                replicas
                    .param(2, 2)
                    .block_on()
                    .unwrap()
                    .values_f64()
                    .unwrap(),
                vec![2.25; 4],
                "{label} {compression:?}"
            );
        }
    }
}

#[test]
fn the_trainer_converges_with_compressed_pseudo_gradients() {
    use distopt::train::{Algorithm, SyntheticTask, TaskConfig, TrainConfig, Trainer};
    let ranks = 4;
    let task = Arc::new(SyntheticTask::new(TaskConfig::default(), ranks).unwrap());
    let model_elements: u64 = task
        .param_shapes()
        .iter()
        .map(|s| s.iter().product::<usize>() as u64)
        .sum();
    for compress in [Compression::BFloat16, Compression::Float16] {
        for (label, backend) in backends().into_iter().take(2) {
            let config = TrainConfig {
                algorithm: Algorithm::DiLoCo {
                    sync_every: 5,
                    fragments: 1,
                    compress,
                    fragment_sync_delay: 0,
                    fragment_update_alpha: None,
                },
                ..TrainConfig::default()
            };
            let mut trainer = Trainer::new(backend, task.clone(), config).unwrap();
            let initial = trainer.evaluate().block_on().unwrap().mean_model_loss;
            let mut report = None;
            for _ in 0..40 {
                report = Some(trainer.step().block_on().unwrap());
            }
            // Eight syncs of the float32 model at 2 bytes per element.
            assert_eq!(
                report.unwrap().bytes_communicated_per_rank,
                8 * 2 * (ranks as u64 - 1) * 2 * model_elements / ranks as u64,
                "{label} {compress:?}"
            );
            let trained = trainer.evaluate().block_on().unwrap().mean_model_loss;
            assert!(
                trained < 0.5 * initial,
                "{label} {compress:?}: loss {initial} -> {trained}"
            );
        }
    }
}

#[test]
fn distopt_train_compress_sends_half_the_bytes() {
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(common::distopt_exe())
            .args(["train", "--backend", "cpu", "--ranks", "4", "--steps", "12"])
            .args(["--period", "6", "--json"])
            .args(extra)
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            stderr,
        )
    };
    let bytes = |stdout: &str| {
        let report: Value = serde_json::from_str(stdout).unwrap();
        report["results"][0]["bytes_communicated_per_rank"]
            .as_u64()
            .unwrap()
    };
    let (ok, plain, stderr) = run(&["--algorithm", "diloco"]);
    assert!(ok, "{stderr}");
    for wire in ["bf16", "f16"] {
        let (ok, stdout, stderr) = run(&["--algorithm", "diloco", "--compress", wire]);
        assert!(ok, "{stderr}");
        assert_eq!(2 * bytes(&stdout), bytes(&plain), "{stdout}");
        let report: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(
            report["results"][0]["settings"]["compress"], wire,
            "{report}"
        );
    }
    let (ok, _, stderr) = run(&["--algorithm", "diloco", "--compress", "int3"]);
    assert!(!ok);
    assert!(
        stderr.contains("--compress must be bf16, f16 or none, got 'int3'"),
        "{stderr}"
    );
    let (ok, _, stderr) = run(&["--algorithm", "sync", "--compress", "bf16"]);
    assert!(!ok);
    assert!(
        stderr.contains("--compress applies to --algorithm diloco only"),
        "{stderr}"
    );
}

/// A world whose all-reduce fails while armed (a lost peer, a network error), the simulated
/// world otherwise. With `travel`, a sync point's mean started in flight is handed back as
/// still travelling until it is finished (it is computed at its start, as the simulated world
/// does): what a world of processes holds during Streaming DiLoCo's `fragment_sync_delay`.
#[derive(Debug)]
struct FailingWorld {
    inner: SimulatedWorld,
    fail: std::sync::atomic::AtomicBool,
    travel: bool,
}

impl FailingWorld {
    fn new(size: usize) -> Arc<FailingWorld> {
        Arc::new(FailingWorld {
            inner: SimulatedWorld::new(size).unwrap(),
            fail: false.into(),
            travel: false,
        })
    }

    fn travelling(size: usize) -> Arc<FailingWorld> {
        Arc::new(FailingWorld {
            inner: SimulatedWorld::new(size).unwrap(),
            fail: false.into(),
            travel: true,
        })
    }

    fn arm(&self, fail: bool) {
        self.fail.store(fail, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Communicator for FailingWorld {
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn all_reduce_mean(
        &self,
        backend: &dyn Backend,
        arena: &mut distopt::backend::Arena,
        mean: distopt::comm::AllReduceMeanArgs<'_>,
    ) -> distopt::Result<()> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(distopt::Error::runtime("injected all-reduce failure"));
        }
        self.inner.all_reduce_mean(backend, arena, mean)
    }

    fn start_all_reduce_mean_in(
        &self,
        backend: &dyn Backend,
        arena: &mut distopt::backend::Arena,
        membership: &distopt::comm::InFlightMembership,
        mean: distopt::comm::AllReduceMeanArgs<'_>,
    ) -> distopt::Result<distopt::comm::InFlightMean> {
        // The trait's default (so that an armed world fails here too), then in flight.
        let agreed = membership
            .agreed()
            .expect("the simulated world agrees at once");
        self.all_reduce_mean_live(backend, arena, &agreed.live, mean)?;
        Ok(if self.travel {
            distopt::comm::InFlightMean::travelling(Box::new(()))
        } else {
            distopt::comm::InFlightMean::done()
        })
    }

    fn finish_all_reduce_mean_live(
        &self,
        _backend: &dyn Backend,
        _arena: &mut distopt::backend::Arena,
        _in_flight: distopt::comm::InFlightMean,
    ) -> distopt::Result<()> {
        Ok(())
    }

    fn all_reduce_scaled_sum(
        &self,
        backend: &dyn Backend,
        arena: &mut distopt::backend::Arena,
        sum: distopt::comm::AllReduceScaledSumArgs<'_>,
    ) -> distopt::Result<()> {
        self.inner.all_reduce_scaled_sum(backend, arena, sum)
    }

    fn broadcast(
        &self,
        backend: &dyn Backend,
        arena: &mut distopt::backend::Arena,
        root: usize,
        offset: usize,
        len: usize,
    ) -> distopt::Result<()> {
        self.inner.broadcast(backend, arena, root, offset, len)
    }

    fn broadcast_regions(
        &self,
        backend: &dyn Backend,
        src: Option<&distopt::backend::Arena>,
        dst: &mut distopt::backend::Arena,
        root: usize,
        regions: &[distopt::comm::BroadcastRegion],
    ) -> distopt::Result<()> {
        self.inner
            .broadcast_regions(backend, src, dst, root, regions)
    }

    fn all_reduce_sum_f32(&self, per_local_rank: &[Vec<f32>]) -> distopt::Result<Vec<f32>> {
        self.inner.all_reduce_sum_f32(per_local_rank)
    }

    fn broadcast_bytes(&self, root: usize, data: Option<Vec<u8>>) -> distopt::Result<Vec<u8>> {
        self.inner.broadcast_bytes(root, data)
    }

    fn all_gather_bytes(&self, per_local_rank: Vec<Vec<u8>>) -> distopt::Result<Vec<Vec<u8>>> {
        self.inner.all_gather_bytes(per_local_rank)
    }

    fn gather_bytes(
        &self,
        to: usize,
        per_local_rank: Vec<Vec<u8>>,
    ) -> distopt::Result<Option<Vec<Vec<u8>>>> {
        self.inner.gather_bytes(to, per_local_rank)
    }

    fn stats(&self) -> distopt::comm::CommStats {
        self.inner.stats()
    }

    fn reset_stats(&self) {
        self.inner.reset_stats()
    }
}

/// Every rank's state dict (both optimizers, the counter, the backups).
fn states(diloco: &DiLoCo, replicas: &Replicas) -> Vec<Value> {
    (0..replicas.ranks())
        .map(|r| diloco.state_dict(replicas, r).block_on().unwrap())
        .collect()
}

#[test]
fn a_failed_all_reduce_does_not_count_the_step_and_leaves_the_sync_state_as_before() {
    let grads = all_grads();
    for (label, backend) in backends().into_iter().take(2) {
        let world = FailingWorld::new(WORLD);
        let mut replicas = Replicas::replicate(backend.clone(), WORLD, &initial_params()).unwrap();
        let inner = common::optimizer(&replicas, "SGD", json!({"lr": 0.05}));
        let outer = common::optimizer(
            &replicas,
            "SGD",
            json!({"lr": 0.7, "momentum": 0.9, "nesterov": true}),
        );
        let mut diloco = DiLoCo::new(&replicas, inner, outer, SYNC_EVERY, world.clone()).unwrap();
        // A twin without DiLoCo: the inner step the failed step still takes.
        let mut twin = Replicas::replicate(backend.clone(), WORLD, &initial_params()).unwrap();
        let mut twin_sgd = common::optimizer(&twin, "SGD", json!({"lr": 0.05}));
        for g in &grads[..SYNC_EVERY as usize - 1] {
            assert!(!step(&mut replicas, &mut diloco, g), "{label}");
            twin_sgd.zero_grad(&mut twin);
            for (rank, g) in g.iter().enumerate() {
                twin.set_grads(rank, g).unwrap();
            }
            twin_sgd.step(&mut twin).unwrap();
        }
        let before = states(&diloco, &replicas);
        let due = &grads[SYNC_EVERY as usize - 1];
        world.arm(true);
        diloco.zero_grad(&mut replicas);
        for (rank, g) in due.iter().enumerate() {
            replicas.set_grads(rank, g).unwrap();
            twin.set_grads(rank, g).unwrap();
        }
        twin_sgd.step(&mut twin).unwrap();
        let err = diloco.step(&mut replicas).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::RuntimeError, "{label}");
        assert!(err.message().contains("injected"), "{label}: {err}");
        // Not counted: the counter, the backups and the outer state are as before the sync;
        // the parameters hold the inner step's result (not the backup's values).
        assert_eq!(
            diloco.local_step(),
            SYNC_EVERY as u64 - 1,
            "{label}: a failed sync advanced the step counter"
        );
        let after = states(&diloco, &replicas);
        for (rank, (a, b)) in after.iter().zip(&before).enumerate() {
            assert_eq!(a["local_step"], b["local_step"], "{label} rank {rank}");
            assert_eq!(
                a["original_parameters"], b["original_parameters"],
                "{label} rank {rank}: the backups changed"
            );
            assert_eq!(
                a["outer_optimizer"], b["outer_optimizer"],
                "{label} rank {rank}: the outer optimizer stepped"
            );
        }
        assert_eq!(
            param_bits(&replicas),
            param_bits(&twin),
            "{label}: the parameters are not the inner step's result"
        );
        // Disarmed, the next step reaches the sync point again and syncs.
        world.arm(false);
        assert!(step(&mut replicas, &mut diloco, due), "{label}");
        assert_eq!(diloco.local_step(), 0, "{label}");
        let synced = param_bits(&replicas);
        assert_eq!(
            synced[0],
            synced[WORLD - 1],
            "{label}: the ranks agree after the sync"
        );
    }
}

#[test]
fn a_state_dict_is_neither_saved_nor_loaded_while_a_fragments_mean_travels() {
    let grads = all_grads();
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let params = vec![initial_params(); WORLD];
    let (mut straight, mut reference) = fresh_streaming(&backend, &params, 1, 0.5, world());
    let world = FailingWorld::travelling(WORLD);
    let (mut replicas, mut diloco) = fresh_streaming(&backend, &params, 1, 0.5, world);
    let saved = states(&diloco, &replicas);
    let mut refused = 0;
    for g in &grads {
        step(&mut straight, &mut reference, g);
        step(&mut replicas, &mut diloco, g);
        match diloco.pending_fragment() {
            None => assert_eq!(states(&diloco, &replicas).len(), WORLD),
            Some(f) => {
                let before = param_bits(&replicas);
                let err = diloco.state_dict(&replicas, 0).block_on().unwrap_err();
                assert_eq!(err.kind(), ErrorKind::RuntimeError, "{err}");
                assert!(
                    err.message()
                        .contains(&format!("fragment {f}'s all-reduce is still in flight")),
                    "{err}"
                );
                let err = diloco
                    .load_state_dict(&mut replicas, 0, &saved[0])
                    .unwrap_err();
                assert_eq!(err.kind(), ErrorKind::RuntimeError, "{err}");
                assert!(err.message().contains("cannot be loaded"), "{err}");
                assert_eq!(diloco.pending_fragment(), Some(f));
                assert_eq!(param_bits(&replicas), before);
                refused += 1;
            }
        }
    }
    assert!(
        refused >= 3,
        "only {refused} steps had a fragment in flight"
    );
    // Refused calls changed nothing: the run equals the one in a world whose means are done
    // at their start, bit for bit, and once nothing travels a state dict is saved again.
    assert_eq!(param_bits(&replicas), param_bits(&straight));
    assert!(diloco.pending_fragment().is_some());
    reference.sync(&mut straight).unwrap();
    diloco.sync(&mut replicas).unwrap();
    assert_eq!(param_bits(&replicas), param_bits(&straight));
    assert_eq!(states(&diloco, &replicas), states(&reference, &straight));
}

/// Streaming DiLoCo over `shapes()` in two fragments, syncing every 4 steps with `delay` and
/// `alpha`, on `world`.
fn fresh_streaming(
    backend: &Arc<dyn Backend>,
    per_rank: &[Vec<Tensor>],
    delay: i64,
    alpha: f64,
    world: Arc<dyn Communicator>,
) -> (Replicas, DiLoCo) {
    let replicas = Replicas::new(backend.clone(), per_rank).unwrap();
    let inner = common::optimizer(
        &replicas,
        "Adam",
        json!({"lr": 0.02, "betas": [0.9, 0.95], "weight_decay": 0.1}),
    );
    let outer = common::optimizer(
        &replicas,
        "SGD",
        json!({"lr": 0.7, "momentum": 0.9, "nesterov": true}),
    );
    let options = DiLoCoOptions {
        fragments: Some(vec![vec![0, 3], vec![1, 2, 4]]),
        fragment_sync_delay: delay,
        fragment_update_alpha: Some(alpha),
        ..DiLoCoOptions::default()
    };
    let diloco = DiLoCo::with_options(&replicas, inner, outer, 4, world, options).unwrap();
    (replicas, diloco)
}

#[test]
fn streaming_delay_and_alpha_follow_torchfts_schedule_and_resume_mid_delay_bit_for_bit() {
    let grads = all_grads();
    for (delay, alpha) in [(1, 0.5), (1, 0.3), (1, 0.0), (0, 0.75)] {
        for (label, backend) in backends().into_iter().take(2) {
            let (mut replicas, mut diloco) = fresh_streaming(
                &backend,
                &vec![initial_params(); WORLD],
                delay,
                alpha,
                world(),
            );
            assert_eq!(diloco.sync_schedule(), [2, 0]);
            let starts = if delay == 0 { [2, 0] } else { [1, 3] };
            assert_eq!(diloco.start_schedule(), starts);
            let mut straight = Vec::new();
            let mut pending = Vec::new();
            let mut applied = Vec::new();
            for g in &grads {
                diloco.zero_grad(&mut replicas);
                for (rank, g) in g.iter().enumerate() {
                    replicas.set_grads(rank, g).unwrap();
                }
                applied.push(diloco.step_fragments(&mut replicas).unwrap());
                pending.push(diloco.pending_fragment());
                straight.push(param_bits(&replicas));
            }
            let none: Vec<usize> = vec![];
            assert_eq!(
                applied,
                [
                    none.clone(),
                    vec![0],
                    none.clone(),
                    vec![1],
                    none.clone(),
                    vec![0],
                    none
                ],
                "{label}"
            );
            if delay == 1 {
                let want = [Some(0), None, Some(1), None, Some(0), None, Some(1)];
                assert_eq!(pending, want, "{label}");
            } else {
                assert!(pending.iter().all(Option::is_none), "{label}");
            }
            let final_states = states(&diloco, &replicas);
            for stop in 1..STEPS {
                let (mut replicas, mut diloco) = fresh_streaming(
                    &backend,
                    &vec![initial_params(); WORLD],
                    delay,
                    alpha,
                    world(),
                );
                for g in &grads[..stop] {
                    step(&mut replicas, &mut diloco, g);
                }
                let saved = states(&diloco, &replicas);
                assert_eq!(
                    saved[0]["pending"].is_null(),
                    pending[stop - 1].is_none(),
                    "{label} stop {stop}"
                );
                let params = replicas.all_params().block_on().unwrap();
                drop((replicas, diloco));
                let (mut replicas, mut diloco) =
                    fresh_streaming(&backend, &params, delay, alpha, world());
                for (rank, sd) in saved.iter().enumerate() {
                    let sd: Value = serde_json::from_str(&sd.to_string()).unwrap();
                    diloco.load_state_dict(&mut replicas, rank, &sd).unwrap();
                }
                assert_eq!(diloco.pending_fragment(), pending[stop - 1]);
                for (t, g) in grads.iter().enumerate().skip(stop) {
                    step(&mut replicas, &mut diloco, g);
                    assert_eq!(
                        param_bits(&replicas),
                        straight[t],
                        "{label} delay {delay} alpha {alpha}: resumed after step {stop}, params after step {t}"
                    );
                }
                assert_eq!(
                    states(&diloco, &replicas),
                    final_states,
                    "{label} stop {stop}"
                );
            }
        }
    }
}

#[test]
fn alpha_one_keeps_the_local_parameters_and_alpha_zero_the_outer_steps_result() {
    // With alpha 1 the parameters never leave the inner optimizer's trajectory (the outer step
    // only moves the backups); with alpha 0 a synced fragment's parameters are its new backup.
    let grads = all_grads();
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let (mut a1, mut d1) =
        fresh_streaming(&backend, &vec![initial_params(); WORLD], 1, 1.0, world());
    let mut twin = Replicas::replicate(backend.clone(), WORLD, &initial_params()).unwrap();
    let mut adam = common::optimizer(
        &twin,
        "Adam",
        json!({"lr": 0.02, "betas": [0.9, 0.95], "weight_decay": 0.1}),
    );
    let (mut a0, mut d0) =
        fresh_streaming(&backend, &vec![initial_params(); WORLD], 1, 0.0, world());
    let initial = states(&d1, &a1)[0]["original_parameters"].clone();
    for g in &grads {
        step(&mut a1, &mut d1, g);
        adam.zero_grad(&mut twin);
        for (rank, g) in g.iter().enumerate() {
            twin.set_grads(rank, g).unwrap();
        }
        adam.step(&mut twin).unwrap();
        assert_eq!(param_bits(&a1), param_bits(&twin));
        d0.zero_grad(&mut a0);
        for (rank, g) in g.iter().enumerate() {
            a0.set_grads(rank, g).unwrap();
        }
        for f in d0.step_fragments(&mut a0).unwrap() {
            let params = a0.all_params().block_on().unwrap();
            for (rank, sd) in states(&d0, &a0).iter().enumerate() {
                for &j in &d0.fragments()[f] {
                    let backup =
                        distopt::json::tensor_from_json(&sd["original_parameters"][j], "b")
                            .unwrap();
                    assert_eq!(
                        params[rank][j].values_f64().unwrap(),
                        backup.values_f64().unwrap(),
                        "rank {rank} param {j}"
                    );
                }
            }
        }
    }
    // The backups of alpha 1 moved: the outer step ran on them.
    assert_ne!(states(&d1, &a1)[0]["original_parameters"], initial);
}

#[test]
fn a_failed_all_reduce_at_a_delayed_start_leaves_nothing_in_flight_and_retries() {
    let grads = all_grads();
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let world = FailingWorld::new(WORLD);
    let (mut replicas, mut diloco) = fresh_streaming(
        &backend,
        &vec![initial_params(); WORLD],
        1,
        0.5,
        world.clone(),
    );
    let before = states(&diloco, &replicas);
    world.arm(true);
    diloco.zero_grad(&mut replicas);
    for (rank, g) in grads[0].iter().enumerate() {
        replicas.set_grads(rank, g).unwrap();
    }
    let err = diloco.step_fragments(&mut replicas).unwrap_err();
    assert!(err.message().contains("injected"), "{err}");
    assert_eq!(diloco.local_step(), 0);
    assert_eq!(diloco.pending_fragment(), None);
    let after = states(&diloco, &replicas);
    for (a, b) in after.iter().zip(&before) {
        assert_eq!(a["original_parameters"], b["original_parameters"]);
        assert_eq!(a["pending"], Value::Null);
    }
    world.arm(false);
    // The retried step starts fragment 0's all-reduce; the next one applies it.
    step(&mut replicas, &mut diloco, &grads[1]);
    assert_eq!(diloco.pending_fragment(), Some(0));
    assert_eq!(diloco.local_step(), 1);
    diloco.zero_grad(&mut replicas);
    for (rank, g) in grads[2].iter().enumerate() {
        replicas.set_grads(rank, g).unwrap();
    }
    assert_eq!(diloco.step_fragments(&mut replicas).unwrap(), [0]);
    assert_eq!(diloco.pending_fragment(), None);
}

#[test]
fn streaming_options_and_pending_state_are_checked_with_torchfts_messages() {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let bad_options = [
        (
            json!({"fragmentSyncDelay": -1}),
            "fragment_sync_delay must be a non-negative integer, got -1",
        ),
        (
            json!({"fragmentSyncDelay": 2}),
            "Fragment must be synced before it is reduced another time: fragment_sync_delay (2) must be smaller than sync_every // fragments (4 // 2 = 2)",
        ),
        (
            json!({"fragmentUpdateAlpha": 1.5}),
            "fragment_update_alpha must be between 0 and 1, got 1.5",
        ),
        (
            json!({"fragmentUpdateAlpha": -0.25}),
            "fragment_update_alpha must be between 0 and 1, got -0.25",
        ),
    ];
    for (options, text) in bad_options {
        let mut parsed = DiLoCoOptions::from_options(&options).unwrap();
        parsed.fragments = Some(vec![vec![0, 3], vec![1, 2, 4]]);
        let err = parsed.check(5, 4).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueError, "{options}");
        assert_eq!(err.message(), text, "{options}");
    }
    let nan = DiLoCoOptions {
        fragment_update_alpha: Some(f64::NAN),
        ..DiLoCoOptions::default()
    };
    assert!(nan.check(5, 4).unwrap_err().message().contains("got nan"));
    for (options, kind, text) in [
        (
            json!({"shouldQuantize": true}),
            ErrorKind::ValueError,
            "is not supported",
        ),
        (
            json!({"should_quantize": true}),
            ErrorKind::ValueError,
            "is not supported",
        ),
        (
            json!({"fragmentSyncDelay": 1.5}),
            ErrorKind::TypeError,
            "fragmentSyncDelay must be an integer",
        ),
        (
            json!({"fragmentUpdateAlpha": "x"}),
            ErrorKind::TypeError,
            "fragmentUpdateAlpha must be a number",
        ),
        (
            json!({"fragments": [[0], "x"]}),
            ErrorKind::TypeError,
            "fragments must be a list of lists",
        ),
        (
            json!({"fragment_sync_delay": 1}),
            ErrorKind::TypeError,
            "unexpected keyword argument 'fragment_sync_delay'",
        ),
        (json!(3), ErrorKind::TypeError, "must be an object"),
    ] {
        let err = DiLoCoOptions::from_options(&options).unwrap_err();
        assert_eq!(err.kind(), kind, "{options}");
        assert!(err.message().contains(text), "{options}: {}", err.message());
    }
    let parsed = DiLoCoOptions::from_options(&json!({
        "compress": "bf16", "fragments": [[1], [0]], "fragmentSyncDelay": 1, "fragmentUpdateAlpha": 0.5
    }))
    .unwrap();
    assert_eq!(parsed.compression, Compression::BFloat16);
    assert_eq!(parsed.fragments, Some(vec![vec![1], vec![0]]));
    assert_eq!(
        (parsed.fragment_sync_delay, parsed.fragment_update_alpha),
        (1, Some(0.5))
    );
    assert_eq!(
        DiLoCoOptions::from_options(&Value::Null).unwrap(),
        DiLoCoOptions::default()
    );

    // A pending entry must match the counter: in flight inside a window, null outside.
    let grads = all_grads();
    let (mut replicas, mut diloco) =
        fresh_streaming(&backend, &vec![initial_params(); WORLD], 1, 0.5, world());
    step(&mut replicas, &mut diloco, &grads[0]);
    let in_flight = diloco.state_dict(&replicas, 0).block_on().unwrap();
    assert_eq!(in_flight["pending"]["fragment"], json!(0));
    assert_eq!(
        in_flight["pending"]["pseudo_gradients"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let mut missing = in_flight.clone();
    missing.as_object_mut().unwrap().remove("pending");
    let mut other = in_flight.clone();
    other["pending"]["fragment"] = json!(1);
    let mut short = in_flight.clone();
    short["pending"]["pseudo_gradients"] = json!([]);
    let mut wrong_dtype = in_flight.clone();
    wrong_dtype["pending"]["pseudo_gradients"][0] =
        json!({"dtype": "float64", "shape": [5], "data": [0.0, 0.0, 0.0, 0.0, 0.0]});
    let mut outside = in_flight.clone();
    outside["local_step"] = json!(2);
    let before = states(&diloco, &replicas);
    for (sd, text) in [
        (&missing, "\"pending\" must be {\"fragment\": 0"),
        (
            &other,
            "fragment 0's all-reduce is in flight (fragment_sync_delay 1)",
        ),
        (
            &short,
            "\"pending\" has 0 pseudo-gradients, fragment 0 has 2 parameters",
        ),
        (
            &wrong_dtype,
            "pending.pseudo_gradients[0] is float64 [5], parameter 0 is float32 [5]",
        ),
        (&outside, "\"pending\" must be null at local_step 2"),
    ] {
        let err = diloco.load_state_dict(&mut replicas, 1, sd).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueError, "{}", err.message());
        assert!(err.message().contains(text), "{}", err.message());
        // Refused: nothing changed.
        assert_eq!(states(&diloco, &replicas), before);
    }
}

#[test]
fn sync_mid_delay_applies_the_fragment_in_flight_once_and_every_other_fragment() {
    let grads = all_grads();
    for (label, backend) in backends().into_iter().take(2) {
        let replicas = Replicas::replicate(backend.clone(), WORLD, &initial_params()).unwrap();
        let inner = common::optimizer(&replicas, "SGD", json!({"lr": 0.05}));
        // Adam's per-parameter step counts how many outer steps each parameter took.
        let outer = common::optimizer(&replicas, "Adam", json!({"lr": 0.1}));
        let options = DiLoCoOptions {
            fragments: Some(vec![vec![0, 3], vec![1, 2, 4]]),
            fragment_sync_delay: 1,
            fragment_update_alpha: None,
            ..DiLoCoOptions::default()
        };
        let mut replicas = replicas;
        let mut diloco =
            DiLoCo::with_options(&replicas, inner, outer, 4, world(), options).unwrap();
        step(&mut replicas, &mut diloco, &grads[0]);
        assert_eq!(diloco.pending_fragment(), Some(0), "{label}");
        diloco.sync(&mut replicas).unwrap();
        assert_eq!((diloco.local_step(), diloco.pending_fragment()), (0, None));
        let sd = diloco.state_dict(&replicas, 0).block_on().unwrap();
        for j in 0..5 {
            let step = &sd["outer_optimizer"]["state"][j.to_string()]["step"];
            let step = distopt::json::tensor_from_json(step, "step").unwrap();
            assert_eq!(step.values_f64().unwrap(), [1.0], "{label}: parameter {j}");
        }
        // alpha 0: every rank holds the outer step's result.
        let bits = param_bits(&replicas);
        assert!(bits.iter().all(|b| *b == bits[0]), "{label}");
        // A new period: fragment 0 starts again after the first step.
        step(&mut replicas, &mut diloco, &grads[1]);
        assert_eq!(diloco.pending_fragment(), Some(0), "{label}");
    }
}
