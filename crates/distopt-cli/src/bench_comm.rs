//! `distopt bench comm`, under `mpirun -np W` or as W processes of `--world nats://…`:
//! distopt's all-reduce-mean over the transport (one rank's arena on the chosen backend, through
//! the `Communicator` every algorithm uses) against the transport with no distopt layer moving
//! the same float32 bytes (a raw `MPI_Allreduce`; raw NATS publish/subscribe in the pattern of
//! distopt's reduction), timed in the same run.

use crate::output::outln;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distopt::BlockOn;
use distopt::Error;
use distopt::backend::PARAM_ALIGN_ELEMENTS;
use distopt::backend::kernels::ParamStarts;
use distopt::backend::{Arena, select_backend};
use distopt::comm::{AllReduceMeanArgs, Communicator, MeanOrder, Subgroups, all_gather_f64};
use distopt::dtype::StorageFormat;
use serde_json::json;

use crate::args::BenchCommArgs;

/// The transport without distopt's layer: what the benchmark compares with.
pub trait RawTransport {
    /// Waits for every rank.
    fn barrier(&self) -> Result<(), Error>;
    /// The transport's own all-reduce (sum) of `send` into `recv`, or its movement of the same
    /// bytes.
    fn all_reduce(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error>;
    /// The transport's name ("MPI", "NATS"), the raw row's name and its JSON key.
    fn labels(&self) -> (&'static str, &'static str, &'static str);
}

/// MPI: `MPI_Allreduce` of the float32 values.
#[cfg(feature = "mpi")]
pub struct Mpi(pub Arc<distopt::comm::MpiWorld>);

#[cfg(feature = "mpi")]
impl RawTransport for Mpi {
    fn barrier(&self) -> Result<(), Error> {
        self.0.barrier();
        Ok(())
    }
    fn all_reduce(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        self.0.raw_all_reduce_sum_f32(send, recv)
    }
    fn labels(&self) -> (&'static str, &'static str, &'static str) {
        ("MPI", "raw MPI_Allreduce (sum)", "raw_mpi_all_reduce_ms")
    }
}

/// NATS: plain publishes moving the bytes of one reduction (shards to owners and back).
#[cfg(feature = "nats")]
pub struct Nats<'a> {
    /// The world, for its barrier.
    pub world: &'a distopt::comm::NatsWorld,
    /// The raw subjects.
    pub peer: distopt::comm::nats::RawPeer<'a>,
}

#[cfg(feature = "nats")]
impl RawTransport for Nats<'_> {
    fn barrier(&self) -> Result<(), Error> {
        self.world.barrier()
    }
    fn all_reduce(&self, send: &[f32], _recv: &mut [f32]) -> Result<(), Error> {
        self.peer.all_reduce_bytes(send.len() * 4).map(|_| ())
    }
    fn labels(&self) -> (&'static str, &'static str, &'static str) {
        ("NATS", "raw NATS pub/sub (same bytes)", "raw_nats_ms")
    }
}

/// `distopt bench comm ARGS` on every rank of `world`; the first rank prints.
pub fn run(
    args: BenchCommArgs,
    world: Arc<dyn Communicator>,
    raw_transport: &dyn RawTransport,
) -> Result<(), Error> {
    let (transport, raw_name, raw_key) = raw_transport.labels();
    let (elements, repeats, choice, as_json) =
        (args.elements, args.repeats, args.backend, args.json);
    let selection = select_backend(choice).block_on()?;
    let backend = selection.backend.clone();
    let size = world.world_size();
    let rank = world.local_ranks().start;
    let rank_len = elements.div_ceil(PARAM_ALIGN_ELEMENTS) * PARAM_ALIGN_ELEMENTS;
    let mut arena = backend.create_arena(
        StorageFormat::F32,
        1,
        rank_len,
        backend.chunk_len(rank_len, 1),
    )?;
    let values: Vec<f32> = (0..rank_len)
        .map(|i| {
            if i < elements {
                ((i % 251) as f32) * (rank + 1) as f32
            } else {
                0.0
            }
        })
        .collect();
    arena.write(0, 0, bytemuck::cast_slice(&values))?;
    let starts = ParamStarts(vec![0]);
    let bytes = (elements * 4) as u64;
    let send: Vec<f32> = values[..elements].to_vec();
    let mut recv = vec![0f32; elements];

    // The operation measured: the world's all-reduce-mean of the one parameter.
    let average = |arena: &mut Arena| {
        world.all_reduce_mean(
            backend.as_ref(),
            arena,
            AllReduceMeanArgs {
                groups: Subgroups::world(size),
                arith: StorageFormat::F32,
                starts: &starts,
                active: &[true],
                bytes_per_rank: bytes,
                order: MeanOrder::DivideThenSum,
            },
        )
    };
    // The first average must be the mean of the ranks' values.
    average(&mut arena)?;
    let check = pollster::block_on(arena.read_range(0, 0, elements.min(1024)))?;
    let scale = (1..=size).map(|r| r as f64 / size as f64).sum::<f64>();
    for (i, &word) in check.iter().enumerate() {
        let want = (i % 251) as f64 * scale;
        let got = f64::from(f32::from_bits(word));
        if (got - want).abs() > 1e-5 * want.abs().max(1.0) {
            return Err(Error::runtime(format!(
                "bench comm: element {i} averaged to {got}, expected {want}"
            )));
        }
    }

    let mut ours = Vec::with_capacity(repeats);
    let mut raw = Vec::with_capacity(repeats);
    let time_raw = |recv: &mut [f32]| -> Result<Duration, Error> {
        raw_transport.barrier()?;
        let start = Instant::now();
        raw_transport.all_reduce(&send, recv)?;
        Ok(start.elapsed())
    };
    let mut time_ours = || -> Result<Duration, Error> {
        raw_transport.barrier()?;
        let start = Instant::now();
        average(&mut arena)?;
        pollster::block_on(backend.synchronize())?;
        Ok(start.elapsed())
    };
    for round in 0..repeats + 2 {
        // Alternate which goes first, so that neither always finds the caches warm.
        let (raw_time, ours_time) = if round % 2 == 0 {
            let r = time_raw(&mut recv)?;
            (r, time_ours()?)
        } else {
            let o = time_ours()?;
            (time_raw(&mut recv)?, o)
        };
        if round >= 2 {
            raw.push(raw_time);
            ours.push(ours_time);
        }
    }
    // Each rank's medians; the job's time is the slowest rank's.
    let mine = vec![vec![ms(median(&mut ours)), ms(median(&mut raw))]];
    let all = all_gather_f64(world.as_ref(), &mine)?;
    if rank != 0 {
        return Ok(());
    }
    let ours_ms = all.iter().map(|t| t[0]).fold(0.0, f64::max);
    let raw_ms = all.iter().map(|t| t[1]).fold(0.0, f64::max);
    let overhead = (ours_ms / raw_ms - 1.0) * 100.0;
    let gbps = |ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
    let info = backend.info();
    if as_json {
        outln!(
            "{}",
            json!({
                "world_size": size,
                "elements": elements,
                "bytes": bytes,
                "backend": format!("{:?}", info.kind),
                "adapter": info.name,
                "repeats": repeats,
                "distopt_all_reduce_mean_ms": ours_ms,
                "transport": transport,
                raw_key: raw_ms,
                "overhead_percent": overhead,
            })
        );
    } else {
        outln!(
            "distopt bench comm: {size} {transport} processes, all-reduce-mean of {elements} float32 ({:.1} MiB) per rank, median of {repeats}, slowest rank\n\
             backend: {:?} ({})\n\
             distopt all_reduce_mean        {ours_ms:8.3} ms  {:6.2} GB/s\n\
             {raw_name:<30} {raw_ms:8.3} ms  {:6.2} GB/s\n\
             overhead                       {overhead:+7.1} %  (the division by the group size, the frames and checksums, the rank-order sum and, on a GPU, the staging through host memory)",
            bytes as f64 / (1 << 20) as f64,
            info.kind,
            info.name,
            gbps(ours_ms),
            gbps(raw_ms),
        );
    }
    Ok(())
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
