//! Misuse of the optimizers through the Rust API: each case checks PyTorch's error kind and
//! text (or distopt's, where PyTorch would silently accept), that nothing changed, and that
//! the object still works afterwards.

use std::sync::Arc;

use distopt::BlockOn;
use distopt::averaging::PeriodicModelAverager;
use distopt::comm::SimulatedWorld;
use distopt::diloco::DiLoCo;
use distopt::optim::{
    self, Adam, AdamOptions, AdamWOptions, DUPLICATE_WARNING, LocalOptimizer, OptimizerKind, Sgd,
    SgdOptions, option_map,
};
use distopt::post_local_sgd::PostLocalSgdOptimizer;
use distopt::replicas::Replicas;
use distopt::zero::{ZeroOptions, ZeroRedundancyOptimizer};
use distopt::{CpuBackend, Error, ErrorKind, Tensor, warnings};
use serde_json::{Value, json};

/// Two ranks of three float32 parameters, each rank with gradients on all of them.
fn model(ranks: usize) -> Replicas {
    let params = [
        Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap(),
        Tensor::from_f32(&[3], vec![3.0, 4.0, 5.0]).unwrap(),
        Tensor::from_f32(&[1], vec![6.0]).unwrap(),
    ];
    let mut replicas = Replicas::replicate(Arc::new(CpuBackend::new()), ranks, &params).unwrap();
    grads(&mut replicas);
    replicas
}

fn grads(replicas: &mut Replicas) {
    for rank in 0..replicas.ranks() {
        let g = |n: usize| Some(Tensor::from_f32(&[n], vec![0.5 + rank as f32; n]).unwrap());
        replicas.set_grads(rank, &[g(2), g(3), g(1)]).unwrap();
    }
}

fn options(value: Value) -> optim::OptionMap {
    option_map(&value).unwrap()
}

fn create(
    name: &str,
    replicas: &Replicas,
    groups: Vec<Vec<usize>>,
    defaults: Value,
) -> Result<Box<dyn LocalOptimizer>, Error> {
    optim::create(
        name,
        replicas,
        groups
            .into_iter()
            .map(|g| (g, Default::default()))
            .collect(),
        &options(defaults),
    )
}

fn assert_error(result: Result<impl std::fmt::Debug, Error>, kind: ErrorKind, message: &str) {
    let error = result.expect_err("expected an error");
    assert_eq!(error.kind(), kind, "{error}");
    assert_eq!(error.message(), message);
}

fn state(optim: &dyn LocalOptimizer, replicas: &Replicas, rank: usize) -> Value {
    pollster::block_on(optim.state_dict(replicas, rank)).unwrap()
}

fn params(replicas: &Replicas) -> Vec<Vec<f64>> {
    (0..replicas.ranks())
        .flat_map(|r| (0..replicas.len()).map(move |j| (r, j)))
        .map(|(r, j)| {
            replicas
                .param(r, j)
                .block_on()
                .unwrap()
                .values_f64()
                .unwrap()
        })
        .collect()
}

/// The optimizer still steps: parameters move, and its state dict still reads.
fn assert_usable(optim: &mut dyn LocalOptimizer, replicas: &mut Replicas) {
    let before = params(replicas);
    optim.step(replicas).unwrap();
    assert_ne!(params(replicas), before, "the step moved nothing");
    state(optim, replicas, 0);
}

#[test]
fn add_param_group_refuses_a_parameter_another_group_holds() {
    for name in ["SGD", "Adam", "AdamW"] {
        let mut replicas = model(2);
        let mut optim = create(name, &replicas, vec![vec![0, 1]], json!({"lr": 0.1})).unwrap();
        for params in [vec![1], vec![2, 0]] {
            assert_error(
                optim.add_param_group(params, &options(json!({"lr": 0.5}))),
                ErrorKind::ValueError,
                "some parameters appear in more than one parameter group",
            );
            assert_eq!(optim.param_groups(), vec![vec![0, 1]], "{name}");
        }
        // The same across the constructor's groups.
        assert_error(
            create(name, &replicas, vec![vec![0], vec![1, 0]], json!({})),
            ErrorKind::ValueError,
            "some parameters appear in more than one parameter group",
        );
        optim
            .add_param_group(vec![2], &options(json!({"lr": 0.5})))
            .unwrap();
        assert_eq!(optim.param_groups(), vec![vec![0, 1], vec![2]]);
        // One step moves parameter 2 once, by lr 0.5 (SGD: 6 - 0.5 · 0.5).
        optim.step(&mut replicas).unwrap();
        if name == "SGD" {
            let p = replicas
                .param(0, 2)
                .block_on()
                .unwrap()
                .values_f64()
                .unwrap();
            assert_eq!(p, vec![5.75]);
        }
        let saved = state(optim.as_ref(), &replicas, 0);
        assert_eq!(saved["param_groups"][1]["params"], json!([2]), "{name}");
    }
}

#[test]
fn a_parameter_twice_in_one_group_warns_as_pytorch_and_is_optimized_once() {
    let mut replicas = model(1);
    warnings::take();
    let mut sgd = create("SGD", &replicas, vec![vec![0, 0, 1]], json!({"lr": 1.0})).unwrap();
    assert_eq!(warnings::take(), vec![DUPLICATE_WARNING.to_string()]);
    assert_eq!(sgd.param_groups(), vec![vec![0, 1]]);
    sgd.step(&mut replicas).unwrap();
    assert_eq!(
        replicas
            .param(0, 0)
            .block_on()
            .unwrap()
            .values_f64()
            .unwrap(),
        vec![0.5, 1.5]
    );
    // add_param_group warns the same way.
    sgd.add_param_group(vec![2, 2], &Default::default())
        .unwrap();
    assert_eq!(warnings::take(), vec![DUPLICATE_WARNING.to_string()]);
    assert_eq!(sgd.param_groups(), vec![vec![0, 1], vec![2]]);
}

#[test]
fn zero_warns_about_a_parameter_listed_twice() {
    let replicas = model(2);
    let world = Arc::new(SimulatedWorld::new(2).unwrap());
    warnings::take();
    let zero = ZeroRedundancyOptimizer::new(
        world.clone(),
        &replicas,
        vec![(vec![0, 0], Default::default())],
        "SGD",
        &options(json!({"lr": 0.1})),
        ZeroOptions::default(),
    );
    assert!(zero.is_ok());
    assert!(
        warnings::take().iter().any(|w| w == DUPLICATE_WARNING),
        "ZeRO over [0, 0] must warn"
    );
    assert_error(
        ZeroRedundancyOptimizer::new(
            world,
            &replicas,
            vec![
                (vec![0], Default::default()),
                (vec![1, 0], Default::default()),
            ],
            "SGD",
            &Default::default(),
            ZeroOptions::default(),
        ),
        ErrorKind::ValueError,
        "some parameters appear in more than one parameter group",
    );
}

#[test]
fn an_empty_parameter_list_is_refused() {
    let replicas = model(1);
    for name in ["SGD", "Adam", "AdamW"] {
        assert_error(
            create(name, &replicas, vec![], json!({})),
            ErrorKind::ValueError,
            "optimizer got an empty parameter list",
        );
    }
    // PyTorch accepts a group without parameters (`SGD([{'params': []}])`).
    let mut sgd = create("SGD", &replicas, vec![vec![]], json!({})).unwrap();
    sgd.add_param_group(vec![0], &Default::default()).unwrap();
    assert_eq!(sgd.param_groups(), vec![vec![], vec![0]]);
}

#[test]
fn hyper_parameters_are_checked_with_pytorchs_texts() {
    let replicas = model(1);
    let cases: &[(&str, Value, &str)] = &[
        ("Adam", json!({"lr": -0.1}), "Invalid learning rate: -0.1"),
        (
            "Adam",
            json!({"eps": -1e-8}),
            "Invalid epsilon value: -1e-08",
        ),
        (
            "AdamW",
            json!({"betas": [1.0, 0.9]}),
            "Invalid beta parameter at index 0: 1.0",
        ),
        (
            "AdamW",
            json!({"betas": [0.9, -0.5]}),
            "Invalid beta parameter at index 1: -0.5",
        ),
        (
            "Adam",
            json!({"weight_decay": -1}),
            "Invalid weight_decay value: -1.0",
        ),
        ("SGD", json!({"lr": -1e-3}), "Invalid learning rate: -0.001"),
        (
            "SGD",
            json!({"momentum": -0.5}),
            "Invalid momentum value: -0.5",
        ),
        (
            "SGD",
            json!({"weight_decay": -2.5}),
            "Invalid weight_decay value: -2.5",
        ),
        (
            "SGD",
            json!({"nesterov": true}),
            "Nesterov momentum requires a momentum and zero dampening",
        ),
    ];
    for (name, defaults, message) in cases {
        assert_error(
            create(name, &replicas, vec![vec![0]], defaults.clone()),
            ErrorKind::ValueError,
            message,
        );
    }
    // NaN (JSON cannot hold it: the typed constructors can). PyTorch's Adam refuses it
    // (`not 0.0 <= lr`); its SGD (`lr < 0.0`) lets it through.
    assert_error(
        Adam::new(&replicas, AdamOptions::default().with_lr(f64::NAN)),
        ErrorKind::ValueError,
        "Invalid learning rate: nan",
    );
    assert_error(
        Adam::adamw(&replicas, AdamWOptions::default().with_eps(f64::NAN)),
        ErrorKind::ValueError,
        "Invalid epsilon value: nan",
    );
    assert_error(
        Adam::new(
            &replicas,
            AdamOptions::default().with_betas((f64::NAN, 0.9)),
        ),
        ErrorKind::ValueError,
        "Invalid beta parameter at index 0: nan",
    );
    assert_error(
        Adam::new(&replicas, AdamOptions::default().with_lr(f64::NEG_INFINITY)),
        ErrorKind::ValueError,
        "Invalid learning rate: -inf",
    );
    assert!(
        Adam::new(
            &replicas,
            AdamOptions::default().with_weight_decay(f64::INFINITY)
        )
        .is_ok()
    );
    assert!(Sgd::new(&replicas, SgdOptions::default().with_lr(f64::NAN)).is_ok());
    assert_error(
        Sgd::new(
            &replicas,
            SgdOptions::default().with_momentum(f64::NEG_INFINITY),
        ),
        ErrorKind::ValueError,
        "Invalid momentum value: -inf",
    );
    // Wrong types and unknown keywords.
    assert_error(
        create("SGD", &replicas, vec![vec![0]], json!({"lr": "fast"})),
        ErrorKind::TypeError,
        "option 'lr' must be a number, got \"fast\"",
    );
    assert_error(
        create(
            "SGD",
            &replicas,
            vec![vec![0]],
            json!({"betas": [0.9, 0.99]}),
        ),
        ErrorKind::TypeError,
        "SGD.__init__() got an unexpected keyword argument 'betas'",
    );
    assert_error(
        create(
            "AdamW",
            &replicas,
            vec![vec![0]],
            json!({"decoupled_weight_decay": false}),
        ),
        ErrorKind::TypeError,
        "AdamW.__init__() got an unexpected keyword argument 'decoupled_weight_decay'",
    );
}

#[test]
fn one_name_table_for_every_optimizer_front() {
    for kind in OptimizerKind::ALL {
        assert_eq!(kind.name().parse::<OptimizerKind>().unwrap(), kind);
    }
    let replicas = model(2);
    let message = "unknown optimizer 'Adagrad': expected SGD, Adam or AdamW";
    assert_error(
        create("Adagrad", &replicas, vec![vec![0]], json!({})),
        ErrorKind::ValueError,
        message,
    );
    assert_error(
        ZeroRedundancyOptimizer::new(
            Arc::new(SimulatedWorld::new(2).unwrap()),
            &replicas,
            vec![(vec![0], Default::default())],
            "Adagrad",
            &Default::default(),
            ZeroOptions::default(),
        ),
        ErrorKind::ValueError,
        message,
    );
    // A user's long string is not echoed back whole.
    let long = "x".repeat(100_000);
    let error = long.parse::<OptimizerKind>().unwrap_err();
    assert!(error.message().len() < 200, "{}", error.message().len());
    // Each optimizer reports its own class.
    for kind in OptimizerKind::ALL {
        let optim = optim::build(
            kind,
            &replicas,
            vec![(vec![0], Default::default())],
            &Default::default(),
        )
        .unwrap();
        assert_eq!(optim.kind(), kind);
        assert_eq!(optim.name(), kind.name());
    }
}

#[test]
fn adam_and_adamw_cannot_disagree() {
    let replicas = model(1);
    let adamw = Adam::adamw(&replicas, AdamWOptions::default()).unwrap();
    let options = adamw.groups()[0].options();
    assert_eq!(adamw.kind(), OptimizerKind::AdamW);
    assert!(options.decoupled_weight_decay);
    assert_eq!(options.weight_decay, 1e-2);
    let adam = Adam::new(&replicas, AdamOptions::default()).unwrap();
    assert_eq!(adam.kind(), OptimizerKind::Adam);
    assert!(!adam.groups()[0].options().decoupled_weight_decay);
    assert_eq!(adam.groups()[0].options().weight_decay, 0.0);
    assert_error(
        Adam::from_options(
            OptimizerKind::Sgd,
            &replicas,
            vec![(vec![0], Default::default())],
            &Default::default(),
        ),
        ErrorKind::ValueError,
        "SGD is not Adam or AdamW",
    );
}

/// A state dict after two steps of `name` over all three parameters.
fn stepped_state(name: &str, ranks: usize) -> (Replicas, Box<dyn LocalOptimizer>) {
    let mut replicas = model(ranks);
    let defaults = if name == "SGD" {
        json!({"lr": 0.1, "momentum": 0.9})
    } else {
        json!({"lr": 0.1, "amsgrad": true})
    };
    let mut optim = create(name, &replicas, vec![vec![0, 1], vec![2]], defaults).unwrap();
    optim.step(&mut replicas).unwrap();
    optim.step(&mut replicas).unwrap();
    (replicas, optim)
}

#[test]
fn a_state_dict_of_another_optimizer_class_is_refused_and_nothing_changes() {
    for (from, into) in [
        ("Adam", "SGD"),
        ("AdamW", "SGD"),
        ("SGD", "Adam"),
        ("SGD", "AdamW"),
    ] {
        let (other_replicas, other) = stepped_state(from, 1);
        let foreign = state(other.as_ref(), &other_replicas, 0);
        let (mut replicas, mut optim) = stepped_state(into, 1);
        let before = state(optim.as_ref(), &replicas, 0);
        let error = optim
            .load_state_dict(&mut replicas, 0, &foreign)
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ValueError);
        assert!(
            error
                .message()
                .starts_with(&format!("cannot load a state dict of {from} into {into}: its parameter group 0 has the option '")),
            "{error}"
        );
        assert_eq!(
            state(optim.as_ref(), &replicas, 0),
            before,
            "{from} into {into}"
        );
        assert_usable(optim.as_mut(), &mut replicas);
    }
    // Adam's and AdamW's layouts are the same class in PyTorch (AdamW is Adam with decoupled
    // weight decay): their state dicts load into each other.
    let (r, adam) = stepped_state("Adam", 1);
    let saved = state(adam.as_ref(), &r, 0);
    let (mut replicas, mut adamw) = stepped_state("AdamW", 1);
    adamw.load_state_dict(&mut replicas, 0, &saved).unwrap();
}

#[test]
fn a_malformed_state_dict_changes_nothing() {
    let (mut replicas, mut adam) = stepped_state("Adam", 2);
    let good = state(adam.as_ref(), &replicas, 1);
    type Mutation = Box<dyn Fn(&mut Value)>;
    let mutations: Vec<(Mutation, ErrorKind, &str)> = vec![
        (
            // Parameter 0's state is fine; parameter 2's exp_avg_sq is missing.
            Box::new(|sd: &mut Value| {
                sd["state"]["2"]
                    .as_object_mut()
                    .unwrap()
                    .remove("exp_avg_sq");
            }),
            ErrorKind::ValueError,
            "state of parameter 2 has no \"exp_avg_sq\"",
        ),
        (
            Box::new(|sd: &mut Value| sd["state"]["1"]["exp_avg"] = json!([1.0, 2.0])),
            ErrorKind::ValueError,
            "loaded state of shape [2] does not fit a parameter of shape [3]",
        ),
        (
            Box::new(|sd: &mut Value| sd["state"]["0"]["step"] = json!(-3.0)),
            ErrorKind::ValueError,
            "state of parameter 0 has an invalid step -3.0",
        ),
        (
            Box::new(|sd: &mut Value| sd["param_groups"][1]["lr"] = json!("fast")),
            ErrorKind::TypeError,
            "option 'lr' must be a number, got \"fast\"",
        ),
        (
            Box::new(|sd: &mut Value| {
                sd["param_groups"][0]["params"] = json!([0]);
            }),
            ErrorKind::ValueError,
            "loaded state dict contains a parameter group that doesn't match the size of optimizer's group",
        ),
        (
            Box::new(|sd: &mut Value| {
                sd["param_groups"].as_array_mut().unwrap().pop();
            }),
            ErrorKind::ValueError,
            "loaded state dict has a different number of parameter groups",
        ),
        (
            Box::new(|sd: &mut Value| sd["state"] = json!([1, 2])),
            ErrorKind::TypeError,
            "state_dict[\"state\"] must be a dict",
        ),
    ];
    // A changed lr in group 0 shows whether the groups were replaced.
    let mut fresh = good.clone();
    fresh["param_groups"][0]["lr"] = json!(0.25);
    for (mutate, kind, message) in mutations {
        let before0 = state(adam.as_ref(), &replicas, 0);
        let before1 = state(adam.as_ref(), &replicas, 1);
        let mut bad = fresh.clone();
        mutate(&mut bad);
        assert_error(adam.load_state_dict(&mut replicas, 1, &bad), kind, message);
        assert_eq!(state(adam.as_ref(), &replicas, 0), before0, "{message}");
        assert_eq!(state(adam.as_ref(), &replicas, 1), before1, "{message}");
    }
    adam.load_state_dict(&mut replicas, 1, &fresh).unwrap();
    assert_eq!(
        state(adam.as_ref(), &replicas, 1)["param_groups"][0]["lr"],
        json!(0.25)
    );
    grads(&mut replicas);
    assert_usable(adam.as_mut(), &mut replicas);
}

#[test]
fn zero_refuses_another_classes_state_dict_and_keeps_its_own() {
    let world = Arc::new(SimulatedWorld::new(2).unwrap());
    let zero = |name: &str, replicas: &mut Replicas| {
        let mut zero = ZeroRedundancyOptimizer::new(
            world.clone(),
            replicas,
            vec![((0..3).collect(), Default::default())],
            name,
            &options(json!({"lr": 0.1})),
            ZeroOptions::default(),
        )
        .unwrap();
        zero.step(replicas).unwrap();
        zero.consolidate_state_dict(replicas, 0).block_on().unwrap();
        zero
    };
    let mut adam_model = model(2);
    let adam = zero("Adam", &mut adam_model);
    let foreign = adam.state_dict(0).unwrap();
    let mut replicas = model(2);
    let mut sgd = zero("SGD", &mut replicas);
    let before = sgd.state_dict(0).unwrap();
    // Every local rank's error is the same: the first is the one to check.
    let error = distopt::Error::from(sgd.load_state_dict(&replicas, &foreign).unwrap_err());
    assert_eq!(error.kind(), ErrorKind::ValueError);
    assert!(
        error
            .message()
            .starts_with("cannot load a state dict of Adam into SGD"),
        "{error}"
    );
    sgd.consolidate_state_dict(&replicas, 0).block_on().unwrap();
    assert_eq!(sgd.state_dict(0).unwrap(), before);
    // Usable: a step still moves the parameters.
    grads(&mut replicas);
    let p = params(&replicas);
    sgd.step(&mut replicas).unwrap();
    assert_ne!(params(&replicas), p);
}

#[test]
fn post_local_sgd_refuses_a_fractional_step_before_changing_anything() {
    let world = Arc::new(SimulatedWorld::new(2).unwrap());
    let (mut replicas, sgd) = stepped_state("SGD", 2);
    let averager = PeriodicModelAverager::new(2, 0, world).unwrap();
    let mut post = PostLocalSgdOptimizer::new(sgd, Box::new(averager));
    let mut saved = post.state_dict(&replicas, 0).block_on().unwrap();
    let before = saved.clone();
    saved["step"] = json!(2.9);
    saved["param_groups"][0]["lr"] = json!(0.5);
    assert_error(
        post.load_state_dict(&mut replicas, 0, &saved),
        ErrorKind::ValueError,
        "\"step\" must be a non-negative integer, got 2.9",
    );
    assert_eq!(post.state_dict(&replicas, 0).block_on().unwrap(), before);
    saved["step"] = json!(3);
    post.load_state_dict(&mut replicas, 0, &saved).unwrap();
    assert_eq!(
        post.state_dict(&replicas, 0).block_on().unwrap()["step"],
        json!(3)
    );
    post.step(&mut replicas).unwrap();
}

#[test]
fn diloco_checks_both_optimizers_before_loading_either() {
    let world = Arc::new(SimulatedWorld::new(2).unwrap());
    let mut replicas = model(2);
    let sgd = |lr: f64| {
        create(
            "SGD",
            &replicas,
            vec![vec![0, 1, 2]],
            json!({"lr": lr, "momentum": 0.5}),
        )
        .unwrap()
    };
    let (inner, outer) = (sgd(0.1), sgd(0.7));
    let mut diloco = DiLoCo::new(&replicas, inner, outer, 2, world).unwrap();
    diloco.step(&mut replicas).unwrap();
    let before = diloco.state_dict(&replicas, 0).block_on().unwrap();
    let (r, adam) = stepped_state("Adam", 1);
    let mut bad = before.clone();
    bad["inner_optimizer"]["param_groups"][0]["lr"] = json!(0.3);
    bad["outer_optimizer"] = state(adam.as_ref(), &r, 0);
    // Adam's state dict has two groups: refused before the inner optimizer changes.
    let error = diloco.load_state_dict(&mut replicas, 0, &bad).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ValueError, "{error}");
    assert_eq!(diloco.state_dict(&replicas, 0).block_on().unwrap(), before);
    grads(&mut replicas);
    diloco.step(&mut replicas).unwrap();
}

#[test]
fn zero_add_param_group_that_fails_leaves_the_optimizer_as_it_was() {
    let world = Arc::new(SimulatedWorld::new(2).unwrap());
    let mut replicas = model(2);
    let mut zero = ZeroRedundancyOptimizer::new(
        world,
        &replicas,
        vec![(vec![0, 1], Default::default())],
        "SGD",
        &options(json!({"lr": 0.1})),
        ZeroOptions::default(),
    )
    .unwrap();
    let groups = zero.param_groups();
    let error = distopt::Error::from(
        zero.add_param_group(&replicas, vec![2], &options(json!({"lr": 0.5, "nope": 1})))
            .block_on()
            .unwrap_err(),
    );
    assert_eq!(error.kind(), ErrorKind::TypeError, "{error}");
    assert_eq!(
        zero.param_groups(),
        groups,
        "the refused group is not recorded"
    );
    // The same group is accepted afterwards, and a step updates every parameter.
    zero.add_param_group(&replicas, vec![2], &options(json!({"lr": 0.5})))
        .block_on()
        .unwrap();
    assert_eq!(zero.param_groups().len(), 2);
    let p = params(&replicas);
    zero.step(&mut replicas).unwrap();
    let after = params(&replicas);
    for (k, (a, b)) in after.iter().zip(&p).enumerate() {
        assert_ne!(a, b, "rank {}'s parameter {} stepped", k / 3, k % 3);
    }
}

#[test]
fn zero_bucket_view_refuses_a_group_of_another_dtype() {
    // Two float32 parameters and a float64 one. PyTorch checks dtypes only in its constructor,
    // and its bucket view then casts a rank's parameters to the dtype of its last one; distopt
    // keeps every dtype, so the bucket view refuses the group and the plain layout takes it.
    let params = [
        Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap(),
        Tensor::from_f32(&[3], vec![3.0, 4.0, 5.0]).unwrap(),
        Tensor::from_f64(distopt::DType::Float64, &[2], &[0.1, 0.2]).unwrap(),
    ];
    for bucket in [true, false] {
        let world = Arc::new(SimulatedWorld::new(2).unwrap());
        let mut replicas = Replicas::replicate(Arc::new(CpuBackend::new()), 2, &params).unwrap();
        let mut zero = ZeroRedundancyOptimizer::new(
            world,
            &replicas,
            vec![(vec![0, 1], Default::default())],
            "SGD",
            &options(json!({"lr": 0.5})),
            ZeroOptions::default().with_parameters_as_bucket_view(bucket),
        )
        .unwrap();
        let added = zero
            .add_param_group(&replicas, vec![2], &Default::default())
            .block_on()
            .map_err(distopt::Error::from);
        if bucket {
            assert_error(
                added,
                ErrorKind::ValueError,
                "ZeroRedundancyOptimizer only supports using the same dense type for all parameters but got both torch.FloatTensor and torch.DoubleTensor",
            );
            assert_eq!(zero.param_groups(), vec![vec![0, 1]]);
        } else {
            added.unwrap();
        }
        for rank in 0..2 {
            let g = |n: usize, dtype| Some(Tensor::from_f64(dtype, &[n], &vec![1.0; n]).unwrap());
            let f32 = distopt::DType::Float32;
            let grads = [g(2, f32), g(3, f32), g(2, distopt::DType::Float64)];
            replicas.set_grads(rank, &grads).unwrap();
        }
        zero.step(&mut replicas).unwrap();
        // Every rank holds every update: the float32 ones, and the float64 one when added.
        let moved = if bucket {
            vec![0.1, 0.2]
        } else {
            vec![-0.4, -0.3]
        };
        for rank in 0..2 {
            let p = |j| {
                replicas
                    .param(rank, j)
                    .block_on()
                    .unwrap()
                    .values_f64()
                    .unwrap()
            };
            assert_eq!(p(0), vec![0.5, 1.5], "bucket view {bucket}, rank {rank}");
            assert_eq!(
                p(1),
                vec![2.5, 3.5, 4.5],
                "bucket view {bucket}, rank {rank}"
            );
            assert_eq!(p(2), moved, "bucket view {bucket}, rank {rank}");
        }
    }
}

/// A real [`SimulatedWorld`] whose collectives fail on demand (a lost peer, a broken transport):
/// the arithmetic stays real, only the failure path is provoked. `fail` makes every following
/// rank-axis collective fail before it touches the arena.
#[derive(Debug)]
struct FailingWorld {
    inner: SimulatedWorld,
    fail: std::sync::atomic::AtomicBool,
}

impl FailingWorld {
    fn new(size: usize) -> Arc<FailingWorld> {
        Arc::new(FailingWorld {
            inner: SimulatedWorld::new(size).unwrap(),
            fail: false.into(),
        })
    }

    fn set_failing(&self, fail: bool) {
        self.fail.store(fail, std::sync::atomic::Ordering::SeqCst);
    }

    fn check(&self) -> distopt::Result<()> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::runtime("the transport failed (test double)"));
        }
        Ok(())
    }
}

mod failing_world {
    use super::FailingWorld;
    use distopt::Result;
    use distopt::backend::{Arena, Backend};
    use distopt::comm::{
        AllReduceMeanArgs, AllReduceScaledSumArgs, BroadcastRegion, CommStats, Communicator,
    };

    impl Communicator for FailingWorld {
        fn world_size(&self) -> usize {
            self.inner.world_size()
        }
        fn all_reduce_mean(
            &self,
            backend: &dyn Backend,
            arena: &mut Arena,
            mean: AllReduceMeanArgs<'_>,
        ) -> Result<()> {
            self.check()?;
            self.inner.all_reduce_mean(backend, arena, mean)
        }
        fn all_reduce_scaled_sum(
            &self,
            backend: &dyn Backend,
            arena: &mut Arena,
            sum: AllReduceScaledSumArgs<'_>,
        ) -> Result<()> {
            self.check()?;
            self.inner.all_reduce_scaled_sum(backend, arena, sum)
        }
        fn broadcast(
            &self,
            backend: &dyn Backend,
            arena: &mut Arena,
            root: usize,
            offset: usize,
            len: usize,
        ) -> Result<()> {
            self.check()?;
            self.inner.broadcast(backend, arena, root, offset, len)
        }
        fn broadcast_regions(
            &self,
            backend: &dyn Backend,
            src: Option<&Arena>,
            dst: &mut Arena,
            root: usize,
            regions: &[BroadcastRegion],
        ) -> Result<()> {
            self.check()?;
            self.inner
                .broadcast_regions(backend, src, dst, root, regions)
        }
        fn all_reduce_sum_f32(&self, per_local_rank: &[Vec<f32>]) -> Result<Vec<f32>> {
            self.inner.all_reduce_sum_f32(per_local_rank)
        }
        fn broadcast_bytes(&self, root: usize, data: Option<Vec<u8>>) -> Result<Vec<u8>> {
            self.inner.broadcast_bytes(root, data)
        }
        fn all_gather_bytes(&self, per_local_rank: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
            self.inner.all_gather_bytes(per_local_rank)
        }
        fn gather_bytes(
            &self,
            to: usize,
            per_local_rank: Vec<Vec<u8>>,
        ) -> Result<Option<Vec<Vec<u8>>>> {
            self.inner.gather_bytes(to, per_local_rank)
        }
        fn stats(&self) -> CommStats {
            self.inner.stats()
        }
        fn reset_stats(&self) {
            self.inner.reset_stats()
        }
    }
}

fn grads_of(replicas: &Replicas) -> Vec<Vec<Option<Vec<f64>>>> {
    replicas
        .all_grads()
        .block_on()
        .unwrap()
        .into_iter()
        .map(|rank| {
            rank.into_iter()
                .map(|g| g.map(|g| g.values_f64().unwrap()))
                .collect()
        })
        .collect()
}

/// A failed gradient all-reduce during the warm-up does not count the iteration (the counter
/// is as before the call, so the warm-up still lasts `start_localSGD_iter` successful
/// iterations); a successful one counts it as PyTorch's `maybe_increase_iter` does.
#[test]
fn post_local_sgd_state_counts_only_successful_iterations() {
    use distopt::post_local_sgd::PostLocalSgdState;
    let world = FailingWorld::new(2);
    let mut replicas = model(2);
    let mut state = PostLocalSgdState::new(world.clone(), Some(1), 2, true).unwrap();
    let grads_before = grads_of(&replicas);
    world.set_failing(true);
    let error = state.synchronize_gradients(&mut replicas).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::RuntimeError, "{error}");
    assert_eq!(state.iter(), 0, "a failed warm-up iteration is not counted");
    assert_eq!(grads_of(&replicas), grads_before, "nothing was reduced");
    world.set_failing(false);
    // Two successful warm-up iterations (world all-reduce), then local SGD (subgroups of 1).
    assert_eq!(state.synchronize_gradients(&mut replicas).unwrap(), Some(2));
    assert_eq!(state.iter(), 1);
    // The mean of rank 0's 0.5 and rank 1's 1.5 on both ranks.
    assert_eq!(grads_of(&replicas)[1][0], Some(vec![1.0, 1.0]));
    world.set_failing(true);
    state.synchronize_gradients(&mut replicas).unwrap_err();
    assert_eq!(state.iter(), 1);
    world.set_failing(false);
    assert_eq!(state.synchronize_gradients(&mut replicas).unwrap(), Some(2));
    assert_eq!(state.iter(), 2);
    assert_eq!(state.synchronize_gradients(&mut replicas).unwrap(), Some(1));
    assert_eq!(
        state.iter(),
        2,
        "PyTorch stops counting once local SGD starts"
    );
}

/// The averagers count a step only when its averaging succeeded: a failed collective leaves
/// the counter as it was, and the next call averages at the same step.
#[test]
fn averagers_count_only_successful_steps() {
    use distopt::averaging::{HierarchicalModelAverager, ModelAverager};
    let world = FailingWorld::new(4);
    let averagers: Vec<Box<dyn ModelAverager>> = vec![
        Box::new(PeriodicModelAverager::new(2, 1, world.clone()).unwrap()),
        Box::new(HierarchicalModelAverager::new(&[(1, 2), (4, 4)], 1, world.clone()).unwrap()),
    ];
    for mut averager in averagers {
        let mut replicas = model(4);
        // Step 0 is a warm-up step: no collective, counted.
        world.set_failing(true);
        assert_eq!(
            averager.average_parameters(&mut replicas, None).unwrap(),
            None
        );
        assert_eq!(averager.step(), 1);
        let before = params(&replicas);
        let error = averager
            .average_parameters(&mut replicas, None)
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::RuntimeError, "{error}");
        assert_eq!(
            averager.step(),
            1,
            "{averager:?}: a failed step is not counted"
        );
        assert_eq!(params(&replicas), before);
        world.set_failing(false);
        assert!(
            averager
                .average_parameters(&mut replicas, None)
                .unwrap()
                .is_some()
        );
        assert_eq!(averager.step(), 2);
    }
}

/// `PostLocalSGDOptimizer.step()` refuses what its averager would refuse before the local
/// step changes anything (here: averaging groups of another world); when the collective
/// itself fails, the local step stays applied and the averager's counter does not advance.
#[test]
fn post_local_sgd_optimizer_refuses_before_its_local_step() {
    use distopt::comm::{Subgroups, new_subgroups};
    let world = FailingWorld::new(2);
    let mut replicas = model(2);
    let sgd = create(
        "SGD",
        &replicas,
        vec![vec![0, 1, 2]],
        json!({"lr": 0.1, "momentum": 0.9}),
    )
    .unwrap();
    // Groups of 2 in a world of 4: not this world's partition.
    let averager =
        PeriodicModelAverager::with_group(1, 0, world.clone(), new_subgroups(4, 2).unwrap())
            .unwrap();
    warnings::take();
    let mut post = PostLocalSgdOptimizer::new(sgd, Box::new(averager));
    let (before, state_before) = (
        params(&replicas),
        post.state_dict(&replicas, 0).block_on().unwrap(),
    );
    let error = post.step(&mut replicas).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ValueError, "{error}");
    assert_eq!(params(&replicas), before, "the local step did not run");
    assert_eq!(
        post.state_dict(&replicas, 0).block_on().unwrap(),
        state_before
    );
    assert_eq!(post.averager().step(), 0);

    // A collective that fails at run time: the local step is applied, the averager's counter
    // stays, and the next step averages at the same averager step.
    let sgd = create("SGD", &replicas, vec![vec![0, 1, 2]], json!({"lr": 0.1})).unwrap();
    let averager =
        PeriodicModelAverager::with_group(2, 0, world.clone(), Subgroups::world(2)).unwrap();
    let mut post = PostLocalSgdOptimizer::new(sgd, Box::new(averager));
    world.set_failing(true);
    let error = post.step(&mut replicas).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::RuntimeError, "{error}");
    assert_ne!(params(&replicas), before, "the local step was applied");
    assert_eq!(post.averager().step(), 0);
    world.set_failing(false);
    assert_eq!(post.step(&mut replicas).unwrap(), Some(2));
    assert_eq!(post.averager().step(), 1);
    let p = params(&replicas);
    assert_eq!(p[0..3], p[3..6], "the ranks agree after the averaging step");
}

/// Every constructor of a local optimizer refuses an empty parameter list with PyTorch's
/// `ValueError`, after its option checks (PyTorch's `SGD(lr=-1)` reports the learning rate
/// first): `Sgd::new`, `Adam::new` and `Adam::adamw` over replicas without parameters, and
/// `optim::create` / `optim::build` of every class without groups.
#[test]
fn every_optimizer_constructor_refuses_an_empty_parameter_list() {
    let empty = Replicas::replicate(Arc::new(CpuBackend::new()), 2, &[]).unwrap();
    let message = "optimizer got an empty parameter list";
    assert_error(
        Sgd::new(&empty, SgdOptions::default()),
        ErrorKind::ValueError,
        message,
    );
    assert_error(
        Adam::new(&empty, AdamOptions::default()),
        ErrorKind::ValueError,
        message,
    );
    assert_error(
        Adam::adamw(&empty, AdamWOptions::default()),
        ErrorKind::ValueError,
        message,
    );
    assert_error(
        Sgd::new(&empty, SgdOptions::default().with_lr(-1.0)),
        ErrorKind::ValueError,
        "Invalid learning rate: -1.0",
    );
    for kind in [
        OptimizerKind::Sgd,
        OptimizerKind::Adam,
        OptimizerKind::AdamW,
    ] {
        for replicas in [&empty, &model(2)] {
            assert_error(
                optim::build(kind, replicas, vec![], &Default::default()),
                ErrorKind::ValueError,
                message,
            );
            assert_error(
                create(kind.name(), replicas, vec![], json!({})),
                ErrorKind::ValueError,
                message,
            );
        }
    }
}
