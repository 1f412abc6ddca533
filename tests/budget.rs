//! The memory budget (`distopt::budget`) seen from the library's entry points: allocations
//! that depend on input are refused with a `RuntimeError` naming the request and the budget,
//! live arenas count until they are dropped, and everything stays usable afterwards.
//!
//! The limit is process-wide, so this file is one test (its own process, run alone).

use std::sync::Arc;

use distopt::BlockOn;
use distopt::replicas::Replicas;
use distopt::{Backend, CpuBackend, DType, ErrorKind, StorageFormat, Tensor, budget};

#[test]
fn the_budget_refuses_what_does_not_fit_and_releases_what_is_dropped() {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    budget::set_limit(9 << 20);
    assert_eq!(budget::limit(), 9 << 20);
    let idle = budget::in_use();

    // Replicas hold two arenas (parameters and gradients). One rank of 2^18 float32 holds
    // 2 MiB; two ranks of 2^19 want 2 × 4 MiB, which no longer fit a 9 MiB budget beside it.
    let small = Tensor::from_f32(&[1 << 18], vec![0.5; 1 << 18]).unwrap();
    let held = Replicas::replicate(backend.clone(), 1, std::slice::from_ref(&small)).unwrap();
    assert_eq!(budget::in_use(), idle + (2 << 20), "the live arenas count");

    let big = Tensor::from_f32(&[1 << 19], vec![1.0; 1 << 19]).unwrap();
    let Err(err) = Replicas::replicate(backend.clone(), 2, std::slice::from_ref(&big)) else {
        panic!("replicas over the budget were made");
    };
    assert_eq!(err.kind(), ErrorKind::RuntimeError, "{err}");
    let message = err.message();
    assert!(
        message.contains("a host arena of 2 ranks × 524288 float32 elements"),
        "{message}"
    );
    assert!(message.contains("bytes (4.00 MiB) requested"), "{message}");
    assert!(
        message.contains("6.00 MiB of the 9.00 MiB memory budget in use"),
        "{message}"
    );
    assert!(message.contains("DISTOPT_MEMORY_BUDGET"), "{message}");
    assert_eq!(
        budget::in_use(),
        idle + (2 << 20),
        "refused replicas hold nothing"
    );

    // Dropping the live arenas releases their bytes. The same replicas, with the 2 MiB their
    // packing needs on top, fit 11 MiB only when `held` is gone (2 + 8 + 2 > 11).
    drop(held);
    assert_eq!(budget::in_use(), idle);
    budget::set_limit(11 << 20);
    let fits = Replicas::replicate(backend.clone(), 2, std::slice::from_ref(&big)).unwrap();
    assert_eq!(
        fits.param(1, 0).block_on().unwrap().values_f64().unwrap()[..3],
        [1.0, 1.0, 1.0]
    );
    drop(fits);

    // A raw arena far beyond memory is an error, not an abort, and so is a product that
    // overflows the address space.
    budget::set_limit(usize::MAX);
    let Err(err) = backend.create_arena(StorageFormat::F32, 1 << 20, 1 << 40, 1 << 40) else {
        panic!("an arena of 2^62 bytes was made");
    };
    assert_eq!(err.kind(), ErrorKind::RuntimeError, "{err}");
    assert!(
        err.message().contains("a host arena of 1048576 ranks"),
        "{err}"
    );
    assert!(
        backend
            .create_arena(StorageFormat::F32, usize::MAX / 2, 1 << 20, 1 << 20)
            .is_err()
    );
    budget::set_limit(1 << 20);

    // Converting values to a tensor asks the budget too.
    let Err(err) = Tensor::from_f64(DType::Float64, &[1 << 18], &vec![0.0; 1 << 18]) else {
        panic!("a tensor over the budget was made");
    };
    assert_eq!(err.kind(), ErrorKind::RuntimeError, "{err}");
    assert!(
        err.message().contains("a float64 tensor of shape [262144]"),
        "{err}"
    );

    // The step's outputs: the mean and the (shared) updated value of 2^17 float32 elements
    // need 1 MiB.
    budget::set_limit(768 << 10);
    let p = Tensor::from_f32(&[1 << 17], vec![1.0; 1 << 17]).unwrap();
    let g = Some(Tensor::from_f32(&[1 << 17], vec![2.0; 1 << 17]).unwrap());
    let params = vec![vec![p.clone()], vec![p.clone()]];
    let grads = vec![vec![g.clone()], vec![g.clone()]];
    let Err(err) = distopt::sgd_step(backend.as_ref(), &params, &grads, 0.5).block_on() else {
        panic!("a step over the budget ran");
    };
    assert_eq!(err.kind(), ErrorKind::RuntimeError, "{err}");
    assert!(err.message().contains("memory budget"), "{err}");

    // The environment sets the default (an invalid value is ignored).
    // SAFETY: this test binary runs one test, on this thread; nothing else reads the
    // environment meanwhile.
    unsafe { std::env::set_var(budget::ENV_VAR, "3MiB") };
    assert_eq!(budget::default_limit(), 3 << 20);
    budget::reset_limit();
    assert_eq!(budget::limit(), 3 << 20);
    unsafe { std::env::set_var(budget::ENV_VAR, "plenty") };
    assert!(budget::default_limit() > 1 << 28);
    unsafe { std::env::remove_var(budget::ENV_VAR) };

    // The default returns, and with it everything works again.
    budget::reset_limit();
    assert!(budget::limit() > 1 << 28, "{}", budget::limit());
    let out = distopt::sgd_step(backend.as_ref(), &params, &grads, 0.5)
        .block_on()
        .unwrap();
    assert_eq!(out.updated_replicas[1][0].values_f64().unwrap()[0], 0.0);
    assert_eq!(budget::in_use(), idle);
}
