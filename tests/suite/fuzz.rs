//! Property/fuzz tests (proptest): arbitrary and mutated JSON fed to the JSON step request
//! parser (and the step), the state-dict loaders (SGD, Adam, AdamW, ZeroRedundancyOptimizer,
//! PostLocalSGDOptimizer, DiLoCo, and Streaming DiLoCo with a fragment in flight; from JSON
//! text) and the golden-case reader. Each input must give `Ok` or a typed `Err`, never a
//! panic; a refused state dict must leave the object as it was, and an accepted one must leave
//! it usable (it steps).
//!
//! Cases per target: `$DISTOPT_FUZZ_CASES` (default 500: under 10 s in release). A long run:
//! `DISTOPT_FUZZ_CASES=20000 cargo test --release --test suite fuzz::`.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use distopt::BlockOn;
use distopt::averaging::PeriodicModelAverager;
use distopt::comm::SimulatedWorld;
use distopt::diloco::{DiLoCo, DiLoCoOptions};
use distopt::optim::{self, LocalOptimizer, option_map};
use distopt::post_local_sgd::PostLocalSgdOptimizer;
use distopt::replicas::Replicas;
use distopt::step::step_request_from_json;
use distopt::zero::{ZeroOptions, ZeroRedundancyOptimizer};
use distopt::{CpuBackend, DType, Tensor, sgd_step, warnings};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, Value, json};

fn cases() -> u32 {
    std::env::var("DISTOPT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    })
}

/// Keys the parsers look for, so that mutations reach past the first check.
const KEYS: &[&str] = &[
    "state",
    "param_groups",
    "params",
    "lr",
    "momentum",
    "dampening",
    "nesterov",
    "betas",
    "eps",
    "weight_decay",
    "amsgrad",
    "maximize",
    "decoupled_weight_decay",
    "step",
    "exp_avg",
    "exp_avg_sq",
    "max_exp_avg_sq",
    "momentum_buffer",
    "dtype",
    "shape",
    "data",
    "0",
    "1",
    "2",
    "inner_optimizer",
    "outer_optimizer",
    "local_step",
    "original_parameters",
    "pending",
    "fragment",
    "pseudo_gradients",
    "parameter_replicas",
    "gradient_replicas",
    "learning_rate",
    "name",
    "kind",
    "input",
    "expected",
];

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(KEYS).prop_map(str::to_string),
        1 => "[a-z_0-9]{0,6}",
    ]
}

fn arb_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..5).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop::sample::select(vec![
            0.0,
            -0.0,
            0.5,
            -1.0,
            1.0,
            2.9,
            1e-8,
            1e300,
            -1e300,
            4294967296.0,
            1.8e19,
            65504.0,
        ])
        .prop_map(|x: f64| json!(x)),
        any::<f64>().prop_map(|x| json!(x)),
        prop::sample::select(vec![
            "nan", "inf", "-inf", "float32", "float16", "bfloat16", "float64", "int64", "SGD",
            "Adam", "",
        ])
        .prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::from),
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    arb_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((arb_key(), inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// One edit of the node chosen by `node` (its pre-order index, modulo the node count: every
/// node of the seed, at any depth, is equally likely).
#[derive(Debug, Clone)]
struct Mutation {
    node: usize,
    op: u8,
    value: Value,
    key: String,
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    (any::<usize>(), 0u8..6, arb_json(), arb_key()).prop_map(|(node, op, value, key)| Mutation {
        node,
        op,
        value,
        key,
    })
}

fn arb_mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(arb_mutation(), 1..4)
}

fn count_nodes(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(count_nodes).sum(),
        Value::Object(map) => map.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// The node of pre-order index `*n`.
fn nth_node<'a>(value: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
    if *n == 0 {
        return Some(value);
    }
    *n -= 1;
    match value {
        Value::Array(items) => items.iter_mut().find_map(|item| nth_node(item, n)),
        Value::Object(map) => map.values_mut().find_map(|item| nth_node(item, n)),
        _ => None,
    }
}

fn mutate(target: &mut Value, m: &Mutation) {
    let mut n = m.node % count_nodes(target);
    let node = nth_node(target, &mut n).expect("in range");
    match (m.op, &mut *node) {
        (0, _) => *node = m.value.clone(),
        (1, Value::Array(items)) if !items.is_empty() => {
            items.pop();
        }
        (1, Value::Object(map)) if !map.is_empty() => {
            let key = map.keys().next().expect("non-empty").clone();
            map.remove(&key);
        }
        (2, Value::Array(items)) => items.push(m.value.clone()),
        (2, Value::Object(map)) => {
            map.insert(m.key.clone(), m.value.clone());
        }
        (3, Value::Number(n)) => {
            let x = n.as_f64().unwrap_or(0.0);
            *node = json!(-x * 1e9 - 0.5);
        }
        (4, Value::Array(items)) if !items.is_empty() => {
            let first = items[0].clone();
            items.push(first);
        }
        _ => *node = m.value.clone(),
    }
}

fn backend() -> Arc<dyn distopt::Backend> {
    Arc::new(CpuBackend::new())
}

/// Two ranks of a float32 and a float16 parameter, with gradients everywhere.
fn model() -> Replicas {
    model_of(DType::Float16)
}

/// Two ranks of a float32 parameter and one of `second`, with gradients everywhere.
fn model_of(second: DType) -> Replicas {
    let params = [
        Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap(),
        Tensor::from_f64(second, &[3], &[3.0, 4.0, 5.0]).unwrap(),
    ];
    let mut replicas = Replicas::replicate(backend(), 2, &params).unwrap();
    grads(&mut replicas);
    replicas
}

fn grads(replicas: &mut Replicas) {
    for rank in 0..replicas.ranks() {
        replicas
            .set_grads(
                rank,
                &[
                    Some(Tensor::from_f32(&[2], vec![0.5, -0.25]).unwrap()),
                    Some(Tensor::from_f64(replicas.dtype(1), &[3], &[0.5, 1.0, -1.0]).unwrap()),
                ],
            )
            .unwrap();
    }
}

fn local(name: &str, replicas: &Replicas) -> Box<dyn LocalOptimizer> {
    let defaults = match name {
        "SGD" => json!({"lr": 0.1, "momentum": 0.9}),
        _ => json!({"lr": 0.1, "amsgrad": true}),
    };
    optim::create(
        name,
        replicas,
        vec![(vec![0], Default::default()), (vec![1], Default::default())],
        &option_map(&defaults).unwrap(),
    )
    .unwrap()
}

fn state(optim: &dyn LocalOptimizer, replicas: &Replicas, rank: usize) -> Value {
    pollster::block_on(optim.state_dict(replicas, rank)).unwrap()
}

/// Through JSON text, as a state dict comes back from disk (a value that does not
/// serialize is skipped: none does).
fn through_text(value: &Value) -> Option<Value> {
    serde_json::from_str(&serde_json::to_string(value).ok()?).ok()
}

/// An input that is a mutated seed or arbitrary JSON.
fn arb_input(seeds: Vec<Value>) -> impl Strategy<Value = Value> {
    let count = seeds.len();
    prop_oneof![
        4 => (0..count, arb_mutations()).prop_map(move |(i, ms)| {
            let mut v = seeds[i].clone();
            for m in &ms {
                mutate(&mut v, m);
            }
            v
        }),
        1 => arb_json(),
    ]
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if ok {
        Ok(())
    } else {
        Err(TestCaseError::fail(what()))
    }
}

#[test]
fn step_requests() {
    let seeds: Vec<Value> = common::load_cases()
        .into_iter()
        .filter(|c| c.kind == "dp_sgd_step")
        .map(|c| c.input().clone())
        .collect();
    assert!(!seeds.is_empty());
    let backend = backend();
    runner()
        .run(&arb_input(seeds), |input| {
            let Some(input) = through_text(&input) else {
                return Ok(());
            };
            if let Ok(request) = step_request_from_json(&input) {
                let _ = sgd_step(
                    backend.as_ref(),
                    &request.parameter_replicas,
                    &request.gradient_replicas,
                    request.learning_rate,
                )
                .block_on();
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn local_optimizer_state_dicts() {
    let mut seeds = Vec::new();
    for name in ["SGD", "Adam", "AdamW"] {
        let mut replicas = model();
        let mut optim = local(name, &replicas);
        optim.step(&mut replicas).unwrap();
        seeds.push(state(optim.as_ref(), &replicas, 1));
    }
    runner()
        .run(&(arb_input(seeds), 0usize..3), |(input, which)| {
            let Some(input) = through_text(&input) else {
                return Ok(());
            };
            let name = ["SGD", "Adam", "AdamW"][which];
            let mut replicas = model();
            let mut optim = local(name, &replicas);
            optim.step(&mut replicas).unwrap();
            let before = (
                state(optim.as_ref(), &replicas, 0),
                state(optim.as_ref(), &replicas, 1),
            );
            let checked = optim.check_state_dict(&replicas, 1, &input);
            match optim.load_state_dict(&mut replicas, 1, &input) {
                Ok(()) => {
                    check(checked.is_ok(), || {
                        format!("check refused what load took: {checked:?}")
                    })?;
                    grads(&mut replicas);
                    let _ = optim.step(&mut replicas);
                    let _ = state(optim.as_ref(), &replicas, 1);
                }
                Err(error) => {
                    check(checked.as_ref().err() == Some(&error), || {
                        format!("check gave {checked:?}, load {error}")
                    })?;
                    let after = (
                        state(optim.as_ref(), &replicas, 0),
                        state(optim.as_ref(), &replicas, 1),
                    );
                    check(after == before, || {
                        format!("{name}: a refused load changed the state ({error})")
                    })?;
                }
            }
            warnings::take();
            Ok(())
        })
        .unwrap();
}

fn zero(name: &str, replicas: &mut Replicas) -> ZeroRedundancyOptimizer {
    let world = Arc::new(SimulatedWorld::new(2).unwrap());
    let mut zero = ZeroRedundancyOptimizer::new(
        world,
        replicas,
        vec![(vec![0], Default::default()), (vec![1], Default::default())],
        name,
        &option_map(&json!({"lr": 0.1})).unwrap(),
        ZeroOptions::default(),
    )
    .unwrap();
    zero.step(replicas).unwrap();
    zero.consolidate_state_dict(replicas, 0).block_on().unwrap();
    zero
}

#[test]
fn zero_state_dicts() {
    let mut seeds = Vec::new();
    for name in ["SGD", "Adam"] {
        let mut replicas = model_of(DType::Float32);
        seeds.push(zero(name, &mut replicas).state_dict(0).unwrap());
    }
    runner()
        .run(&(arb_input(seeds), any::<bool>()), |(input, adam)| {
            let Some(input) = through_text(&input) else {
                return Ok(());
            };
            let mut replicas = model_of(DType::Float32);
            let mut zero = zero(if adam { "Adam" } else { "SGD" }, &mut replicas);
            let before = zero.state_dict(0).unwrap();
            match zero.load_state_dict(&replicas, &input) {
                Ok(()) => {
                    grads(&mut replicas);
                    let _ = zero.step(&mut replicas);
                }
                Err(error) => {
                    zero.consolidate_state_dict(&replicas, 0)
                        .block_on()
                        .unwrap();
                    let after = zero.state_dict(0).unwrap();
                    check(after == before, || {
                        format!("a refused ZeRO load changed the state ({error})")
                    })?;
                }
            }
            warnings::take();
            Ok(())
        })
        .unwrap();
}

#[test]
fn post_local_sgd_and_diloco_state_dicts() {
    let world = Arc::new(SimulatedWorld::new(2).unwrap());
    let post = |replicas: &mut Replicas| {
        let averager = PeriodicModelAverager::new(2, 0, world.clone()).unwrap();
        let mut post = PostLocalSgdOptimizer::new(local("Adam", replicas), Box::new(averager));
        post.step(replicas).unwrap();
        post
    };
    let diloco = |replicas: &mut Replicas| {
        let (inner, outer) = (local("SGD", replicas), local("SGD", replicas));
        let mut diloco = DiLoCo::new(replicas, inner, outer, 3, world.clone()).unwrap();
        diloco.step(replicas).unwrap();
        diloco
    };
    // Streaming DiLoCo with fragment 0's all-reduce in flight after one step (H = 4, two
    // fragments, fragment_sync_delay 1): its state dict carries a `pending` entry.
    let streaming = |replicas: &mut Replicas| {
        let (inner, outer) = (local("SGD", replicas), local("SGD", replicas));
        let options = DiLoCoOptions {
            fragments: Some(vec![vec![0], vec![1]]),
            fragment_sync_delay: 1,
            fragment_update_alpha: Some(0.25),
            ..DiLoCoOptions::default()
        };
        let mut diloco =
            DiLoCo::with_options(replicas, inner, outer, 4, world.clone(), options).unwrap();
        diloco.step(replicas).unwrap();
        diloco
    };
    let mut replicas = model_of(DType::Float32);
    let seeds = vec![
        post(&mut replicas)
            .state_dict(&replicas, 0)
            .block_on()
            .unwrap(),
        diloco(&mut replicas)
            .state_dict(&replicas, 0)
            .block_on()
            .unwrap(),
        streaming(&mut replicas)
            .state_dict(&replicas, 0)
            .block_on()
            .unwrap(),
    ];
    assert!(
        !seeds[2]["pending"].is_null(),
        "the streaming seed has a fragment in flight"
    );
    runner()
        .run(&arb_input(seeds), |input| {
            let Some(input) = through_text(&input) else {
                return Ok(());
            };
            let mut replicas = model_of(DType::Float32);
            let mut p = post(&mut replicas);
            let before = p.state_dict(&replicas, 1).block_on().unwrap();
            if let Err(error) = p.load_state_dict(&mut replicas, 1, &input) {
                let after = p.state_dict(&replicas, 1).block_on().unwrap();
                check(after == before, || {
                    format!("a refused post-local load changed the state ({error})")
                })?;
            } else {
                grads(&mut replicas);
                let _ = p.step(&mut replicas);
            }
            let mut replicas = model_of(DType::Float32);
            let mut d = diloco(&mut replicas);
            let before = d.state_dict(&replicas, 1).block_on().unwrap();
            if let Err(error) = d.load_state_dict(&mut replicas, 1, &input) {
                let after = d.state_dict(&replicas, 1).block_on().unwrap();
                check(after == before, || {
                    format!("a refused DiLoCo load changed the state ({error})")
                })?;
            } else {
                grads(&mut replicas);
                let _ = d.step(&mut replicas);
            }
            let mut replicas = model_of(DType::Float32);
            let mut d = streaming(&mut replicas);
            let before = d.state_dict(&replicas, 1).block_on().unwrap();
            if let Err(error) = d.load_state_dict(&mut replicas, 1, &input) {
                let after = d.state_dict(&replicas, 1).block_on().unwrap();
                check(after == before, || {
                    format!("a refused Streaming DiLoCo load changed the state ({error})")
                })?;
            } else {
                grads(&mut replicas);
                let _ = d.step(&mut replicas);
            }
            warnings::take();
            Ok(())
        })
        .unwrap();
}

#[test]
fn golden_case_reader() {
    let texts: Vec<(std::path::PathBuf, String)> = common::load_cases()
        .into_iter()
        .filter(|c| std::fs::metadata(&c.path).is_ok_and(|m| m.len() < 20_000))
        .map(|c| {
            let text = std::fs::read_to_string(&c.path).unwrap();
            (c.path, text)
        })
        .collect();
    assert!(!texts.is_empty());
    let count = texts.len();
    let edits = prop::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..6);
    runner()
        .run(
            &(0..count, edits, arb_mutations()),
            |(i, edits, mutations)| {
                let (path, text) = &texts[i];
                // Byte-level edits of the text (kept valid UTF-8).
                let mut bytes = text.clone().into_bytes();
                for (at, byte, op) in &edits {
                    let at = at % (bytes.len() + 1);
                    match op {
                        0 if at < bytes.len() => bytes[at] = byte & 0x7f,
                        1 if at < bytes.len() => {
                            bytes.remove(at);
                        }
                        _ => bytes.insert(at, byte & 0x7f),
                    }
                }
                let edited = String::from_utf8(bytes).expect("ASCII edits");
                let _ = common::parse_case(path, &edited).map(|c| c.kind);
                // Value-level mutations, through text.
                let mut value: Value = serde_json::from_str(text).unwrap();
                for m in &mutations {
                    mutate(&mut value, m);
                }
                let text = serde_json::to_string(&value).unwrap();
                if let Ok(case) = common::parse_case(Path::new(path), &text) {
                    let _ = (
                        case.input(),
                        case.expected(),
                        case.tolerance(DType::Float16),
                    );
                }
                Ok(())
            },
        )
        .unwrap();
}
