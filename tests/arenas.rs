//! Arena accesses on both backends: every read, write and copy starts on a word, whatever the
//! format (a misaligned 16-bit offset used to be read from the element before it).

mod common;

use distopt::{ErrorKind, StorageFormat};

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
    use distopt::backend::kernels::{AdamArenas, AdamScalars, ParamStarts, SgdScalars};
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
            .sgd(&mut params, &grads, None, &starts, &[sgd])
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
