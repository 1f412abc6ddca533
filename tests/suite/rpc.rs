//! The RPC layer and DistributedOptimizer beyond the golden cases: concurrency of the owners'
//! steps, and every error a caller can run into.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use distopt::BlockOn;
use distopt::optim::OptionMap;
use distopt::rpc::{DistributedOptimizer, LocalOptimizerKind, RpcWorld};
use distopt::{CpuBackend, ErrorKind, Tensor};

fn world(workers: &[&str]) -> Arc<RpcWorld> {
    Arc::new(RpcWorld::new(workers, Arc::new(CpuBackend::new())).unwrap())
}

fn lr(value: f64) -> OptionMap {
    let mut options = OptionMap::new();
    options.insert("lr".into(), value.into());
    options
}

fn scalar(x: f32) -> Tensor {
    Tensor::from_f32(&[], vec![x]).unwrap()
}

#[test]
fn step_issues_every_owners_update_before_waiting_on_any() {
    let world = world(&["worker0", "worker1"]);
    let a = world.remote("worker0", scalar(1.0)).unwrap();
    let b = world.remote("worker1", scalar(1.0)).unwrap();
    let dopt = DistributedOptimizer::new(
        world.clone(),
        "SGD",
        &[a.clone(), b.clone()],
        &lr(1.0),
        LocalOptimizerKind::Functional,
    )
    .unwrap();
    let context = world.context();
    world
        .record_gradient(context.id(), &a, scalar(1.0))
        .now_or_wait()
        .unwrap();
    world
        .record_gradient(context.id(), &b, scalar(1.0))
        .now_or_wait()
        .unwrap();

    // Block worker0's queue until worker1's update has been observed: if `step` waited for
    // worker0 before issuing worker1's update, this would never finish.
    let (release, blocked) = mpsc::channel::<()>();
    let gate = world.rpc_async("worker0", move |_| {
        blocked
            .recv_timeout(Duration::from_secs(20))
            .map_err(|_| distopt::Error::runtime("never released"))
    });
    let id = context.id();
    let stepping = {
        let world = world.clone();
        std::thread::spawn(move || {
            let _keep = &world;
            dopt.step(id).block_on()
        })
    };
    let start = Instant::now();
    loop {
        let value = b
            .to_here(&world)
            .now_or_wait()
            .unwrap()
            .values_f64()
            .unwrap()[0];
        if value == 0.0 {
            break; // worker1 stepped while worker0 was still blocked
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "worker1 never stepped: the steps are serialized"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // worker0's queue is still blocked here (asking it anything would wait behind the gate).
    assert!(
        !stepping.is_finished(),
        "step returned before worker0 stepped"
    );
    release.send(()).unwrap();
    gate.now_or_wait().unwrap();
    stepping.join().unwrap().unwrap();
    assert_eq!(
        a.to_here(&world)
            .now_or_wait()
            .unwrap()
            .values_f64()
            .unwrap(),
        vec![0.0]
    );
}

#[test]
fn calls_to_unknown_or_stopped_workers_are_clear_errors() {
    let world = world(&["worker0"]);
    let err = world.rpc_sync("worker9", |_| Ok(())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RuntimeError);
    assert!(
        err.message().contains("Unknown destination worker worker9"),
        "{err}"
    );

    let r = world.remote("worker0", scalar(2.0)).unwrap();
    world.shutdown_worker("worker0").unwrap();
    let err = r.to_here(&world).now_or_wait().unwrap_err();
    assert!(err.message().contains("worker0 has shut down"), "{err}");
}

#[test]
fn a_failing_worker_reports_to_the_caller_and_keeps_serving() {
    let world = world(&["worker0"]);
    let err = world
        .rpc_sync::<()>("worker0", |_| panic!("boom"))
        .unwrap_err();
    assert!(err.message().contains("boom"), "{err}");
    let err = world
        .rpc_sync::<()>("worker0", |_| Err(distopt::Error::value("bad value")))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ValueError);
    assert_eq!(
        world
            .rpc_sync("worker0", |state| Ok(state.name().to_string()))
            .unwrap(),
        "worker0"
    );
}

#[test]
fn finished_or_unknown_contexts_are_rejected() {
    let world = world(&["worker0"]);
    let p = world.remote("worker0", scalar(1.0)).unwrap();
    let dopt = DistributedOptimizer::new(
        world.clone(),
        "SGD",
        std::slice::from_ref(&p),
        &lr(0.1),
        LocalOptimizerKind::Functional,
    )
    .unwrap();
    let finished = {
        let context = world.context();
        context.id()
    };
    let err = dopt.step(finished).block_on().unwrap_err();
    assert!(
        err.message()
            .contains("Could not find autograd context with id"),
        "{err}"
    );
    let err = world
        .record_gradient(finished, &p, scalar(1.0))
        .now_or_wait()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RuntimeError);
    assert!(world.get_gradients(12345, "worker0").now_or_wait().is_err());
}

#[test]
fn gradients_accumulate_within_a_context_and_not_across_contexts() {
    let world = world(&["worker0"]);
    let p = world
        .remote("worker0", Tensor::from_f32(&[2], vec![0.0, 0.0]).unwrap())
        .unwrap();
    let g = || Tensor::from_f32(&[2], vec![1.5, -2.0]).unwrap();
    {
        let context = world.context();
        world
            .record_gradient(context.id(), &p, g())
            .now_or_wait()
            .unwrap();
        world
            .record_gradient(context.id(), &p, g())
            .now_or_wait()
            .unwrap();
        let grads = world
            .get_gradients(context.id(), "worker0")
            .now_or_wait()
            .unwrap();
        assert_eq!(grads[&p.id()].values_f64().unwrap(), vec![3.0, -4.0]);
    }
    let context = world.context();
    assert!(
        world
            .get_gradients(context.id(), "worker0")
            .now_or_wait()
            .unwrap()
            .is_empty()
    );
    // A gradient of the wrong shape is a clear error.
    let err = world
        .record_gradient(context.id(), &p, scalar(1.0))
        .now_or_wait()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ValueError);
}

#[test]
fn a_worker_error_during_step_is_raised_by_step() {
    let world = world(&["worker0", "worker1"]);
    let a = world.remote("worker0", scalar(1.0)).unwrap();
    let b = world.remote("worker1", scalar(1.0)).unwrap();
    let dopt = DistributedOptimizer::new(
        world.clone(),
        "Adam",
        &[a, b],
        &lr(0.1),
        LocalOptimizerKind::TorchOptim,
    )
    .unwrap();
    let context = world.context();
    world.shutdown_worker("worker1").unwrap();
    let err = dopt.step(context.id()).block_on().unwrap_err();
    assert!(err.message().contains("worker1 has shut down"), "{err}");
    assert!(
        DistributedOptimizer::new(
            world.clone(),
            "Lion",
            &[],
            &lr(0.1),
            LocalOptimizerKind::Functional
        )
        .is_err()
    );
}

#[test]
fn two_distributed_optimizers_on_one_owner_step_their_own_parameters() {
    let world = world(&["worker0"]);
    let a = world.remote("worker0", scalar(1.0)).unwrap();
    let b = world.remote("worker0", scalar(1.0)).unwrap();
    let kind = LocalOptimizerKind::Functional;
    let first = DistributedOptimizer::new(
        world.clone(),
        "SGD",
        std::slice::from_ref(&a),
        &lr(1.0),
        kind,
    )
    .unwrap();
    let second = DistributedOptimizer::new(
        world.clone(),
        "SGD",
        std::slice::from_ref(&b),
        &lr(0.5),
        kind,
    )
    .unwrap();
    let context = world.context();
    for p in [&a, &b] {
        world
            .record_gradient(context.id(), p, scalar(1.0))
            .now_or_wait()
            .unwrap();
    }
    second.step(context.id()).block_on().unwrap();
    let value = |p: &distopt::rpc::RRef| {
        p.to_here(&world)
            .now_or_wait()
            .unwrap()
            .values_f64()
            .unwrap()
    };
    assert_eq!(
        value(&a),
        vec![1.0],
        "the first optimizer's parameter is untouched"
    );
    assert_eq!(
        value(&b),
        vec![0.5],
        "the second stepped its own, with its own lr"
    );
    first.step(context.id()).block_on().unwrap();
    assert_eq!(value(&a), vec![0.0]);
    assert_eq!(value(&b), vec![0.5]);
}
