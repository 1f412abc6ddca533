//! Arena accesses on both backends: every read, write and copy starts on a word, whatever the
//! format (a misaligned 16-bit offset used to be read from the element before it).

mod common;

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

/// A dropped arena's buffer is kept by its device and serves the next arena of its size: a
/// new arena is zeros all the same, a scratch arena may show the old values.
#[test]
fn a_kept_gpu_buffer_makes_a_zeroed_arena() {
    let Ok(gpu) = distopt::GpuBackend::new_blocking() else {
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
