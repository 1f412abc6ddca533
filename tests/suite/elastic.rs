//! Elastic runs in the simulated world (a [`MembershipSchedule`]: who takes part in which sync),
//! checked against runs that do not use the schedule at all:
//!
//! * every rank live changes no bit of DiLoCo (plain, streaming with delay and α, compressed);
//! * a rank that never takes part leaves the others exactly where a world without it is;
//! * a rank that leaves after a sync leaves the survivors where a smaller world resumed from
//!   their state dicts is;
//! * a rank that joins is healed: parameters and both optimizers' states equal its source's,
//!   and the next sync averages it in;
//! * the averagers and post-local SGD follow the same rules (the hierarchical averager's groups
//!   average over their live ranks), checked against host arithmetic on exact values.

use crate::common;

use std::sync::Arc;

use distopt::BlockOn;
use distopt::averaging::{HierarchicalModelAverager, ModelAverager, PeriodicModelAverager};
use distopt::backend::kernels::ParamStarts;
use distopt::comm::{
    AllReduceMeanArgs, Communicator, MeanOrder, MembershipSchedule, SimulatedWorld, Subgroups,
};
use distopt::diloco::{Compression, DiLoCo, DiLoCoOptions};
use distopt::post_local_sgd::PostLocalSgdOptimizer;
use distopt::replicas::Replicas;
use distopt::{Backend, DType, ErrorKind, StorageFormat, Tensor};
use serde_json::{Value, json};

const SYNC_EVERY: i64 = 4;
const STEPS: usize = 14;

fn shapes() -> Vec<(DType, Vec<usize>)> {
    vec![
        (DType::Float32, vec![5]),
        (DType::BFloat16, vec![3, 2]),
        (DType::Float16, vec![4]),
        (DType::Float64, vec![2]),
    ]
}

fn initial_params() -> Vec<Tensor> {
    let mut rng = distopt::rng::SplitMix64::from_state(5);
    shapes()
        .iter()
        .map(|(dtype, shape)| {
            let n = shape.iter().product();
            let values: Vec<f64> = (0..n).map(|_| unit(&mut rng)).collect();
            Tensor::from_f64(*dtype, shape, &values).unwrap()
        })
        .collect()
}

/// Uniform in `[-1, 1)`.
fn unit(rng: &mut distopt::rng::SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// `grads[t][rank][j]` for `ranks` ranks: rank `r`'s gradients depend on `r` and `t` only, so
/// that a world without some ranks gets the same gradients on the ranks it keeps.
fn grads_for(ranks: &[usize]) -> Vec<Vec<Vec<Option<Tensor>>>> {
    (0..STEPS)
        .map(|t| {
            ranks
                .iter()
                .map(|&rank| {
                    let mut rng =
                        distopt::rng::SplitMix64::from_state((t * 97 + rank * 13 + 1) as u64);
                    shapes()
                        .iter()
                        .enumerate()
                        .map(|(j, (dtype, shape))| {
                            let n: usize = shape.iter().product();
                            let values: Vec<f64> = (0..n).map(|_| unit(&mut rng)).collect();
                            ((t + rank + j) % 5 != 0)
                                .then(|| Tensor::from_f64(*dtype, shape, &values).unwrap())
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The DiLoCo variants every check runs.
#[derive(Debug, Clone, Copy)]
enum Variant {
    Plain,
    Streaming,
    Compressed,
}

const VARIANTS: [Variant; 3] = [Variant::Plain, Variant::Streaming, Variant::Compressed];

fn diloco(replicas: &Replicas, world: Arc<dyn Communicator>, variant: Variant) -> DiLoCo {
    let inner = common::optimizer(
        replicas,
        "AdamW",
        json!({"lr": 0.02, "betas": [0.9, 0.95], "weight_decay": 0.1}),
    );
    let outer = common::optimizer(
        replicas,
        "SGD",
        json!({"lr": 0.7, "momentum": 0.9, "nesterov": true}),
    );
    let options = match variant {
        Variant::Plain => DiLoCoOptions::default(),
        Variant::Streaming => DiLoCoOptions {
            fragments: Some(vec![vec![0, 3], vec![1, 2]]),
            fragment_sync_delay: 1,
            fragment_update_alpha: Some(0.5),
            ..DiLoCoOptions::default()
        },
        Variant::Compressed => DiLoCoOptions {
            compression: Compression::parse("bfloat16").unwrap(),
            ..DiLoCoOptions::default()
        },
    };
    DiLoCo::with_options(replicas, inner, outer, SYNC_EVERY, world, options).unwrap()
}

/// Every rank's parameters as bits per element.
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

fn state(diloco: &DiLoCo, replicas: &Replicas, rank: usize) -> Value {
    diloco.state_dict(replicas, rank).block_on().unwrap()
}

/// One step: fresh gradients on every rank, then DiLoCo's step.
fn step(replicas: &mut Replicas, diloco: &mut DiLoCo, grads: &[Vec<Option<Tensor>>]) {
    diloco.zero_grad(replicas);
    for (rank, g) in grads.iter().enumerate() {
        replicas.set_grads(rank, g).unwrap();
    }
    diloco.step(replicas).unwrap();
}

fn scheduled(world_size: usize, syncs: Vec<Vec<usize>>) -> Arc<dyn Communicator> {
    let schedule = MembershipSchedule::new(world_size, syncs).unwrap();
    Arc::new(SimulatedWorld::with_schedule(schedule).unwrap())
}

#[test]
fn with_every_rank_live_a_schedule_changes_no_bit() {
    let ranks: Vec<usize> = (0..3).collect();
    let grads = grads_for(&ranks);
    for (label, backend) in common::named_backends() {
        for variant in VARIANTS {
            let mut fixed = Replicas::replicate(backend.clone(), 3, &initial_params()).unwrap();
            let mut fixed_diloco =
                diloco(&fixed, Arc::new(SimulatedWorld::new(3).unwrap()), variant);
            let mut elastic = Replicas::replicate(backend.clone(), 3, &initial_params()).unwrap();
            let world = scheduled(3, vec![ranks.clone(); 5]);
            let mut elastic_diloco = diloco(&elastic, world, variant);
            for (t, g) in grads.iter().enumerate() {
                step(&mut fixed, &mut fixed_diloco, g);
                step(&mut elastic, &mut elastic_diloco, g);
                assert_eq!(
                    param_bits(&fixed),
                    param_bits(&elastic),
                    "{label} {variant:?} step {t}"
                );
            }
            for rank in 0..3 {
                assert_eq!(
                    state(&fixed_diloco, &fixed, rank),
                    state(&elastic_diloco, &elastic, rank),
                    "{label} {variant:?} rank {rank}"
                );
            }
        }
    }
}

#[test]
fn a_rank_that_never_takes_part_leaves_the_others_where_a_world_without_it_is() {
    // Four ranks, rank 2 never live: ranks 0, 1 and 3 must have the bits of a world of three
    // ranks with their data (a mean over three ranks, not a power of two, in rank order).
    let kept = [0usize, 1, 3];
    let grads4 = grads_for(&[0, 1, 2, 3]);
    let grads3 = grads_for(&kept);
    for (label, backend) in common::named_backends() {
        for variant in VARIANTS {
            let mut small = Replicas::replicate(backend.clone(), 3, &initial_params()).unwrap();
            let mut small_diloco =
                diloco(&small, Arc::new(SimulatedWorld::new(3).unwrap()), variant);
            let mut big = Replicas::replicate(backend.clone(), 4, &initial_params()).unwrap();
            let mut big_diloco = diloco(&big, scheduled(4, vec![kept.to_vec()]), variant);
            let mut averaged_away = false;
            for t in 0..STEPS {
                step(&mut small, &mut small_diloco, &grads3[t]);
                step(&mut big, &mut big_diloco, &grads4[t]);
                let (small_bits, big_bits) = (param_bits(&small), param_bits(&big));
                for (i, &rank) in kept.iter().enumerate() {
                    assert_eq!(
                        small_bits[i], big_bits[rank],
                        "{label} {variant:?} step {t}: rank {rank}"
                    );
                }
                // The rank left out went its own way: it is no longer where the others are.
                averaged_away |= big_bits[2] != big_bits[0];
            }
            assert!(averaged_away, "{label} {variant:?}: rank 2 was averaged in");
            for (i, &rank) in kept.iter().enumerate() {
                assert_eq!(
                    state(&small_diloco, &small, i),
                    state(&big_diloco, &big, rank),
                    "{label} {variant:?} rank {rank}"
                );
            }
        }
    }
}

/// Replicas of `ranks`' parameters of `replicas`, in that order.
fn subset(backend: &Arc<dyn Backend>, replicas: &Replicas, ranks: &[usize]) -> Replicas {
    let all = replicas.all_params().block_on().unwrap();
    let per_rank: Vec<Vec<Tensor>> = ranks.iter().map(|&r| all[r].clone()).collect();
    Replicas::new(backend.clone(), &per_rank).unwrap()
}

#[test]
fn a_rank_that_leaves_leaves_the_survivors_where_a_smaller_world_resumed_from_their_state_is() {
    // Three ranks; rank 1 takes part in the first sync point only. From there, ranks 0 and 2
    // must follow a world of two ranks loaded with their parameters and DiLoCo state dicts.
    let survivors = [0usize, 2];
    let grads = grads_for(&[0, 1, 2]);
    let grads2 = grads_for(&survivors);
    for (label, backend) in common::named_backends() {
        for variant in VARIANTS {
            let mut replicas = Replicas::replicate(backend.clone(), 3, &initial_params()).unwrap();
            let world = scheduled(3, vec![vec![0, 1, 2], survivors.to_vec()]);
            let mut elastic = diloco(&replicas, world, variant);
            // One period: plain DiLoCo's first sync point (with rank 1) is its last step;
            // streaming's two fragments start at steps 2 and 4 (the second without rank 1) and
            // are both applied by its end, so nothing is in flight at the copy.
            let first = SYNC_EVERY as usize;
            for g in &grads[..first] {
                step(&mut replicas, &mut elastic, g);
            }
            let mut small = subset(&backend, &replicas, &survivors);
            let mut small_diloco =
                diloco(&small, Arc::new(SimulatedWorld::new(2).unwrap()), variant);
            for (i, &rank) in survivors.iter().enumerate() {
                let saved = state(&elastic, &replicas, rank);
                small_diloco.load_state_dict(&mut small, i, &saved).unwrap();
            }
            for t in first..STEPS {
                step(&mut replicas, &mut elastic, &grads[t]);
                step(&mut small, &mut small_diloco, &grads2[t]);
                let (all, kept) = (param_bits(&replicas), param_bits(&small));
                for (i, &rank) in survivors.iter().enumerate() {
                    assert_eq!(
                        kept[i], all[rank],
                        "{label} {variant:?} step {t}: rank {rank}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_rank_that_joins_is_healed_from_the_lowest_live_rank_and_averaged_in_from_the_next_sync() {
    // Rank 2 is out of the first two sync points and joins for the third: it is healed at the
    // end of the second.
    let grads = grads_for(&[0, 1, 2]);
    for (label, backend) in common::named_backends() {
        for variant in [Variant::Plain, Variant::Compressed] {
            let mut replicas = Replicas::replicate(backend.clone(), 3, &initial_params()).unwrap();
            let world = scheduled(3, vec![vec![0, 1], vec![0, 1], vec![0, 1, 2]]);
            let mut elastic = diloco(&replicas, world, variant);
            let h = SYNC_EVERY as usize;
            for g in &grads[..2 * h - 1] {
                step(&mut replicas, &mut elastic, g);
            }
            let before = param_bits(&replicas);
            assert_ne!(
                before[2], before[0],
                "{label} {variant:?}: rank 2 is already healed"
            );
            step(&mut replicas, &mut elastic, &grads[2 * h - 1]);
            let after = param_bits(&replicas);
            assert_eq!(after[2], after[0], "{label} {variant:?}: healed parameters");
            assert_eq!(
                state(&elastic, &replicas, 2),
                state(&elastic, &replicas, 0),
                "{label} {variant:?}: healed state"
            );
            // From here on rank 2 contributes: the next sync averages three ranks, so the
            // three end equal, and different from a run where rank 2 stays out.
            let mut alone = Replicas::replicate(backend.clone(), 3, &initial_params()).unwrap();
            let mut alone_diloco = diloco(&alone, scheduled(3, vec![vec![0, 1]]), variant);
            for g in &grads[..3 * h] {
                step(&mut alone, &mut alone_diloco, g);
            }
            for g in &grads[2 * h..3 * h] {
                step(&mut replicas, &mut elastic, g);
            }
            let joined = param_bits(&replicas);
            assert_eq!(joined[2], joined[0], "{label} {variant:?}");
            assert_ne!(
                joined[0],
                param_bits(&alone)[0],
                "{label} {variant:?}: rank 2 was not averaged in"
            );
        }
    }
}

#[test]
fn a_rank_admitted_at_a_delayed_fragments_sync_point_is_healed_at_its_outer_step() {
    // Streaming (F = 2, delay 1, every 4 steps): fragment 1's sync point 1 starts at step 3
    // and is applied at step 4. Rank 2, out of sync points 0 and 1, is admitted at point 1:
    // it is healed at the end of step 4, with that point's outer step, not at its start (a
    // world of processes agrees on the point while the delay's inner steps run).
    let grads = grads_for(&[0, 1, 2]);
    for (label, backend) in common::named_backends() {
        let mut replicas = Replicas::replicate(backend.clone(), 3, &initial_params()).unwrap();
        let world = scheduled(3, vec![vec![0, 1], vec![0, 1], vec![0, 1, 2]]);
        let mut elastic = diloco(&replicas, world, Variant::Streaming);
        for g in &grads[..3] {
            step(&mut replicas, &mut elastic, g);
        }
        let started = param_bits(&replicas);
        assert_ne!(
            started[2], started[0],
            "{label}: healed at the sync point's start"
        );
        assert!(
            elastic.healed().is_empty(),
            "{label}: {:?}",
            elastic.healed()
        );
        step(&mut replicas, &mut elastic, &grads[3]);
        assert_eq!(elastic.healed(), &[(2, 0)], "{label}");
        let applied = param_bits(&replicas);
        assert_eq!(applied[2], applied[0], "{label}: healed parameters");
        assert_eq!(
            state(&elastic, &replicas, 2),
            state(&elastic, &replicas, 0),
            "{label}: healed state"
        );
    }
}

/// A model of one float64 parameter of two elements per rank, with the given values.
fn exact_model(backend: &Arc<dyn Backend>, values: &[[f64; 2]]) -> Replicas {
    let per_rank: Vec<Vec<Tensor>> = values
        .iter()
        .map(|v| vec![Tensor::from_f64(DType::Float64, &[2], v).unwrap()])
        .collect();
    let mut replicas = Replicas::new(backend.clone(), &per_rank).unwrap();
    for rank in 0..values.len() {
        let zero = Tensor::from_f64(DType::Float64, &[2], &[0.0, 0.0]).unwrap();
        replicas.set_grads(rank, &[Some(zero)]).unwrap();
    }
    replicas
}

fn values(replicas: &Replicas) -> Vec<Vec<f64>> {
    replicas
        .all_params()
        .block_on()
        .unwrap()
        .iter()
        .map(|rank| rank[0].values_f64().unwrap())
        .collect()
}

#[test]
fn the_averagers_average_over_the_live_ranks_and_heal_the_joining_ones() {
    let start = [[1.0, 8.0], [2.0, 16.0], [4.0, 32.0], [8.0, 64.0]];
    for (label, backend) in common::named_backends() {
        // Periodic over the world: sync 0 without rank 1, sync 1 with everyone (rank 1 healed
        // at the end of sync 0 from rank 0).
        let world = scheduled(4, vec![vec![0, 2, 3], vec![0, 1, 2, 3]]);
        let mut averager = PeriodicModelAverager::new(1, 0, world).unwrap();
        let mut replicas = exact_model(&backend, &start);
        averager.average_parameters(&mut replicas, None).unwrap();
        // Each value divided by 3, then summed in rank order, as a world of three computes it.
        let exact = |i: usize| start[0][i] / 3.0 + start[2][i] / 3.0 + start[3][i] / 3.0;
        assert_eq!(
            values(&replicas),
            vec![vec![exact(0), exact(1)]; 4],
            "{label}"
        );
        assert_eq!(averager.healed(), &[(1, 0)], "{label}");

        // Hierarchical, groups of 2 every step and the world every 2nd (world level first
        // when both are due): rank 1 out of sync 0. Group {0, 1} averages over rank 0 alone,
        // group {2, 3} over both; rank 1 is healed from rank 0, its group's live rank.
        let world = scheduled(4, vec![vec![0, 2, 3], vec![0, 1, 2, 3]]);
        let mut averager = HierarchicalModelAverager::new(&[(1, 2), (2, 4)], 0, world).unwrap();
        let mut replicas = exact_model(&backend, &start);
        averager.average_parameters(&mut replicas, None).unwrap(); // step 0: the world level
        assert_eq!(
            values(&replicas),
            vec![vec![exact(0), exact(1)]; 4],
            "{label}"
        );
        let mut replicas = exact_model(&backend, &start);
        let world = scheduled(4, vec![vec![0, 2, 3]]);
        let mut by_pairs = HierarchicalModelAverager::new(&[(1, 2), (2, 4)], 0, world).unwrap();
        by_pairs.set_step(1);
        by_pairs.average_parameters(&mut replicas, None).unwrap();
        let pair = |i: usize| start[2][i] / 2.0 + start[3][i] / 2.0;
        assert_eq!(
            values(&replicas),
            vec![
                start[0].to_vec(),
                start[1].to_vec(),
                vec![pair(0), pair(1)],
                vec![pair(0), pair(1)]
            ],
            "{label}: a group of one live rank keeps its values, the rank out keeps its own"
        );
    }
}

#[test]
fn post_local_sgd_heals_the_optimizer_state_too() {
    for (label, backend) in common::named_backends() {
        let world = scheduled(3, vec![vec![0, 1], vec![0, 1, 2]]);
        let averager = PeriodicModelAverager::new(2, 0, world).unwrap();
        let start = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]];
        let mut replicas = exact_model(&backend, &start);
        let sgd = common::optimizer(&replicas, "SGD", json!({"lr": 0.5, "momentum": 0.9}));
        let mut post = PostLocalSgdOptimizer::new(sgd, Box::new(averager));
        for rank in 0..3 {
            let g = [rank as f64 + 1.0, 1.0 - rank as f64];
            let g = Tensor::from_f64(DType::Float64, &[2], &g).unwrap();
            replicas.set_grads(rank, &[Some(g)]).unwrap();
        }
        assert_eq!(post.step(&mut replicas).unwrap(), Some(3));
        // Step 0 averaged (the first sync point: ranks 0 and 1) and healed rank 2.
        let v = values(&replicas);
        assert_eq!(v[2], v[0], "{label}");
        let s0 = post.optim().state_dict(&replicas, 0).block_on().unwrap();
        let s2 = post.optim().state_dict(&replicas, 2).block_on().unwrap();
        assert_eq!(s2, s0, "{label}: the momentum buffers");
        let s1 = post.optim().state_dict(&replicas, 1).block_on().unwrap();
        assert_ne!(s1, s0, "{label}: rank 1 keeps its own momentum");
    }
}

#[test]
fn a_live_mask_that_does_not_fit_is_a_value_error() {
    let backend: Arc<dyn Backend> = Arc::new(distopt::CpuBackend::new());
    let world = SimulatedWorld::new(3).unwrap();
    let mut arena = backend.create_arena(StorageFormat::F32, 3, 4, 4).unwrap();
    let starts = ParamStarts(vec![0]);
    for (live, message) in [
        (vec![true, false], "2 live flags for a world of 3 ranks"),
        (vec![false; 3], "no rank is live"),
    ] {
        let err = world
            .all_reduce_mean_live(
                backend.as_ref(),
                &mut arena,
                &live,
                AllReduceMeanArgs {
                    groups: Subgroups::world(3),
                    arith: StorageFormat::F32,
                    starts: &starts,
                    active: &[true],
                    bytes_per_rank: 16,
                    order: MeanOrder::DivideThenSum,
                },
            )
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueError);
        assert_eq!(err.message(), message);
    }
}

#[test]
fn distopt_train_membership_replays_a_rank_leaving_in_the_simulated_world() {
    let run = |membership: &str| {
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
                "--period",
                "6",
                "--json",
                "--membership",
                membership,
            ])
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // Rank 2 takes part in the first of the four syncs only.
    let (ok, stdout, stderr) = run("0,1,2,3;0,1,3");
    assert!(ok, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let result = &report["results"][0];
    assert_eq!(result["steps_averaged"], 4, "{result}");
    let by_size = &result["all_reduce_bytes_by_group_size"];
    // One ring all-reduce of B bytes over 4 ranks sends 2·3/4·B per rank, over 3 ranks 2·2/3·B.
    let four = by_size["4"].as_u64().unwrap();
    let three = by_size["3"].as_u64().unwrap();
    let b = four * 4 / 6;
    assert_eq!(four, 6 * b / 4, "{by_size}");
    assert_eq!(three, 3 * (4 * b / 3), "{by_size}");
    // The three live ranks end on one model; the one that left on its own.
    let losses: Vec<f64> = result["replica_loss_per_rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), 4);
    assert_eq!(losses[0], losses[1]);
    assert_eq!(losses[0], losses[3]);
    assert_ne!(losses[0], losses[2]);

    let (ok, _, stderr) = run("0,1;0,4");
    assert!(!ok);
    assert!(
        stderr.contains(
            "ValueError: --membership: sync 1 of the membership schedule names rank 4, the world has 4 ranks"
        ),
        "{stderr}"
    );
}
