//! The typed step API and its JSON front end: bad input is always a typed `Error` (a kind and
//! a message that names the rank, the parameter and the shapes), never a panic; unusual but
//! valid input (NaN learning rates, non-finite values) is computed, not rejected; inputs are
//! never modified; and the seed's worked examples give their documented results on every
//! backend.

use crate::common;

use distopt::BlockOn;
use distopt::json::{number_to_json, tensor_from_json, tensor_to_json};
use distopt::step::{step_output_to_json, step_request_from_json};
use distopt::{
    Backend, CpuBackend, DType, Error, ErrorKind, HostData, StepOutput, Tensor, sgd_step, to_device,
};
use half::{bf16, f16};
use serde_json::{Value, json};

fn f32s(shape: &[usize], values: &[f32]) -> Tensor {
    Tensor::from_f32(shape, values.to_vec()).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().block_on().unwrap().values_f64().unwrap()
}

/// The step's error on every backend; all backends must report the same error.
fn step_error(params: &[Vec<Tensor>], grads: &[Vec<Option<Tensor>>], learning_rate: f64) -> Error {
    let mut first: Option<Error> = None;
    for (name, backend) in common::named_backends() {
        let err = match sgd_step(backend.as_ref(), params, grads, learning_rate).block_on() {
            Ok(_) => panic!("{name}: expected an error, the step succeeded"),
            Err(err) => err,
        };
        if let Some(first) = &first {
            assert_eq!(&err, first, "{name} reports another error than cpu");
        }
        first.get_or_insert(err);
    }
    first.unwrap()
}

fn assert_value_error(err: &Error, needles: &[&str]) {
    assert_eq!(err.kind(), ErrorKind::ValueError, "{err}");
    for needle in needles {
        assert!(
            err.message().contains(needle),
            "message {:?} lacks {needle:?}",
            err.message()
        );
    }
    // Display is "ValueError: message", as Python prints an exception.
    assert_eq!(err.to_string(), format!("ValueError: {}", err.message()));
}

fn ones(shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    f32s(shape, &vec![1.0; n])
}

// ---------------------------------------------------------------------------------------------
// Typed API errors.

#[test]
fn no_replicas() {
    let err = step_error(&[], &[], 0.1);
    assert_value_error(&err, &["no replicas"]);
}

#[test]
fn gradient_replica_count_mismatch() {
    let params = vec![vec![ones(&[2])], vec![ones(&[2])]];
    let grads = vec![vec![Some(ones(&[2]))]];
    let err = step_error(&params, &grads, 0.1);
    assert_value_error(&err, &["gradient replica count mismatch", "1", "2"]);
}

#[test]
fn parameter_count_mismatch_names_the_rank() {
    let params = vec![
        vec![ones(&[2]), ones(&[3])],
        vec![ones(&[2]), ones(&[3])],
        vec![ones(&[2])],
    ];
    let grads = vec![vec![None, None], vec![None, None], vec![None, None]];
    let err = step_error(&params, &grads, 0.1);
    assert_value_error(&err, &["parameter count mismatch", "rank 2"]);
}

#[test]
fn gradient_count_mismatch_names_the_rank() {
    let params = vec![vec![ones(&[2]), ones(&[3])]; 3];
    let grads = vec![vec![None, None], vec![Some(ones(&[2]))], vec![None, None]];
    let err = step_error(&params, &grads, 0.1);
    assert_value_error(&err, &["gradient count mismatch", "rank 1"]);
}

#[test]
fn parameter_count_is_checked_before_gradient_count() {
    // The README's example: rank 1 has one parameter and one gradient, rank 0 two of each.
    let params = vec![vec![ones(&[2]), ones(&[2])], vec![ones(&[2])]];
    let grads = vec![vec![None, None], vec![None]];
    let err = step_error(&params, &grads, 0.1);
    assert_value_error(&err, &["parameter count mismatch", "rank 1"]);
}

/// Another rank's replica of another dtype: the reference reads rank 0's copy only (`p0j`, its
/// values and its dtype), so the step is computed from rank 0's and every rank's output has rank
/// 0's dtype, through the typed API and JSON alike (a shape that differs is still an error).
#[test]
fn another_ranks_replica_dtype_is_not_read() {
    let wide = Tensor::from_f64(DType::Float64, &[2], &[7.0, 9.0]).unwrap();
    let params = vec![vec![f32s(&[2], &[1.0, 2.0])], vec![wide]];
    let grads = vec![vec![Some(f32s(&[2], &[2.0, 4.0]))], vec![None]];
    for (name, backend) in common::named_backends() {
        let out = sgd_step(backend.as_ref(), &params, &grads, 0.5)
            .block_on()
            .unwrap();
        assert_eq!(values(&out.mean_gradients[0]), [1.0, 2.0], "{name}");
        for rank in &out.updated_replicas {
            assert_eq!(rank[0].dtype(), DType::Float32, "{name}");
            assert_eq!(values(&rank[0]), [0.5, 1.0], "{name}");
        }
    }
    let json = serde_json::json!({
        "parameter_replicas": [
            [{"dtype": "float16", "shape": [1], "data": [1.0]}],
            [{"dtype": "bfloat16", "shape": [1], "data": [3.0]}],
        ],
        "gradient_replicas": [[null], [null]],
        "learning_rate": 0.1,
    });
    let request = step_request_from_json(&json).unwrap();
    let out = sgd_step(
        &CpuBackend::new(),
        &request.parameter_replicas,
        &request.gradient_replicas,
        request.learning_rate,
    )
    .block_on()
    .unwrap();
    assert_eq!(out.updated_replicas[1][0].dtype(), DType::Float16);
    assert_eq!(values(&out.updated_replicas[1][0]), [1.0]);
}

#[test]
fn parameter_shape_mismatch_names_rank_parameter_and_both_shapes() {
    let params = vec![
        vec![ones(&[4]), ones(&[2, 3])],
        vec![ones(&[4]), ones(&[2, 3])],
        vec![ones(&[4]), ones(&[3, 2])],
    ];
    let grads = vec![vec![None, None]; 3];
    let err = step_error(&params, &grads, 0.1);
    assert_value_error(
        &err,
        &[
            "parameter shape mismatch",
            "parameter 1",
            "rank 2",
            "[3, 2]",
            "[2, 3]",
        ],
    );
}

#[test]
fn gradient_shape_mismatch_names_rank_parameter_and_both_shapes() {
    // The same element count is still a mismatch.
    let params = vec![vec![ones(&[4]), ones(&[2, 3])]; 2];
    let grads = vec![
        vec![Some(ones(&[4])), Some(ones(&[2, 3]))],
        vec![Some(ones(&[4])), Some(ones(&[6]))],
    ];
    let err = step_error(&params, &grads, 0.1);
    assert_value_error(
        &err,
        &[
            "gradient shape mismatch",
            "gradient 1",
            "rank 1",
            "[6]",
            "[2, 3]",
        ],
    );
    // A scalar against a one-element vector.
    let params = vec![vec![ones(&[])]];
    let grads = vec![vec![Some(ones(&[1]))]];
    let err = step_error(&params, &grads, 0.1);
    assert_value_error(&err, &["gradient shape mismatch", "[1]", "[]"]);
}

#[test]
fn shape_checks_run_parameter_by_parameter_then_rank_by_rank() {
    // Parameter 0 of rank 2 has the wrong shape, and so has gradient 1 of rank 1: parameter 0
    // is checked (on every rank) first.
    let params = vec![
        vec![ones(&[2]), ones(&[3])],
        vec![ones(&[2]), ones(&[3])],
        vec![ones(&[5]), ones(&[3])],
    ];
    let grads = vec![
        vec![None, None],
        vec![None, Some(ones(&[4]))],
        vec![None, None],
    ];
    let err = step_error(&params, &grads, 0.1);
    assert_value_error(&err, &["parameter shape mismatch", "parameter 0", "rank 2"]);
    // Within one parameter, rank 1's gradient comes before rank 2's parameter.
    let params = vec![vec![ones(&[2])], vec![ones(&[2])], vec![ones(&[5])]];
    let grads = vec![vec![None], vec![Some(ones(&[3]))], vec![None]];
    let err = step_error(&params, &grads, 0.1);
    assert_value_error(&err, &["gradient shape mismatch", "gradient 0", "rank 1"]);
}

#[test]
fn tensor_constructors_reject_bad_data_without_panicking() {
    let err = Tensor::from_f32(&[2, 2], vec![1.0; 3]).unwrap_err();
    assert_value_error(&err, &["3", "[2, 2]"]);
    let err = Tensor::new(&[], HostData::Float16(vec![])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ValueError);
    let err = Tensor::new(&[0], HostData::BFloat16(vec![bf16::ONE])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ValueError);
    let err = Tensor::from_f64(DType::Float64, &[usize::MAX, 2], &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ValueError);
    // A scalar and empty tensors are fine.
    assert_eq!(Tensor::from_f32(&[], vec![5.0]).unwrap().numel(), 1);
    assert_eq!(Tensor::from_f32(&[3, 0], vec![]).unwrap().numel(), 0);
}

#[test]
fn reading_values_of_a_device_tensor_is_a_runtime_error() {
    for (name, backend) in common::named_backends() {
        let t = pollster::block_on(to_device(backend.as_ref(), &[ones(&[3])])).unwrap();
        let err = t[0].values_f64().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::RuntimeError, "{name}: {err}");
        assert_eq!(values(&t[0]), [1.0; 3], "{name}");
    }
}

#[test]
fn tensors_resident_on_another_backend_are_an_error_or_read_correctly() {
    // A device tensor of one backend passed to another backend's step: never a panic, and
    // never wrong values.
    let all = common::named_backends();
    for (from_name, from) in &all {
        for (to_name, to) in &all {
            if from_name == to_name {
                continue;
            }
            let p = pollster::block_on(to_device(from.as_ref(), &[f32s(&[2], &[1.0, 2.0])]))
                .unwrap()
                .remove(0);
            let grads = vec![vec![Some(f32s(&[2], &[2.0, 4.0]))]];
            match sgd_step(to.as_ref(), &[vec![p]], &grads, 0.5).block_on() {
                Ok(out) => assert_eq!(values(&out.updated_replicas[0][0]), [0.0, 0.0]),
                Err(err) => {
                    assert_eq!(
                        err.kind(),
                        ErrorKind::RuntimeError,
                        "{from_name} -> {to_name}"
                    )
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Valid but unusual input.

#[test]
fn non_finite_learning_rates_are_computed_not_rejected() {
    for (name, backend) in common::named_backends() {
        let params = vec![vec![f32s(&[3], &[1.0, 2.0, 3.0])]; 2];
        let grads = vec![
            vec![Some(f32s(&[3], &[2.0, 0.0, -4.0]))],
            vec![Some(f32s(&[3], &[4.0, 0.0, -2.0]))],
        ];
        let out = sgd_step(backend.as_ref(), &params, &grads, f64::NAN)
            .block_on()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(values(&out.mean_gradients[0]), [3.0, 0.0, -3.0], "{name}");
        for replica in &out.updated_replicas {
            assert!(values(&replica[0]).iter().all(|v| v.is_nan()), "{name}");
        }
        let out = sgd_step(backend.as_ref(), &params, &grads, f64::INFINITY)
            .block_on()
            .unwrap();
        let updated = values(&out.updated_replicas[1][0]);
        assert_eq!(updated[0], f64::NEG_INFINITY, "{name}");
        assert!(updated[1].is_nan(), "{name}: inf * 0 is NaN");
        assert_eq!(updated[2], f64::INFINITY, "{name}");
        // A learning rate beyond float32's range rounds to infinity first.
        let out = sgd_step(backend.as_ref(), &params, &grads, -1e39)
            .block_on()
            .unwrap();
        assert_eq!(
            values(&out.updated_replicas[0][0])[0],
            f64::INFINITY,
            "{name}"
        );
    }
}

#[test]
fn all_gradients_missing_gives_zero_means() {
    for (name, backend) in common::named_backends() {
        let params = vec![vec![f32s(&[2], &[1.0, -2.0]), ones(&[])]; 3];
        let grads = vec![
            vec![None, Some(f32s(&[], &[3.0]))],
            vec![None, None],
            vec![None, None],
        ];
        let out = sgd_step(backend.as_ref(), &params, &grads, 0.5)
            .block_on()
            .unwrap();
        let mean = values(&out.mean_gradients[0]);
        assert_eq!(mean, [0.0, 0.0], "{name}");
        assert!(mean.iter().all(|v| v.is_sign_positive()), "{name}: +0.0");
        assert_eq!(values(&out.updated_replicas[2][0]), [1.0, -2.0], "{name}");
        // The missing gradients still count: 3 / 3 ranks.
        assert_eq!(values(&out.mean_gradients[1]), [1.0], "{name}");
        assert_eq!(values(&out.updated_replicas[0][1]), [0.5], "{name}");
    }
}

#[test]
fn outputs_keep_shape_dtype_and_are_one_copy_per_rank() {
    for (name, backend) in common::named_backends() {
        let params = vec![
            vec![
                Tensor::from_f64(DType::Float16, &[2, 1], &[1.0, 2.0]).unwrap(),
                Tensor::from_f64(DType::BFloat16, &[], &[4.0]).unwrap(),
                Tensor::from_f64(DType::Float64, &[1, 0, 2], &[]).unwrap(),
            ];
            4
        ];
        let grads = vec![
            vec![
                Some(Tensor::from_f64(DType::Float64, &[2, 1], &[2.0, 2.0]).unwrap()),
                None,
                None,
            ];
            4
        ];
        let out = sgd_step(backend.as_ref(), &params, &grads, 1.0)
            .block_on()
            .unwrap();
        assert_eq!(out.updated_replicas.len(), 4, "{name}");
        for replicas in std::iter::once(&out.mean_gradients).chain(&out.updated_replicas) {
            assert_eq!(replicas.len(), 3);
            for (t, p) in replicas.iter().zip(&params[0]) {
                assert_eq!(t.dtype(), p.dtype(), "{name}");
                assert_eq!(t.shape(), p.shape(), "{name}");
            }
        }
        assert_eq!(values(&out.updated_replicas[3][0]), [-1.0, 0.0], "{name}");
        assert_eq!(values(&out.updated_replicas[3][1]), [4.0], "{name}");
    }
}

fn bit_image(t: &Tensor) -> (DType, Vec<usize>, Vec<u64>) {
    let host = t.to_host().block_on().unwrap();
    let data = host.host_data().unwrap();
    let bits = (0..data.len())
        .map(|i| match data {
            HostData::Float32(v) => u64::from(v[i].to_bits()),
            HostData::Float16(v) => u64::from(v[i].to_bits()),
            HostData::BFloat16(v) => u64::from(v[i].to_bits()),
            HostData::Float64(v) => v[i].to_bits(),
        })
        .collect();
    (t.dtype(), t.shape().to_vec(), bits)
}

#[test]
fn inputs_are_not_modified() {
    for (name, backend) in common::named_backends() {
        let p = vec![
            Tensor::from_f64(DType::Float32, &[3], &[1.0, -0.0, f64::NAN]).unwrap(),
            Tensor::from_f64(DType::Float16, &[2, 2], &[1.5, 2.5, -3.0, 65504.0]).unwrap(),
            Tensor::from_f64(DType::Float64, &[1], &[0.1]).unwrap(),
        ];
        let params = vec![p.clone(), p.clone(), p];
        let grads = vec![
            vec![
                Some(Tensor::from_f64(DType::BFloat16, &[3], &[1.0, 2.0, 3.0]).unwrap()),
                Some(Tensor::from_f64(DType::Float16, &[2, 2], &[65504.0; 4]).unwrap()),
                None,
            ],
            vec![
                None,
                Some(Tensor::from_f64(DType::Float32, &[2, 2], &[1e-8; 4]).unwrap()),
                Some(Tensor::from_f64(DType::Float64, &[1], &[1e300]).unwrap()),
            ],
            vec![
                Some(Tensor::from_f64(DType::Float32, &[3], &[f64::INFINITY; 3]).unwrap()),
                None,
                None,
            ],
        ];
        // Half of the inputs resident on the device.
        let device_grads: Vec<Tensor> =
            pollster::block_on(to_device(backend.as_ref(), &[grads[0][0].clone().unwrap()]))
                .unwrap();
        let mut grads = grads;
        grads[0][0] = Some(device_grads[0].clone());
        let before_params: Vec<Vec<_>> = params
            .iter()
            .map(|r| r.iter().map(bit_image).collect())
            .collect();
        let before_grads: Vec<Vec<_>> = grads
            .iter()
            .map(|r| r.iter().map(|g| g.as_ref().map(bit_image)).collect())
            .collect();
        for _ in 0..2 {
            sgd_step(backend.as_ref(), &params, &grads, 0.5)
                .block_on()
                .unwrap();
        }
        let after_params: Vec<Vec<_>> = params
            .iter()
            .map(|r| r.iter().map(bit_image).collect())
            .collect();
        let after_grads: Vec<Vec<_>> = grads
            .iter()
            .map(|r| r.iter().map(|g| g.as_ref().map(bit_image)).collect())
            .collect();
        assert_eq!(before_params, after_params, "{name}: parameters changed");
        assert_eq!(before_grads, after_grads, "{name}: gradients changed");
    }
}

// ---------------------------------------------------------------------------------------------
// The seed's worked examples, through the typed API and through JSON.

fn check_example(out: &StepOutput, means: &[&[f64]], updated: &[&[f64]], ranks: usize) {
    assert_eq!(out.mean_gradients.len(), means.len());
    for (t, want) in out.mean_gradients.iter().zip(means) {
        assert_eq!(values(t), *want);
    }
    assert_eq!(out.updated_replicas.len(), ranks);
    for replicas in &out.updated_replicas {
        for (t, want) in replicas.iter().zip(updated) {
            assert_eq!(values(t), *want);
        }
    }
}

#[test]
fn seed_example_1() {
    for (name, backend) in common::named_backends() {
        let params = vec![vec![f32s(&[2], &[1.0, 2.0])]; 2];
        let grads = vec![
            vec![Some(f32s(&[2], &[2.0, 4.0]))],
            vec![Some(f32s(&[2], &[4.0, 6.0]))],
        ];
        let out = sgd_step(backend.as_ref(), &params, &grads, 0.1)
            .block_on()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // 0.7 as float32 is 0.699999988079071.
        check_example(&out, &[&[3.0, 5.0]], &[&[0.699999988079071, 1.5]], 2);
        assert_eq!(out.updated_replicas[0][0].dtype(), DType::Float32);
    }
}

#[test]
fn seed_example_2() {
    for (name, backend) in common::named_backends() {
        let params = vec![vec![f32s(&[2], &[1.0, -1.0])]; 2];
        let grads = vec![
            vec![Some(f32s(&[2], &[2.0, 4.0]))],
            vec![Some(f32s(&[2], &[0.0, 0.0]))],
        ];
        let out = sgd_step(backend.as_ref(), &params, &grads, 0.5)
            .block_on()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        check_example(&out, &[&[1.0, 2.0]], &[&[0.5, -2.0]], 2);
    }
}

/// Three ranks, shapes (2,) and (2, 2), lr 0.25, means [1, 1] and [[2, 2], [2, 2]]; the
/// parameter and gradient values are chosen here.
fn example_3() -> (Vec<Vec<Tensor>>, Vec<Vec<Option<Tensor>>>) {
    let params = vec![
        vec![
            f32s(&[2], &[1.0, 2.0]),
            f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0])
        ];
        3
    ];
    let grads = vec![
        vec![
            Some(f32s(&[2], &[0.0, 1.0])),
            Some(f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0])),
        ],
        vec![
            Some(f32s(&[2], &[1.0, 1.0])),
            Some(f32s(&[2, 2], &[2.0, 2.0, 2.0, 2.0])),
        ],
        vec![
            Some(f32s(&[2], &[2.0, 1.0])),
            Some(f32s(&[2, 2], &[3.0, 2.0, 1.0, 0.0])),
        ],
    ];
    (params, grads)
}

#[test]
fn seed_example_3() {
    for (name, backend) in common::named_backends() {
        let (params, grads) = example_3();
        let out = sgd_step(backend.as_ref(), &params, &grads, 0.25)
            .block_on()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        check_example(
            &out,
            &[&[1.0, 1.0], &[2.0, 2.0, 2.0, 2.0]],
            &[&[0.75, 1.75], &[0.5, 1.5, 2.5, 3.5]],
            3,
        );
        assert_eq!(out.mean_gradients[1].shape(), [2, 2]);
        for replicas in &out.updated_replicas {
            assert_eq!(replicas[0].shape(), [2]);
            assert_eq!(replicas[1].shape(), [2, 2]);
        }
    }
}

fn json_step(backend: &dyn Backend, request: &Value) -> Result<Value, Error> {
    let request = step_request_from_json(request)?;
    let out = sgd_step(
        backend,
        &request.parameter_replicas,
        &request.gradient_replicas,
        request.learning_rate,
    )
    .block_on()?;
    pollster::block_on(step_output_to_json(&out))
}

fn tensor_json(dtype: &str, shape: &[usize], data: &[f64]) -> Value {
    json!({"dtype": dtype, "shape": shape, "data": data})
}

#[test]
fn seed_examples_through_json() {
    for (name, backend) in common::named_backends() {
        // Example 1 exactly as the seed writes it: nested lists.
        let out = json_step(
            backend.as_ref(),
            &json!({
                "parameter_replicas": [[[1, 2]], [[1, 2]]],
                "gradient_replicas": [[[2, 4]], [[4, 6]]],
                "learning_rate": 0.1
            }),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let f32_tensor = |shape: &[usize], data: &[f64]| tensor_json("float32", shape, data);
        assert_eq!(
            out,
            json!({
                "mean_gradients": [f32_tensor(&[2], &[3.0, 5.0])],
                "updated_replicas": [
                    [f32_tensor(&[2], &[0.699999988079071, 1.5])],
                    [f32_tensor(&[2], &[0.699999988079071, 1.5])]
                ]
            }),
            "{name}"
        );
        // Example 2.
        let out = json_step(
            backend.as_ref(),
            &json!({
                "parameter_replicas": [[[1, -1]], [[1, -1]]],
                "gradient_replicas": [[[2, 4]], [[0, 0]]],
                "learning_rate": 0.5
            }),
        )
        .unwrap();
        assert_eq!(
            out["mean_gradients"][0]["data"],
            json!([1.0, 2.0]),
            "{name}"
        );
        assert_eq!(
            out["updated_replicas"][1][0]["data"],
            json!([0.5, -2.0]),
            "{name}"
        );
        // Example 3, with tensor objects.
        let (params, grads) = example_3();
        let to_json = |t: &Tensor| pollster::block_on(tensor_to_json(t)).unwrap();
        let request = json!({
            "parameter_replicas": params.iter().map(|r| r.iter().map(to_json).collect::<Vec<_>>()).collect::<Vec<_>>(),
            "gradient_replicas": grads.iter().map(|r| r.iter().map(|g| to_json(g.as_ref().unwrap())).collect::<Vec<_>>()).collect::<Vec<_>>(),
            "learning_rate": 0.25
        });
        let out = json_step(backend.as_ref(), &request).unwrap();
        assert_eq!(
            out["mean_gradients"],
            json!([
                f32_tensor(&[2], &[1.0, 1.0]),
                f32_tensor(&[2, 2], &[2.0, 2.0, 2.0, 2.0])
            ]),
            "{name}"
        );
        assert_eq!(out["updated_replicas"].as_array().unwrap().len(), 3);
        for rank in out["updated_replicas"].as_array().unwrap() {
            assert_eq!(
                rank,
                &json!([
                    f32_tensor(&[2], &[0.75, 1.75]),
                    f32_tensor(&[2, 2], &[0.5, 1.5, 2.5, 3.5])
                ]),
                "{name}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// JSON front end.

fn request(params: Value, grads: Value, lr: Value) -> Value {
    json!({"parameter_replicas": params, "gradient_replicas": grads, "learning_rate": lr})
}

fn json_error(value: &Value) -> Error {
    match step_request_from_json(value) {
        Ok(_) => panic!("expected an error for {value}"),
        Err(err) => err,
    }
}

#[test]
fn json_that_is_not_a_step_request_object() {
    for value in [json!([]), json!(3), json!("x"), json!(null), json!(true)] {
        assert_value_error(&json_error(&value), &["object"]);
    }
    let good_params = json!([[[1.0]]]);
    let good_grads = json!([[[1.0]]]);
    let mut missing = request(good_params.clone(), good_grads.clone(), json!(0.1));
    missing
        .as_object_mut()
        .unwrap()
        .remove("parameter_replicas");
    assert_value_error(&json_error(&missing), &["parameter_replicas"]);
    let mut missing = request(good_params.clone(), good_grads.clone(), json!(0.1));
    missing.as_object_mut().unwrap().remove("gradient_replicas");
    assert_value_error(&json_error(&missing), &["gradient_replicas"]);
    let mut missing = request(good_params.clone(), good_grads.clone(), json!(0.1));
    missing.as_object_mut().unwrap().remove("learning_rate");
    assert_value_error(&json_error(&missing), &["learning_rate"]);
    // Lists that are not lists.
    for bad in [json!(1), json!({"a": 1}), json!("x"), json!(null)] {
        let err = json_error(&request(bad.clone(), good_grads.clone(), json!(0.1)));
        assert_value_error(&err, &["parameter_replicas"]);
        let err = json_error(&request(good_params.clone(), bad.clone(), json!(0.1)));
        assert_value_error(&err, &["gradient_replicas"]);
        // A rank's list.
        let err = json_error(&request(
            json!([bad.clone()]),
            good_grads.clone(),
            json!(0.1),
        ));
        assert_value_error(&err, &["parameter_replicas[0]"]);
        let err = json_error(&request(good_params.clone(), json!([bad]), json!(0.1)));
        assert_value_error(&err, &["gradient_replicas[0]"]);
    }
    // Learning rates that are no numbers.
    for bad in [
        json!("fast"),
        json!(true),
        json!(null),
        json!([0.1]),
        json!({}),
    ] {
        let err = json_error(&request(good_params.clone(), good_grads.clone(), bad));
        assert_value_error(&err, &["learning_rate"]);
    }
    // Tensors that are no tensors.
    for bad in [
        json!(true),
        json!("1.0"),
        json!({"shape": [1], "data": [1.0]}),
    ] {
        let err = json_error(&request(
            json!([[bad.clone()]]),
            good_grads.clone(),
            json!(0.1),
        ));
        assert_value_error(&err, &["parameter 0 of rank 0"]);
        let err = json_error(&request(good_params.clone(), json!([[bad]]), json!(0.1)));
        assert_value_error(&err, &["gradient 0 of rank 0"]);
    }
}

#[test]
fn json_count_and_shape_errors_match_the_typed_api() {
    let cases = [
        (request(json!([]), json!([]), json!(0.1)), "no replicas"),
        (
            request(json!([[[1.0]], [[1.0]]]), json!([[[1.0]]]), json!(0.1)),
            "gradient replica count mismatch",
        ),
        (
            request(
                json!([[[1.0], [2.0]], [[1.0]]]),
                json!([[null, null], [null]]),
                json!(0.1),
            ),
            "parameter count mismatch: rank 1",
        ),
        (
            request(json!([[[1.0]], [[1.0]]]), json!([[null], []]), json!(0.1)),
            "gradient count mismatch: rank 1",
        ),
        (
            request(
                json!([[[1.0, 2.0]], [[1.0, 2.0, 3.0]]]),
                json!([[null], [null]]),
                json!(0.1),
            ),
            "parameter shape mismatch: parameter 0 of rank 1 has shape [3], rank 0 has [2]",
        ),
        (
            request(
                json!([[[[1.0, 2.0]]]]),
                json!([[[[1.0], [2.0]]]]),
                json!(0.1),
            ),
            "gradient shape mismatch: gradient 0 of rank 0 has shape [2, 1], its parameter has shape [1, 2]",
        ),
    ];
    for (value, needle) in cases {
        assert_value_error(&json_error(&value), &[needle]);
    }
}

#[test]
fn json_ragged_nested_lists() {
    let ragged = [
        json!([[1.0, 2.0], [3.0]]),
        json!([[1.0, 2.0], 3.0]),
        json!([1.0, [2.0]]),
        json!([[[1.0]], [2.0]]),
        json!([[1.0], [[2.0]]]),
        json!([[], [1.0]]),
        json!([[1.0], []]),
        json!([[], 1.0]),
        json!([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0]]]),
    ];
    for value in ragged {
        let err = tensor_from_json(&value, "parameter 0 of rank 0").unwrap_err();
        assert_value_error(&err, &["ragged", "parameter 0 of rank 0"]);
        // Through a request, in a gradient.
        let err = json_error(&request(
            json!([[value.clone()]]),
            json!([[value]]),
            json!(0.1),
        ));
        assert_value_error(&err, &["ragged"]);
    }
    // Rectangular nested lists, empty dimensions and scalars are fine.
    for (value, shape) in [
        (json!([[1.0, 2.0], [3.0, 4.0]]), vec![2, 2]),
        (json!([]), vec![0]),
        (json!([[], []]), vec![2, 0]),
        (json!([[[]]]), vec![1, 1, 0]),
        (json!(2.5), vec![]),
        (json!([[[1.0], [2.0]]]), vec![1, 2, 1]),
    ] {
        let t = tensor_from_json(&value, "t").unwrap_or_else(|e| panic!("{value}: {e}"));
        assert_eq!(t.shape(), shape, "{value}");
        assert_eq!(t.dtype(), DType::Float32);
    }
}

#[test]
fn json_bad_tensor_objects() {
    let bad_dtypes = [
        "float8",
        "int64",
        "int32",
        "complex64",
        "uint8",
        "bool",
        "",
        "Float32",
    ];
    for dtype in bad_dtypes {
        let value = json!({"dtype": dtype, "shape": [1], "data": [1]});
        let err = tensor_from_json(&value, "t").unwrap_err();
        assert_value_error(&err, &["unsupported dtype"]);
        // In a request: named with the parameter and rank.
        let err = json_error(&request(
            json!([[[1.0]], [value.clone()]]),
            json!([[null], [null]]),
            json!(0.1),
        ));
        assert_value_error(&err, &["unsupported dtype", "parameter 0 of rank 1"]);
        let err = json_error(&request(
            json!([[[1.0]], [[1.0]]]),
            json!([[null], [value]]),
            json!(0.1),
        ));
        assert_value_error(&err, &["unsupported dtype", "gradient 0 of rank 1"]);
    }
    let bad = [
        // data length != product of shape
        (
            json!({"dtype": "float32", "shape": [2, 2], "data": [1, 2, 3]}),
            "[2, 2]",
        ),
        (json!({"dtype": "float16", "shape": [], "data": []}), "[]"),
        (
            json!({"dtype": "bfloat16", "shape": [0], "data": [1]}),
            "[0]",
        ),
        (
            json!({"dtype": "float64", "shape": [3], "data": [1, 2, 3, 4]}),
            "[3]",
        ),
        // malformed shapes
        (
            json!({"dtype": "float32", "shape": [-1], "data": []}),
            "shape",
        ),
        (
            json!({"dtype": "float32", "shape": [1.5], "data": [1]}),
            "shape",
        ),
        (
            json!({"dtype": "float32", "shape": ["2"], "data": [1, 2]}),
            "shape",
        ),
        (
            json!({"dtype": "float32", "shape": 2, "data": [1, 2]}),
            "shape",
        ),
        (json!({"dtype": "float32", "data": [1, 2]}), "shape"),
        // malformed data
        (json!({"dtype": "float32", "shape": [2]}), "data"),
        (
            json!({"dtype": "float32", "shape": [2], "data": "12"}),
            "data",
        ),
        (
            json!({"dtype": "float32", "shape": [1], "data": ["abc"]}),
            "element 0",
        ),
        (
            json!({"dtype": "float32", "shape": [2], "data": [1, null]}),
            "element 1",
        ),
        (
            json!({"dtype": "float32", "shape": [1], "data": [true]}),
            "element 0",
        ),
        (
            json!({"dtype": "float32", "shape": [1], "data": [[1]]}),
            "element 0",
        ),
        // malformed dtype
        (json!({"dtype": 32, "shape": [1], "data": [1]}), "dtype"),
        (json!({"shape": [1], "data": [1]}), "dtype"),
    ];
    for (value, needle) in bad {
        let err = tensor_from_json(&value, "gradient 3 of rank 2").unwrap_err();
        assert_value_error(&err, &[needle, "gradient 3 of rank 2"]);
    }
    // Non-finite values as strings are accepted.
    let t = tensor_from_json(
        &json!({"dtype": "float16", "shape": [4], "data": ["nan", "inf", "-inf", -0.0]}),
        "t",
    )
    .unwrap();
    let v = t.values_f64().unwrap();
    assert!(v[0].is_nan());
    assert_eq!(&v[1..3], [f64::INFINITY, f64::NEG_INFINITY]);
    assert!(v[3] == 0.0 && v[3].is_sign_negative());
}

#[test]
fn json_nan_learning_rate_gives_nan_updates() {
    for (name, backend) in common::named_backends() {
        for lr in [json!("nan"), json!("inf"), json!("-inf")] {
            let out = json_step(
                backend.as_ref(),
                &request(
                    json!([[[1.0, 2.0]], [[1.0, 2.0]]]),
                    json!([[[2.0, 0.0]], [null]]),
                    lr.clone(),
                ),
            )
            .unwrap_or_else(|e| panic!("{name}, lr {lr}: {e}"));
            assert_eq!(out["mean_gradients"][0]["data"], json!([1.0, 0.0]));
            let updated = &out["updated_replicas"][0][0]["data"];
            // NaN * 1 and NaN * 0 are NaN; inf * 0 is NaN too, inf * 1 is inf.
            let expected = match lr.as_str().unwrap() {
                "nan" => json!(["nan", "nan"]),
                "inf" => json!(["-inf", "nan"]),
                _ => json!(["inf", "nan"]),
            };
            assert_eq!(updated, &expected, "{name}, lr {lr}");
        }
    }
}

/// Every value of every dtype survives tensor -> JSON -> tensor bit for bit (signed zeros,
/// subnormals, infinities; NaN stays NaN).
#[test]
fn json_tensor_round_trip_is_exact() {
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let n = 4096;
    let tensors = [
        Tensor::new(
            &[n],
            HostData::Float32((0..n).map(|_| f32::from_bits(next() as u32)).collect()),
        ),
        Tensor::new(
            &[n],
            HostData::Float16((0..n).map(|_| f16::from_bits(next() as u16)).collect()),
        ),
        Tensor::new(
            &[n],
            HostData::BFloat16((0..n).map(|_| bf16::from_bits(next() as u16)).collect()),
        ),
        Tensor::new(
            &[n],
            HostData::Float64((0..n).map(|_| f64::from_bits(next())).collect()),
        ),
        Tensor::from_f64(
            DType::Float64,
            &[6],
            &[-0.0, 0.0, 5e-324, -f64::MAX, f64::INFINITY, 0.1],
        ),
    ];
    for t in tensors {
        let t = t.unwrap();
        let value = pollster::block_on(tensor_to_json(&t)).unwrap();
        let text = serde_json::to_string(&value).unwrap();
        let back = tensor_from_json(&serde_json::from_str(&text).unwrap(), "t").unwrap();
        let (a, b) = (bit_image(&t), bit_image(&back));
        assert_eq!((a.0, &a.1), (b.0, &b.1));
        let is_nan = |dtype: DType, bits: u64| match dtype {
            DType::Float32 => f32::from_bits(bits as u32).is_nan(),
            DType::Float16 => f16::from_bits(bits as u16).is_nan(),
            DType::BFloat16 => bf16::from_bits(bits as u16).is_nan(),
            DType::Float64 => f64::from_bits(bits).is_nan(),
        };
        for (i, (x, y)) in a.2.iter().zip(&b.2).enumerate() {
            if is_nan(a.0, *x) {
                assert!(is_nan(b.0, *y), "{} [{i}]", a.0);
            } else {
                assert_eq!(x, y, "{} [{i}]", a.0);
            }
        }
    }
    assert_eq!(number_to_json(f64::NAN), json!("nan"));
    assert_eq!(number_to_json(f64::NEG_INFINITY), json!("-inf"));
}

#[test]
fn optimizers_refuse_replicas_they_were_not_built_for() {
    use distopt::comm::SimulatedWorld;
    use distopt::optim::{Adam, AdamOptions, LocalOptimizer, OptionMap, Sgd, SgdOptions};
    use distopt::replicas::Replicas;
    use distopt::zero::{ZeroOptions, ZeroRedundancyOptimizer};
    use std::sync::Arc;

    let backend: Arc<dyn distopt::Backend> = Arc::new(distopt::CpuBackend::new());
    let one = Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap();
    let small = Replicas::replicate(backend.clone(), 2, std::slice::from_ref(&one)).unwrap();
    let mut big = Replicas::replicate(backend.clone(), 2, &[one.clone(), one.clone()]).unwrap();
    let mut sgd = Sgd::new(&small, SgdOptions::default()).unwrap();
    assert_eq!(
        sgd.step(&mut big).unwrap_err().kind(),
        distopt::ErrorKind::ValueError
    );
    let mut adam = Adam::new(&small, AdamOptions::default()).unwrap();
    assert!(adam.step(&mut big).is_err());
    assert!(pollster::block_on(adam.state_dict(&small, 5)).is_err());
    let world = Arc::new(SimulatedWorld::new(2).unwrap());
    let groups = vec![(vec![0], OptionMap::new())];
    let mut zero = ZeroRedundancyOptimizer::new(
        world,
        &small,
        groups,
        "SGD",
        &OptionMap::new(),
        ZeroOptions::default(),
    )
    .unwrap();
    assert!(zero.step(&mut big).is_err());
}

/// Values with signed zeros, subnormals, large values, infinities and NaNs among ordinary ones.
fn mixed_values(seed: u64, n: usize) -> Vec<f64> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = (state >> 33) as u32;
            match r % 23 {
                0 => 0.0,
                1 => -0.0,
                2 => 1e-42,
                3 => f64::INFINITY,
                4 => f64::NAN,
                5 => 6e4,
                _ => f64::from(r % 10_000) / 5_000.0 - 1.0,
            }
        })
        .collect()
}

fn same_bits(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dtype(), b.dtype(), "{what}: dtype");
    assert_eq!(a.shape(), b.shape(), "{what}: shape");
    let (x, y) = (values(a), values(b));
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        assert!(
            (p.is_nan() && q.is_nan()) || p.to_bits() == q.to_bits(),
            "{what}[{i}]: {p:e} != {q:e}"
        );
    }
}

/// The CPU backend computes host inputs straight from the caller's tensors; device-resident
/// inputs (arenas of the same backend) take the arena kernel. Both must give the same bits, for
/// every dtype, mixed gradient dtypes, missing gradients and sizes that split across threads.
/// The largest parameter is over `recycle::MIN_BYTES` in every dtype, so the later steps write
/// into buffers the earlier ones' dropped outputs left (`distopt::recycle`), and its float32 and
/// float64 steps move enough bytes to write their outputs with streaming stores.
#[test]
fn host_inputs_and_arena_inputs_give_the_same_bits() {
    use distopt::{ReplicaOutputs, sgd_step_with};
    let cpu = CpuBackend::with_threads(3);
    let sizes = [1usize, 5, 2048, 2049, 70_001, 1_100_001];
    for dtype in [
        DType::Float32,
        DType::Float16,
        DType::BFloat16,
        DType::Float64,
    ] {
        let ranks = 3;
        let params: Vec<Vec<Tensor>> = (0..ranks)
            .map(|_| {
                sizes
                    .iter()
                    .enumerate()
                    .map(|(j, &n)| {
                        Tensor::from_f64(dtype, &[n], &mixed_values(j as u64, n)).unwrap()
                    })
                    .collect()
            })
            .collect();
        let grads: Vec<Vec<Option<Tensor>>> = (0..ranks)
            .map(|r| {
                sizes
                    .iter()
                    .enumerate()
                    .map(|(j, &n)| {
                        let gdtype = if (r + j) % 3 == 1 {
                            DType::Float32
                        } else {
                            dtype
                        };
                        ((r + j) % 4 != 3).then(|| {
                            Tensor::from_f64(
                                gdtype,
                                &[n],
                                &mixed_values(100 + (r * 7 + j) as u64, n),
                            )
                            .unwrap()
                        })
                    })
                    .collect()
            })
            .collect();
        let on_device: Vec<Vec<Tensor>> =
            params.iter().map(|p| to_device_blocking(&cpu, p)).collect();
        let device_grads: Vec<Vec<Option<Tensor>>> = grads
            .iter()
            .map(|rank| {
                rank.iter()
                    .map(|g| {
                        g.as_ref()
                            .map(|g| to_device_blocking(&cpu, std::slice::from_ref(g))[0].clone())
                    })
                    .collect()
            })
            .collect();
        let arena = sgd_step(&cpu, &on_device, &device_grads, 0.25)
            .block_on()
            .unwrap();
        for replicas in [ReplicaOutputs::Shared, ReplicaOutputs::Separate] {
            let host =
                pollster::block_on(sgd_step_with(&cpu, &params, &grads, 0.25, replicas)).unwrap();
            for j in 0..sizes.len() {
                let what = format!("{dtype:?} param {j} {replicas:?}");
                assert!(
                    !host.mean_gradients[j].is_on_device(),
                    "{what}: host outputs"
                );
                same_bits(
                    &host.mean_gradients[j],
                    &arena.mean_gradients[j],
                    &format!("{what} mean"),
                );
                for r in 0..ranks {
                    same_bits(
                        &host.updated_replicas[r][j],
                        &arena.updated_replicas[r][j],
                        &format!("{what} rank {r}"),
                    );
                }
                let shared =
                    host.updated_replicas[0][j].shares_storage_with(&host.updated_replicas[1][j]);
                assert_eq!(
                    shared,
                    replicas == ReplicaOutputs::Shared,
                    "{what}: sharing"
                );
            }
        }
    }
}

fn to_device_blocking(backend: &dyn Backend, tensors: &[Tensor]) -> Vec<Tensor> {
    pollster::block_on(to_device(backend, tensors)).unwrap()
}

/// The GPU backend keeps a dropped step's arenas and the next step of the same size runs in
/// them without clearing them first: a missing gradient must still count as zero, on a rank
/// that has other gradients and on a rank that has none. Compared with the CPU backend.
#[test]
fn gpu_steps_in_kept_arenas_treat_missing_gradients_as_zero() {
    let Some(gpu) = common::gpu_backend() else {
        return;
    };
    let cpu = CpuBackend::new();
    let sizes = [300_000usize, 70_001];
    let ranks = 3;
    let params: Vec<Vec<Tensor>> = (0..ranks)
        .map(|_| {
            sizes
                .iter()
                .enumerate()
                .map(|(j, &n)| Tensor::from_f64(DType::Float32, &[n], &mixed_values(j as u64, n)))
                .collect::<Result<_, _>>()
                .unwrap()
        })
        .collect();
    let grads = |seed: u64, missing: &dyn Fn(usize, usize) -> bool| -> Vec<Vec<Option<Tensor>>> {
        (0..ranks)
            .map(|r| {
                sizes
                    .iter()
                    .enumerate()
                    .map(|(j, &n)| {
                        (!missing(r, j)).then(|| {
                            let values = mixed_values(seed + (r * 7 + j) as u64, n);
                            Tensor::from_f64(DType::Float32, &[n], &values).unwrap()
                        })
                    })
                    .collect()
            })
            .collect()
    };
    // First every gradient (the arenas fill up), then gaps: rank 1 lacks parameter 0, rank 2
    // lacks every gradient.
    let full = grads(10, &|_, _| false);
    drop(
        sgd_step(gpu.as_ref(), &params, &full, 0.5)
            .block_on()
            .unwrap(),
    );
    let gappy = grads(20, &|r, j| (r == 1 && j == 0) || r == 2);
    let on_gpu = sgd_step(gpu.as_ref(), &params, &gappy, 0.5)
        .block_on()
        .unwrap();
    let on_cpu = sgd_step(&cpu, &params, &gappy, 0.5).block_on().unwrap();
    for j in 0..sizes.len() {
        same_bits(
            &on_gpu.mean_gradients[j],
            &on_cpu.mean_gradients[j],
            &format!("mean {j}"),
        );
        for r in 0..ranks {
            same_bits(
                &on_gpu.updated_replicas[r][j],
                &on_cpu.updated_replicas[r][j],
                &format!("rank {r} param {j}"),
            );
        }
    }
}
