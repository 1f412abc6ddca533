//! The tasks' unit tests: the hand-written backprop, determinism, the digits' split, bad data.

use super::*;

/// The hand-written backprop matches central finite differences.
#[test]
fn gradient_matches_finite_differences() {
    let config = TaskConfig {
        features: 5,
        hidden: 4,
        classes: 3,
        samples: 40,
        ..TaskConfig::default()
    };
    let task = SyntheticTask::new(config, 2).unwrap();
    let mut params: Vec<Vec<f64>> = task
        .initial_params()
        .unwrap()
        .iter()
        .map(|t| t.values_f64().unwrap())
        .collect();
    // Non-zero biases, so that their gradients are exercised away from the origin.
    params[1]
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = 0.1 * i as f64);
    params[3]
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = -0.2 * i as f64);
    let batch = [0, 3, 7, 11];
    let (_, grads) = task.loss_and_grad(&params, 1, &batch).unwrap();
    let eps = 1e-6;
    for j in 0..params.len() {
        for i in 0..params[j].len() {
            let mut plus = params.clone();
            plus[j][i] += eps;
            let mut minus = params.clone();
            minus[j][i] -= eps;
            let numeric = (task.loss_and_grad(&plus, 1, &batch).unwrap().0
                - task.loss_and_grad(&minus, 1, &batch).unwrap().0)
                / (2.0 * eps);
            assert!(
                (numeric - grads[j][i]).abs() < 1e-6,
                "param {j}[{i}]: numeric {numeric}, backprop {}",
                grads[j][i]
            );
        }
    }
}

#[test]
fn data_is_deterministic_and_skewed() {
    let a = SyntheticTask::new(TaskConfig::default(), 8).unwrap();
    let b = SyntheticTask::new(TaskConfig::default(), 8).unwrap();
    assert_eq!(a.data.inputs, b.data.inputs);
    assert_eq!(a.data.labels, b.data.labels);
    assert_eq!(a.shard_len(0), 512);
    let counts = a.class_counts(5);
    assert_eq!(counts.iter().sum::<usize>(), 512);
    assert!(counts[1] > 400, "{counts:?}");
}

#[test]
fn digits_parse_and_split_non_iid() {
    let digits = Dataset::digits().unwrap();
    assert_eq!(digits.len(), 1797);
    assert_eq!(digits.features(), 64);
    assert_eq!(digits.classes(), 10);
    assert_eq!(
        digits.class_counts(),
        vec![178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    );
    // The first image of scikit-learn's copy is a 0: row 0 is 0,0,5,13,9,1,0,0.
    assert_eq!(digits.labels()[0], 0);
    let first = digits.sample(0).unwrap();
    assert_eq!(
        &first[..8],
        &[
            0.0,
            0.0,
            5.0 / 16.0,
            13.0 / 16.0,
            9.0 / 16.0,
            1.0 / 16.0,
            0.0,
            0.0
        ]
    );

    let task = DatasetTask::new(&digits, DatasetConfig::default(), 4).unwrap();
    assert_eq!(task.test_len(), 359);
    assert_eq!(task.train_len(), 1797 - 359);
    assert_eq!(
        (0..4).map(|r| Task::shard_len(&task, r)).sum::<usize>(),
        1438
    );
    // Non-IID: every shard is dominated by a few classes.
    for rank in 0..4 {
        let counts = Task::class_counts(&task, rank);
        let mut sorted = counts.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let top3: usize = sorted[..3].iter().sum();
        assert!(
            top3 * 10 > Task::shard_len(&task, rank) * 7,
            "rank {rank}: {counts:?}"
        );
    }
    // IID at heterogeneity 0: every shard holds every class.
    let iid = DatasetTask::new(
        &digits,
        DatasetConfig {
            heterogeneity: 0.0,
            ..DatasetConfig::default()
        },
        4,
    )
    .unwrap();
    for rank in 0..4 {
        assert!(Task::class_counts(&iid, rank).iter().all(|&c| c > 15));
    }
    assert_eq!("digits".parse::<TaskKind>().unwrap(), TaskKind::Digits);
    assert_eq!(TaskKind::Synthetic.to_string(), "synthetic");
    assert!("mnist".parse::<TaskKind>().is_err());
    assert_eq!(TaskKind::Digits.build(8, 0).unwrap().ranks(), 8);
}

#[test]
fn bad_data_is_an_error() {
    let err = |r: Result<Dataset>| r.unwrap_err().to_string();
    assert!(err(Dataset::new("x", 2, 2, vec![0.0; 5], vec![0, 1])).contains("need 4 values"));
    assert!(err(Dataset::new("x", 1, 2, vec![0.0, f64::NAN], vec![0, 1])).contains("finite"));
    assert!(err(Dataset::new("x", 1, 2, vec![0.0, 1.0], vec![0, 2])).contains("out of range"));
    assert!(err(Dataset::new("x", 1, 1, vec![0.0], vec![0])).contains("2 classes"));
    assert!(err(Dataset::from_digits_bin(b"PNG...")).contains("not a digits file"));
    assert!(err(Dataset::from_digits_bin(&DIGITS_BIN[..1000])).contains("bytes"));
    let tiny = Dataset::new("x", 1, 2, vec![0.0, 1.0, 0.5], vec![0, 1, 0]).unwrap();
    let split = |test_fraction, ranks| {
        DatasetTask::new(
            &tiny,
            DatasetConfig {
                test_fraction,
                ..DatasetConfig::default()
            },
            ranks,
        )
    };
    assert!(split(0.0, 1).is_err());
    assert!(split(1.0, 1).is_err());
    assert!(split(0.4, 3).is_err());
    assert!(split(0.4, 2).is_ok());
}
