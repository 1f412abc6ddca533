//! Arena accesses on both backends: every read, write and copy starts on a word, whatever the
//! format (a misaligned 16-bit offset used to be read from the element before it).

use crate::common;

use distopt::BlockOn;
use distopt::{Backend, ErrorKind, StorageFormat};

#[test]
fn misaligned_16_bit_accesses_are_value_errors() {
    for backend in common::backends() {
        let f = StorageFormat::F16;
        let mut arena = backend.create_arena(f, 2, 64, 64).unwrap();
        let words: Vec<u32> = (0..32).collect();
        arena.write(0, 0, &words).unwrap();
        let err = pollster::block_on(arena.read_range(0, 1, 4)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueError, "{err}");
        assert!(err.message().contains("not word aligned"), "{err}");
        let err = backend
            .copy_between_ranks(&mut arena, 0, 1, 3, 4)
            .unwrap_err();
        assert!(err.message().contains("not word aligned"), "{err}");
        // Aligned accesses still work, and the refused copy changed nothing.
        assert_eq!(
            pollster::block_on(arena.read_range(0, 2, 4)).unwrap(),
            vec![1, 2]
        );
        assert_eq!(
            pollster::block_on(arena.read_range(1, 0, 64)).unwrap(),
            vec![0; 32]
        );
        backend.copy_between_ranks(&mut arena, 0, 1, 2, 4).unwrap();
        assert_eq!(
            pollster::block_on(arena.read_range(1, 0, 8)).unwrap(),
            vec![0, 1, 2, 0]
        );
    }
}

#[test]
fn optimizer_state_a_step_needs_is_checked_on_both_backends() {
    use distopt::backend::kernels::{AdamArenas, AdamScalars, ParamStarts, SgdArgs, SgdScalars};
    for backend in common::backends() {
        let f = StorageFormat::F32;
        let arena = || backend.create_arena(f, 1, 64, 64).unwrap();
        let (mut params, grads) = (arena(), arena());
        let starts = ParamStarts(vec![0]);
        let sgd = SgdScalars {
            active: true,
            lr: 0.1,
            momentum: 0.9,
            ..SgdScalars::default()
        };
        let err = backend
            .sgd(SgdArgs {
                params: &mut params,
                grads: &grads,
                momentum: None,
                starts: &starts,
                scalars: &[sgd],
            })
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueError, "{err}");
        assert!(err.message().contains("no momentum arena"), "{err}");
        let adam = AdamScalars {
            active: true,
            amsgrad: true,
            ..AdamScalars::default()
        };
        let (mut m, mut v) = (arena(), arena());
        let arenas = AdamArenas {
            params: &mut params,
            grads: &grads,
            exp_avg: &mut m,
            exp_avg_sq: &mut v,
            max_exp_avg_sq: None,
        };
        let err = backend.adam(arenas, &starts, &[adam]).unwrap_err();
        assert!(err.message().contains("no max_exp_avg_sq arena"), "{err}");
    }
}

/// A dropped arena's buffer is kept by its device and serves the next arena of its size: a
/// new arena is zeros all the same, a scratch arena may show the old values.
#[test]
fn a_kept_gpu_buffer_makes_a_zeroed_arena() {
    let Ok(gpu) = distopt::GpuBackend::new().block_on() else {
        assert!(common::gpu_backend().is_none());
        return;
    };
    let f = StorageFormat::F32;
    let len = 1 << 18; // 1 MiB: large enough to be kept
    let chunk = gpu.chunk_len(len, 1);
    let mut arena = gpu.create_arena(f, 1, len, chunk).unwrap();
    arena.write(0, 0, &vec![0x3f80_0000; len]).unwrap();
    assert_eq!(gpu.cached_buffer_bytes(), 0);
    drop(arena);
    assert_eq!(gpu.cached_buffer_bytes(), 4 * len as u64);
    let fresh = gpu.create_arena(f, 1, len, chunk).unwrap();
    assert_eq!(gpu.cached_buffer_bytes(), 0, "the kept buffer was taken");
    let words = pollster::block_on(fresh.read_all()).unwrap();
    assert!(words.iter().all(|&w| w == 0), "a new arena is zeros");
    drop(fresh);
    let scratch = gpu.create_scratch_arena(f, 1, len, chunk).unwrap();
    assert_eq!(pollster::block_on(scratch.read_all()).unwrap().len(), len);
    drop(scratch);
    gpu.release_cached_buffers();
    assert_eq!(gpu.cached_buffer_bytes(), 0);
}

/// What a kernel call did: the arenas' words afterwards, or the kind of its refusal.
#[derive(Debug, PartialEq)]
enum Outcome {
    Done(Vec<Vec<u32>>),
    Refused(ErrorKind),
}

fn outcome(result: distopt::Result<()>, arenas: &[&distopt::backend::Arena]) -> Outcome {
    match result {
        Ok(()) => Outcome::Done(
            arenas
                .iter()
                .map(|a| pollster::block_on(a.read_all()).unwrap())
                .collect(),
        ),
        Err(e) => Outcome::Refused(e.kind()),
    }
}

/// Every per-parameter kernel, and the step, on degenerate inputs: an empty parameter table
/// (an arena with no parameters), no ranks, rows of no elements, no active parameter, and a
/// table that does not fit its arena. Each case must do the same on the CPU and on the GPU
/// backend: a no-op success for nothing to do, a `ValueError` for a table or arena that does
/// not fit (never a panic, never a kernel over garbage).
#[test]
fn degenerate_kernel_inputs_do_the_same_on_both_backends() {
    use distopt::backend::kernels::{
        AdamArenas, AdamScalars, AverageArgs, ConvertArgs, LerpArgs, MeanOrder, ParamStarts,
        ScaledSumArgs, SgdArgs, SgdScalars,
    };
    type Case = (&'static str, Outcome);
    let run = |backend: &dyn Backend| -> Vec<Case> {
        let f = StorageFormat::F32;
        let filled = |ranks: usize, len: usize| {
            let chunk = backend.chunk_len(len, ranks);
            let mut a = backend.create_arena(f, ranks, len, chunk).unwrap();
            for rank in 0..ranks {
                let words: Vec<u32> = (0..len)
                    .map(|i| (1.0 + i as f32 + 100.0 * rank as f32).to_bits())
                    .collect();
                a.write(rank, 0, &words).unwrap();
            }
            a
        };
        let none = ParamStarts(vec![]);
        let one = ParamStarts(vec![0]);
        let mut cases: Vec<Case> = Vec::new();
        // An empty table over an arena with no parameters: nothing to do.
        let mut a = filled(2, 64);
        let r = backend.average(AverageArgs {
            arena: &mut a,
            group_size: 2,
            arith: f,
            starts: &none,
            active: &[],
            order: MeanOrder::DivideThenSum,
        });
        cases.push(("average, empty table", outcome(r, &[&a])));
        let (mut p, e) = (filled(2, 64), filled(2, 64));
        let r = backend.lerp(LerpArgs {
            params: &mut p,
            end: &e,
            starts: &none,
            active: &[],
            weight: 0.5,
        });
        cases.push(("lerp, empty table", outcome(r, &[&p])));
        let (src, mut dst) = (filled(2, 64), filled(2, 64));
        let r = backend.convert(ConvertArgs {
            src: &src,
            dst: &mut dst,
            starts: &none,
            active: &[],
        });
        cases.push(("convert, empty table", outcome(r, &[&dst])));
        let mut a = filled(2, 64);
        let r = backend.scaled_sum(ScaledSumArgs {
            arena: &mut a,
            arith: f,
            starts: &none,
            reduced: &[],
            scales: &[Some(0.5), Some(0.5)],
            present: &[],
        });
        cases.push(("scaled_sum, empty table", outcome(r, &[&a])));
        // An empty table is still checked against the other arguments.
        let mut a = filled(2, 64);
        let r = backend.average(AverageArgs {
            arena: &mut a,
            group_size: 3,
            arith: f,
            starts: &none,
            active: &[],
            order: MeanOrder::DivideThenSum,
        });
        cases.push((
            "average, empty table, group of 3 in 2 ranks",
            outcome(r, &[&a]),
        ));
        let (mut p, e) = (filled(2, 64), filled(1, 64));
        let r = backend.lerp(LerpArgs {
            params: &mut p,
            end: &e,
            starts: &none,
            active: &[],
            weight: 0.5,
        });
        cases.push(("lerp, empty table, end of 1 rank", outcome(r, &[&p])));
        let (mut p, e) = (filled(2, 64), filled(2, 64));
        let r = backend.lerp(LerpArgs {
            params: &mut p,
            end: &e,
            starts: &none,
            active: &[true],
            weight: 0.5,
        });
        cases.push(("lerp, empty table, one flag", outcome(r, &[&p])));
        // No active parameter: nothing changes.
        let mut a = filled(2, 64);
        let r = backend.average(AverageArgs {
            arena: &mut a,
            group_size: 2,
            arith: f,
            starts: &one,
            active: &[false],
            order: MeanOrder::DivideThenSum,
        });
        cases.push(("average, nothing active", outcome(r, &[&a])));
        let (mut p, e) = (filled(2, 64), filled(2, 64));
        let r = backend.lerp(LerpArgs {
            params: &mut p,
            end: &e,
            starts: &one,
            active: &[false],
            weight: 0.5,
        });
        cases.push(("lerp, nothing active", outcome(r, &[&p])));
        let (mut p, e) = (filled(2, 64), filled(2, 64));
        let r = backend.lerp(LerpArgs {
            params: &mut p,
            end: &e,
            starts: &one,
            active: &[true],
            weight: f64::NAN,
        });
        cases.push(("lerp, a NaN weight", outcome(r, &[&p])));
        // A table that does not fit its arena: past the rank's elements, not starting at 0,
        // descending, or not on a 64-element slot.
        for (name, table) in [
            ("past the end", vec![0, 192]),
            ("not from 0", vec![64]),
            ("descending", vec![0, 64, 0]),
            ("misaligned", vec![0, 32]),
        ] {
            let starts = ParamStarts(table);
            let n = starts.0.len();
            let mut a = filled(2, 128);
            let r = backend.average(AverageArgs {
                arena: &mut a,
                group_size: 2,
                arith: f,
                starts: &starts,
                active: &vec![true; n],
                order: MeanOrder::DivideThenSum,
            });
            cases.push((leak(format!("average, table {name}")), outcome(r, &[&a])));
            let (mut p, e) = (filled(2, 128), filled(2, 128));
            let r = backend.lerp(LerpArgs {
                params: &mut p,
                end: &e,
                starts: &starts,
                active: &vec![true; n],
                weight: 0.5,
            });
            cases.push((leak(format!("lerp, table {name}")), outcome(r, &[&p])));
            let (mut p, g) = (filled(2, 128), filled(2, 128));
            let sgd = vec![
                SgdScalars {
                    active: true,
                    lr: 0.5,
                    ..SgdScalars::default()
                };
                2 * n
            ];
            let r = backend.sgd(SgdArgs {
                params: &mut p,
                grads: &g,
                momentum: None,
                starts: &starts,
                scalars: &sgd,
            });
            cases.push((leak(format!("sgd, table {name}")), outcome(r, &[&p])));
            let mut a = filled(2, 128);
            let r = backend.scaled_sum(ScaledSumArgs {
                arena: &mut a,
                arith: f,
                starts: &starts,
                reduced: &vec![true; n],
                scales: &[Some(1.0); 2],
                present: &vec![true; 2 * n],
            });
            cases.push((leak(format!("scaled_sum, table {name}")), outcome(r, &[&a])));
            let (src, mut dst) = (filled(2, 128), filled(2, 128));
            let r = backend.convert(ConvertArgs {
                src: &src,
                dst: &mut dst,
                starts: &starts,
                active: &vec![true; n],
            });
            cases.push((leak(format!("convert, table {name}")), outcome(r, &[&dst])));
        }
        // No ranks.
        let mut a = filled(0, 64);
        let r = backend.average(AverageArgs {
            arena: &mut a,
            group_size: 1,
            arith: f,
            starts: &one,
            active: &[true],
            order: MeanOrder::DivideThenSum,
        });
        cases.push(("average, no ranks", outcome(r, &[&a])));
        let (mut p, e) = (filled(0, 64), filled(0, 64));
        let r = backend.lerp(LerpArgs {
            params: &mut p,
            end: &e,
            starts: &one,
            active: &[true],
            weight: 0.5,
        });
        cases.push(("lerp, no ranks", outcome(r, &[&p])));
        let (src, mut dst) = (filled(0, 64), filled(0, 64));
        let r = backend.convert(ConvertArgs {
            src: &src,
            dst: &mut dst,
            starts: &one,
            active: &[true],
        });
        cases.push(("convert, no ranks", outcome(r, &[&dst])));
        let mut a = filled(0, 64);
        let r = backend.scaled_sum(ScaledSumArgs {
            arena: &mut a,
            arith: f,
            starts: &one,
            reduced: &[true],
            scales: &[],
            present: &[],
        });
        cases.push(("scaled_sum, no ranks", outcome(r, &[&a])));
        let (mut p, g) = (filled(0, 64), filled(0, 64));
        let r = backend.sgd(SgdArgs {
            params: &mut p,
            grads: &g,
            momentum: None,
            starts: &one,
            scalars: &[],
        });
        cases.push(("sgd, no ranks", outcome(r, &[&p])));
        let (mut p, g, mut m, mut v) = (filled(0, 64), filled(0, 64), filled(0, 64), filled(0, 64));
        let arenas = AdamArenas {
            params: &mut p,
            grads: &g,
            exp_avg: &mut m,
            exp_avg_sq: &mut v,
            max_exp_avg_sq: None,
        };
        let r = backend.adam(arenas, &one, &[]);
        cases.push(("adam, no ranks", outcome(r, &[&p])));
        let (mut p, g, mut means) = (filled(0, 64), filled(0, 64), filled(1, 64));
        let r = backend.dp_sgd_step_with_divisor(&mut p, &g, &mut means, 0.5, 2.0);
        cases.push(("dp_sgd_step, no ranks", outcome(r, &[&means])));
        // Rows of no elements.
        let empty = |ranks: usize| backend.create_arena(f, ranks, 0, backend.chunk_len(0, ranks));
        cases.push((
            "create_arena, rows of no elements",
            match empty(2) {
                Ok(a) => outcome(Ok(()), &[&a]),
                Err(e) => Outcome::Refused(e.kind()),
            },
        ));
        if let (Ok(mut p), Ok(g), Ok(mut means)) = (empty(2), empty(2), empty(1)) {
            let r = backend.dp_sgd_step(&mut p, &g, &mut means, 0.5);
            cases.push((
                "dp_sgd_step, rows of no elements",
                outcome(r, &[&p, &means]),
            ));
            let r = backend.average(AverageArgs {
                arena: &mut p,
                group_size: 2,
                arith: f,
                starts: &none,
                active: &[],
                order: MeanOrder::DivideThenSum,
            });
            cases.push(("average, rows of no elements", outcome(r, &[&p])));
        }
        let _ = AdamScalars::default();
        cases
    };
    let backends = common::backends();
    let cpu = run(backends[0].as_ref());
    // The values of a filled arena of 2 ranks × 64, as `run` writes them: what a call with
    // nothing to do must leave.
    let untouched: Vec<u32> = (0..2)
        .flat_map(|rank| (0..64).map(move |i| (1.0 + i as f32 + 100.0 * rank as f32).to_bits()))
        .collect();
    for (name, got) in &cpu {
        println!("cpu: {name}: {got:?}");
        let refused = [
            "past the end",
            "not from 0",
            "descending",
            "misaligned",
            "group of 3",
        ]
        .iter()
        .chain(&[
            "end of 1 rank",
            "one flag",
            "dp_sgd_step, no ranks",
            "NaN weight",
        ])
        .any(|bad| name.contains(bad));
        if refused {
            assert_eq!(got, &Outcome::Refused(ErrorKind::ValueError), "{name}");
        } else {
            let Outcome::Done(arenas) = got else {
                panic!("{name}: refused ({got:?}), expected a no-op success");
            };
            if name.ends_with("empty table") || name.ends_with("nothing active") {
                for words in arenas {
                    assert_eq!(words, &untouched, "{name}: the arena changed");
                }
            }
        }
    }
    for backend in &backends[1..] {
        let gpu = run(backend.as_ref());
        for ((name, want), (_, got)) in cpu.iter().zip(&gpu) {
            println!("gpu: {name}: {got:?}");
            assert_eq!(
                got, want,
                "{name}: the GPU backend disagrees with the CPU backend"
            );
        }
        assert_eq!(cpu.len(), gpu.len());
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}
