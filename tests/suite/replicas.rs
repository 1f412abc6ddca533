//! `Replicas`' public API over several storage formats: its format buckets, where each
//! parameter lives, the masked all-reduce and the copies between replicas; and an algorithm
//! that uses some of a model's parameters finding them in their own bucket, whatever other
//! dtypes the model holds. Every test runs on the CPU backend and on the GPU backend.

use crate::common;

use std::sync::Arc;

use distopt::BlockOn;
use distopt::comm::{SimulatedWorld, Subgroups};
use distopt::optim::{self, OptimizerKind};
use distopt::replicas::{Replicas, Values};
use distopt::zero::{ZeroOptions, ZeroRedundancyOptimizer};
use distopt::{Backend, CpuBackend, DType, StorageFormat, Tensor};

use serde_json::json;

/// Two ranks of a model whose first parameter is float32 (frozen here) and whose other two
/// are float64; every rank has its own gradients.
fn mixed(backend: Arc<dyn Backend>) -> Replicas {
    let params = [
        Tensor::from_f32(&[2], vec![10.0, 20.0]).unwrap(),
        Tensor::from_f64(DType::Float64, &[3], &[1.0, 2.0, 3.0]).unwrap(),
        Tensor::from_f64(DType::Float64, &[2], &[4.0, 5.0]).unwrap(),
    ];
    let mut m = Replicas::replicate(backend, 2, &params).unwrap();
    for rank in 0..2 {
        let s = rank as f64 + 1.0;
        let grads = vec![
            None,
            Some(Tensor::from_f64(DType::Float64, &[3], &[s, 2.0 * s, -s]).unwrap()),
            Some(Tensor::from_f64(DType::Float64, &[2], &[0.5 * s, 4.0]).unwrap()),
        ];
        m.set_grads(rank, &grads).unwrap();
    }
    m
}

fn values(m: &Replicas) -> Vec<Vec<Vec<f64>>> {
    m.all_params()
        .block_on()
        .unwrap()
        .into_iter()
        .map(|rank| rank.iter().map(|t| t.values_f64().unwrap()).collect())
        .collect()
}

#[test]
fn zero_over_the_float64_parameters_of_a_model_that_also_holds_float32() {
    for backend in common::backends() {
        zero_over_float64(backend);
    }
}

fn zero_over_float64(backend: Arc<dyn Backend>) {
    let lr = optim::option_map(&json!({"lr": 0.5})).unwrap();

    // The reference: every rank steps its own replica of parameters 1 and 2 with plain SGD.
    let mut want = mixed(backend.clone());
    let mut sgd = optim::build(
        OptimizerKind::Sgd,
        &want,
        vec![(vec![1, 2], Default::default())],
        &lr,
    )
    .unwrap();
    sgd.step(&mut want).unwrap();

    let mut got = mixed(backend.clone());
    let world = Arc::new(SimulatedWorld::new(2).unwrap());
    let mut zero = ZeroRedundancyOptimizer::new(
        world,
        &got,
        vec![(vec![1, 2], Default::default())],
        "SGD",
        &lr,
        ZeroOptions::default(),
    )
    .unwrap();
    zero.step(&mut got).unwrap();

    let got = values(&got);
    // ZeRO gives every rank the owner's update: rank r's parameter j is the owner's.
    assert_eq!(got[0], got[1], "the ranks agree after ZeRO's broadcast");
    assert_eq!(
        got[0][0],
        vec![10.0, 20.0],
        "the float32 parameter is untouched"
    );
    let want = values(&want);
    let owner_of = |j: usize| {
        (0..2)
            .find(|&r| got[0][j] == want[r][j])
            .unwrap_or_else(|| {
                panic!(
                    "parameter {j}: {:?} is no rank's SGD step {want:?}",
                    got[0][j]
                )
            })
    };
    assert_ne!(owner_of(1), owner_of(2), "two parameters, two owners");
}

#[test]
fn buckets_and_places_describe_the_layout() {
    for backend in common::backends() {
        let m = mixed(backend);
        let formats: Vec<StorageFormat> = m.buckets().iter().map(|b| b.format()).collect();
        assert_eq!(formats, vec![StorageFormat::F32, StorageFormat::F64]);
        assert_eq!(m.buckets()[0].members(), &[0]);
        assert_eq!(m.buckets()[1].members(), &[1, 2]);
        let (p1, p2) = (m.place(1), m.place(2));
        assert_eq!((p1.bucket, p1.offset, p1.numel), (1, 0, 3));
        assert_eq!((p2.bucket, p2.numel), (1, 2));
        assert!(
            p2.offset >= 3,
            "parameter 2 starts after parameter 1: {p2:?}"
        );
        for bucket in m.buckets() {
            assert_eq!(bucket.arena(Values::Params).ranks(), 2);
            assert!(bucket.rank_len() >= bucket.members().iter().map(|&j| m.numel(j)).sum());
        }
    }
}

#[test]
fn the_masked_all_reduce_averages_only_the_selected_parameters() {
    for backend in common::backends() {
        let mut m = mixed(backend);
        let world = SimulatedWorld::new(2).unwrap();
        // Rank 1's parameter 2 differs; parameter 1 is not selected although it differs too.
        m.set_param(
            1,
            2,
            &Tensor::from_f64(DType::Float64, &[2], &[8.0, 1.0]).unwrap(),
        )
        .unwrap();
        m.set_param(
            1,
            1,
            &Tensor::from_f64(DType::Float64, &[3], &[0.0, 0.0, 0.0]).unwrap(),
        )
        .unwrap();
        m.set_param(0, 0, &Tensor::from_f32(&[2], vec![2.0, 4.0]).unwrap())
            .unwrap();
        m.all_reduce_mean(
            &world,
            Values::Params,
            Subgroups::world(2),
            &[true, false, true],
            None,
        )
        .unwrap();
        let v = values(&m);
        assert_eq!(v[0][2], vec![6.0, 3.0]);
        assert_eq!(v[1][2], vec![6.0, 3.0]);
        assert_eq!(
            v[0][1],
            vec![1.0, 2.0, 3.0],
            "not selected: rank 0 keeps its own"
        );
        assert_eq!(
            v[1][1],
            vec![0.0, 0.0, 0.0],
            "not selected: rank 1 keeps its own"
        );
        assert_eq!(v[0][0], vec![6.0, 12.0]);
        assert_eq!(v[1][0], vec![6.0, 12.0]);
        let bad = m.all_reduce_mean(&world, Values::Params, Subgroups::world(2), &[true], None);
        assert!(
            bad.unwrap_err()
                .to_string()
                .contains("a selection of 1 parameters")
        );
    }
}

#[test]
fn copies_between_replicas_move_one_rank_s_values_and_check_dtypes() {
    for backend in common::backends() {
        let src = mixed(backend.clone());
        let mut dst = Replicas::replicate(
            backend,
            1,
            &[
                Tensor::from_f64(DType::Float64, &[2], &[0.0, 0.0]).unwrap(),
                Tensor::from_f64(DType::Float64, &[3], &[0.0, 0.0, 0.0]).unwrap(),
            ],
        )
        .unwrap();
        src.copy_to(Values::Params, 1, &mut dst, 0, &[(2, 0), (1, 1)])
            .unwrap();
        src.copy_to(Values::Grads, 1, &mut dst, 0, &[(2, 0)])
            .unwrap();
        let params = dst.all_params().block_on().unwrap();
        assert_eq!(params[0][0].values_f64().unwrap(), vec![4.0, 5.0]);
        assert_eq!(params[0][1].values_f64().unwrap(), vec![1.0, 2.0, 3.0]);
        dst.set_grad(0, 0, Some(&dst.param(0, 0).block_on().unwrap()))
            .block_on()
            .unwrap();
        src.copy_to(Values::Grads, 1, &mut dst, 0, &[(2, 0)])
            .unwrap();
        assert_eq!(
            pollster::block_on(dst.grad(0, 0))
                .unwrap()
                .unwrap()
                .values_f64()
                .unwrap(),
            vec![1.0, 4.0],
            "rank 1's gradient of parameter 2"
        );
        let before = dst.all_params().block_on().unwrap()[0][0]
            .values_f64()
            .unwrap();
        let err = src
            .copy_to(Values::Params, 0, &mut dst, 0, &[(0, 0)])
            .unwrap_err();
        assert!(err.to_string().contains("cannot copy parameter 0"), "{err}");
        assert_eq!(
            dst.all_params().block_on().unwrap()[0][0]
                .values_f64()
                .unwrap(),
            before
        );
    }
}

#[test]
fn float64_arenas_on_the_gpu_backend_step_and_copy_on_the_host() {
    // WebGPU has no 64-bit float: a GPU backend keeps float64 arenas on the host and must
    // accept them in every kernel, as the CPU backend does.
    let Some(gpu) = common::gpu_backend() else {
        return;
    };
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut results = Vec::new();
    for backend in [cpu, gpu] {
        let f = StorageFormat::F64;
        let mut params = backend.create_arena(f, 2, 64, 64).unwrap();
        let mut grads = backend.create_arena(f, 2, 64, 64).unwrap();
        let mut means = backend.create_arena(f, 1, 64, 64).unwrap();
        let mut words = vec![0u32; f.words_for(64)];
        for i in 0..64 {
            f.store_f64(&mut words, i, i as f64 * 0.25);
        }
        for rank in 0..2 {
            params.write(rank, 0, &words).unwrap();
            grads.write(rank, 0, &words).unwrap();
        }
        backend
            .dp_sgd_step(&mut params, &grads, &mut means, 0.5)
            .unwrap();
        let mut copy = backend.create_arena(f, 2, 64, 64).unwrap();
        backend.copy_arena(&params, &mut copy).unwrap();
        results.push(pollster::block_on(copy.read_all()).unwrap());
    }
    assert_eq!(
        results[0], results[1],
        "the GPU backend's float64 step equals the CPU's"
    );
    assert_ne!(results[0], vec![0u32; results[0].len()]);
}

/// One rule for a tensor of another dtype, PyTorch's (see `Replicas`): a value written into a
/// parameter is cast to the parameter's dtype (`param.copy_(value)`), a gradient of another
/// dtype is a `RuntimeError` (`param.grad = grad`, checked before the shape), and ranks that
/// disagree on a parameter's dtype are a `ValueError`, as ranks that disagree on its shape
/// are. A refused call writes nothing.
#[test]
fn a_dtype_mismatch_is_cast_into_a_parameter_and_refused_as_a_gradient() {
    use distopt::ErrorKind;
    for backend in common::backends() {
        let mut m = mixed(backend.clone());
        // float32 into a float64 parameter: exact; float64 into a float32 one: rounded to
        // nearest even, overflowing to inf (torch.tensor([0.1, 1e300]).float()).
        m.set_param(1, 2, &Tensor::from_f32(&[2], vec![0.1, -2.5]).unwrap())
            .unwrap();
        let p = m.param(1, 2).block_on().unwrap();
        assert_eq!(p.dtype(), DType::Float64);
        assert_eq!(p.values_f64().unwrap(), vec![f64::from(0.1f32), -2.5]);
        let wide = Tensor::from_f64(DType::Float64, &[2], &[0.1, 1e300]).unwrap();
        let p1 = m.param(0, 1).block_on().unwrap();
        let p2 = m.param(0, 2).block_on().unwrap();
        m.set_params(0, &[wide, p1, p2]).unwrap();
        let p = m.param(0, 0).block_on().unwrap();
        assert_eq!(p.dtype(), DType::Float32);
        assert_eq!(
            p.values_f64().unwrap(),
            vec![f64::from(0.1f32), f64::INFINITY]
        );

        // A float32 gradient for a float64 parameter: refused, nothing written.
        let grads_now = |m: &Replicas| -> Vec<Vec<Option<Vec<f64>>>> {
            m.all_grads()
                .block_on()
                .unwrap()
                .iter()
                .map(|rank| {
                    rank.iter()
                        .map(|g| g.as_ref().map(|g| g.values_f64().unwrap()))
                        .collect()
                })
                .collect()
        };
        let before = grads_now(&m);
        let narrow = Tensor::from_f32(&[3], vec![9.0; 3]).unwrap();
        let error = m.set_grad(0, 1, Some(&narrow)).block_on().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::RuntimeError, "{error}");
        assert_eq!(
            error.message(),
            "assigned grad has data of a different type: gradient 1 of rank 0 is float32, the parameter is float64"
        );
        // In a list: the first gradient is fine, the second is not; none is written.
        let good = Tensor::from_f64(DType::Float64, &[3], &[7.0; 3]).unwrap();
        let bad = Tensor::from_f32(&[2], vec![7.0; 2]).unwrap();
        let error = m
            .set_grads(0, &[None, Some(good.clone()), Some(bad)])
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::RuntimeError, "{error}");
        // The dtype is checked before the shape, as PyTorch's `.grad` setter does.
        let error = m
            .set_grad(0, 1, Some(&Tensor::from_f32(&[5], vec![1.0; 5]).unwrap()))
            .block_on()
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::RuntimeError, "{error}");
        // A shape that differs is a ValueError.
        let long = Tensor::from_f64(DType::Float64, &[4], &[1.0; 4]).unwrap();
        let error = m.set_grad(0, 1, Some(&long)).block_on().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ValueError, "{error}");
        assert_eq!(grads_now(&m), before, "nothing was written");
        m.set_grad(0, 1, Some(&good)).block_on().unwrap();

        // Ranks that disagree on a dtype: a ValueError, checked before the shape.
        let rank0 = vec![Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap()];
        let other = vec![Tensor::from_f64(DType::Float64, &[3], &[1.0, 2.0, 3.0]).unwrap()];
        let error = Replicas::new(backend.clone(), &[rank0.clone(), other]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ValueError, "{error}");
        assert_eq!(
            error.message(),
            "parameter 0 of rank 1 is float64, rank 0's is float32: every rank must hold the same dtypes"
        );
        let longer = vec![Tensor::from_f32(&[3], vec![1.0, 2.0, 3.0]).unwrap()];
        let error = Replicas::new(backend.clone(), &[rank0, longer]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ValueError, "{error}");
    }
}
