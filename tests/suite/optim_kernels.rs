//! The optimizer and averaging kernels on the GPU against the CPU backend, on models with many
//! parameters of mixed sizes (the per-parameter table lookup), every storage format, and arenas
//! split into chunks with a 2-D dispatch grid.

use crate::common::{self, Random};

use std::sync::Arc;

use distopt::BlockOn;
use distopt::averaging::average_parameters;
use distopt::backend::gpu::GpuOptions;
use distopt::comm::SimulatedWorld;
use distopt::optim::{Adam, AdamWOptions, LocalOptimizer, Sgd, SgdOptions};
use distopt::replicas::Replicas;
use distopt::{Backend, CpuBackend, DType, Tensor};

const RANKS: usize = 4;

fn model(backend: Arc<dyn Backend>, dtype: DType, seed: u64) -> Replicas {
    let mut random = Random::new(seed);
    // Tiny parameters (several per 512-element block), block-sized and larger ones.
    let sizes = [1usize, 3, 64, 65, 7, 511, 512, 513, 1500, 2, 4000, 9];
    let per_rank: Vec<Vec<Tensor>> = (0..RANKS)
        .map(|_| {
            sizes
                .iter()
                .map(|&n| {
                    Tensor::from_f64(
                        dtype,
                        &[n],
                        &(0..n).map(|_| random.next()).collect::<Vec<_>>(),
                    )
                    .unwrap()
                })
                .collect()
        })
        .collect();
    let mut replicas = Replicas::new(backend, &per_rank).unwrap();
    for rank in 0..RANKS {
        let grads: Vec<Option<Tensor>> = sizes
            .iter()
            .enumerate()
            .map(|(j, &n)| {
                let values: Vec<f64> = (0..n).map(|_| random.next()).collect();
                // Some parameters have no gradient on some ranks.
                ((j + rank) % 5 != 0).then(|| Tensor::from_f64(dtype, &[n], &values).unwrap())
            })
            .collect();
        replicas.set_grads(rank, &grads).unwrap();
    }
    replicas
}

fn assert_close(gpu: &Replicas, cpu: &Replicas, what: &str) {
    let (a, b) = (
        gpu.all_params().block_on().unwrap(),
        cpu.all_params().block_on().unwrap(),
    );
    for (rank, (x, y)) in a.iter().zip(&b).enumerate() {
        for (j, (x, y)) in x.iter().zip(y).enumerate() {
            let (x, y) = (x.values_f64().unwrap(), y.values_f64().unwrap());
            for (i, (p, q)) in x.iter().zip(&y).enumerate() {
                let ok = p == q
                    || (p.is_nan() && q.is_nan())
                    || (p - q).abs() <= 1e-6 * q.abs().max(1e-30);
                assert!(ok, "{what}: rank {rank} param {j} [{i}]: gpu {p} cpu {q}");
            }
        }
    }
}

fn run(gpu: Arc<dyn Backend>, label: &str) {
    for dtype in [DType::Float32, DType::Float16, DType::BFloat16] {
        let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
        let (mut g, mut c) = (model(gpu.clone(), dtype, 1), model(cpu.clone(), dtype, 1));
        // PyTorch's default single-tensor arithmetic, then its fused one (`fused=True`).
        for fused in [false, true] {
            let options = SgdOptions::default()
                .with_lr(0.1)
                .with_momentum(0.9)
                .with_weight_decay(0.01)
                .with_nesterov(true)
                .with_fused(fused);
            let (mut sg, mut sc) = (
                Sgd::new(&g, options.clone()).unwrap(),
                Sgd::new(&c, options).unwrap(),
            );
            for _ in 0..3 {
                sg.step(&mut g).unwrap();
                sc.step(&mut c).unwrap();
            }
            assert_close(&g, &c, &format!("{label} SGD {dtype} fused {fused}"));
            // beta1 on both sides of 0.5: PyTorch's lerp takes its two formulas.
            for beta1 in [0.85, 0.3] {
                let adam = AdamWOptions::default()
                    .with_lr(0.01)
                    .with_betas((beta1, 0.995))
                    .with_weight_decay(0.1)
                    .with_amsgrad(true)
                    .with_fused(fused);
                let (mut ag, mut ac) = (
                    Adam::adamw(&g, adam.clone()).unwrap(),
                    Adam::adamw(&c, adam).unwrap(),
                );
                for _ in 0..3 {
                    ag.step(&mut g).unwrap();
                    ac.step(&mut c).unwrap();
                }
                assert_close(
                    &g,
                    &c,
                    &format!("{label} AdamW {dtype} beta1 {beta1} fused {fused}"),
                );
            }
        }
        let world = SimulatedWorld::new(RANKS).unwrap();
        for size in [2, 4] {
            average_parameters(
                &world,
                &mut g,
                distopt::comm::new_subgroups(RANKS, size).unwrap(),
                None,
            )
            .unwrap();
            average_parameters(
                &world,
                &mut c,
                distopt::comm::new_subgroups(RANKS, size).unwrap(),
                None,
            )
            .unwrap();
            assert_close(&g, &c, &format!("{label} average over {size} {dtype}"));
        }
    }
}

#[test]
fn gpu_kernels_match_the_cpu_backend() {
    if let Some(gpu) = common::gpu_backend() {
        run(gpu, "gpu");
    }
}

#[test]
fn chunked_gpu_kernels_match_the_cpu_backend() {
    // 4 KiB bindings: every arena is split into many chunks; 2 workgroups per dimension.
    let options = GpuOptions::default()
        .with_max_binding_bytes(4096)
        .with_max_workgroups_per_dimension(2);
    if let Some(gpu) = common::gpu_backend_with_options(options) {
        run(gpu, "chunked gpu");
    }
}

/// The shader-copy roofline copies every word, whole arenas and chunked ones.
#[test]
fn the_shader_copy_roofline_copies_every_word() {
    use distopt::{GpuBackend, StorageFormat};
    for options in [
        GpuOptions::default(),
        GpuOptions::default()
            .with_max_binding_bytes(4096)
            .with_max_workgroups_per_dimension(2),
    ] {
        let gpu = match pollster::block_on(GpuBackend::with_options(options)) {
            Ok(gpu) => gpu,
            Err(_) if std::env::var("DISTOPT_ALLOW_NO_GPU").as_deref() == Ok("1") => return,
            Err(e) => panic!("no GPU adapter: {e}"),
        };
        let (ranks, len) = (3, 64 * 37);
        let chunk = gpu.chunk_len(len, ranks);
        let mut src = gpu
            .create_arena(StorageFormat::F32, ranks, len, chunk)
            .unwrap();
        let mut dst = gpu
            .create_arena(StorageFormat::F32, ranks, len, chunk)
            .unwrap();
        for rank in 0..ranks {
            let words: Vec<u32> = (0..len as u32).map(|i| i * 7 + rank as u32).collect();
            src.write(rank, 0, &words).unwrap();
            dst.write(rank, 0, &vec![0xdead_beef; len]).unwrap();
        }
        gpu.shader_copy(&src, &mut dst).unwrap();
        let (a, b) = pollster::block_on(async {
            (src.read_all().await.unwrap(), dst.read_all().await.unwrap())
        });
        assert_eq!(a, b, "chunk {chunk}");
        let f16 = gpu
            .create_arena(StorageFormat::F16, ranks, len, chunk)
            .unwrap();
        assert!(gpu.shader_copy(&f16, &mut dst).is_err());
    }
}
