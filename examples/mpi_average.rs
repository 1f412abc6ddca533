//! Post-local SGD with hierarchical averaging, one rank per process over MPI: each rank drifts
//! its own copy of a parameter for a few local steps, and the averager brings the copies back
//! together — every 2 steps within pairs of ranks, every 4 steps over the whole world.
//!
//! ```text
//! cargo build --release --features mpi --example mpi_average
//! mpirun -np 4 target/release/examples/mpi_average
//! ```

use std::sync::Arc;

use distopt::BlockOn;
use distopt::averaging::{HierarchicalModelAverager, ModelAverager};
use distopt::comm::Communicator;
use distopt::comm::mpi::{MpiWorld, install_panic_hook};
use distopt::replicas::Replicas;
use distopt::{CpuBackend, Result, Tensor};

fn main() {
    let world = match MpiWorld::initialize() {
        Ok(world) => world,
        Err(err) => {
            eprintln!("{err}");
            std::process::exit(1);
        }
    };
    // A panic on any rank ends the whole job instead of leaving the others in a collective.
    install_panic_hook(&world);
    if let Err(err) = run(&world) {
        // Every rank ends, with this rank's message.
        world.abort_with(&err.to_string(), 1);
    }
    // Dropping the last reference finalizes MPI.
}

fn run(world: &Arc<MpiWorld>) -> Result<()> {
    let rank = world.rank();
    let size = world.world_size();
    // This process holds one rank: its replica of a 4-element parameter, with a gradient so
    // that the averager includes it.
    let start = Tensor::from_f32(&[4], vec![0.0; 4])?;
    let mut model = Replicas::replicate(Arc::new(CpuBackend::new()), 1, &[start])?;
    model.set_grads(0, &[Some(Tensor::from_f32(&[4], vec![0.0; 4])?)])?;
    // Pairs every 2 steps, the world every 4 (with 2 processes, pairs are the world).
    let levels: Vec<(i64, i64)> = if size >= 4 && size.is_multiple_of(2) {
        vec![(2, 2), (4, size as i64)]
    } else {
        vec![(4, size as i64)]
    };
    let mut averager = HierarchicalModelAverager::new(&levels, 0, world.clone())?;
    for step in 1..=8 {
        // A local step: each rank moves by its own amount.
        let current = model.param(0, 0).block_on()?.values_f64()?;
        let moved: Vec<f32> = current
            .iter()
            .map(|v| (*v + (rank + 1) as f64) as f32)
            .collect();
        model.set_param(0, 0, &Tensor::from_f32(&[4], moved)?)?;
        let group = averager.average_parameters(&mut model, None)?;
        let value = model.param(0, 0).block_on()?.values_f64()?[0];
        println!(
            "rank {rank} step {step}: {value:6.2}{}",
            group.map_or(String::new(), |g| format!("  (averaged over {g} ranks)"))
        );
    }
    Ok(())
}
