//! `--world nats://HOST:PORT --run NAME --ranks R`: this process as one rank of a NATS run.

use crate::output::out;
use std::sync::Arc;

use distopt::Error;
#[cfg(not(feature = "nats"))]
use distopt::comm::Communicator;

use crate::args::{NatsConfigArgs, WorldArgs};

/// Joins the run `args` names, of `ranks` processes: the NATS world itself (`bench comm` also
/// needs its raw peer, `train` its count of forged frames).
///
/// # Errors
/// A `ValueError` when `--run` or `--ranks` is missing (or the build has no `nats` feature);
/// those of `NatsWorld::join`.
#[cfg(feature = "nats")]
pub fn join_nats(
    args: &WorldArgs,
    ranks: Option<usize>,
) -> Result<Arc<distopt::comm::NatsWorld>, Error> {
    use distopt::comm::{NatsOptions, NatsWorld};
    let url = args.world.clone().unwrap_or_default();
    let run = args
        .run
        .clone()
        .ok_or_else(|| Error::value("--world needs --run NAME: the run's name"))?;
    let ranks =
        ranks.ok_or_else(|| Error::value("--world needs --ranks R: the processes of the run"))?;
    let mut options = NatsOptions::new(url, run, ranks);
    options.rank = args.rank;
    options.token = args
        .token
        .clone()
        .or_else(|| std::env::var("DISTOPT_NATS_TOKEN").ok());
    options.secret = args
        .run_secret
        .clone()
        .or_else(|| std::env::var("DISTOPT_RUN_SECRET").ok());
    options.tls_ca = args.tls_ca.clone();
    options.join = args.join;
    NatsWorld::join(&options)
}

/// `distopt nats-config`: prints a server configuration with a user per run.
///
/// # Errors
/// A `ValueError` for a `--run` that is not `NAME:SECRET`, and those of
/// `distopt::comm::server_config`.
#[cfg(feature = "nats")]
pub fn nats_config(args: &NatsConfigArgs) -> Result<(), Error> {
    use distopt::comm::{RunCredentials, ServerListen, server_config};
    let runs = args
        .runs
        .iter()
        .map(|r| {
            let (run, secret) = r
                .split_once(':')
                .ok_or_else(|| Error::value(format!("--run {r}: expected NAME:SECRET")))?;
            Ok(RunCredentials {
                run: run.to_string(),
                secret: secret.to_string(),
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let listen = ServerListen {
        client: args.listen.clone(),
        websocket: args.websocket.clone(),
        store_dir: args.store_dir.clone(),
    };
    out!("{}", server_config(&runs, &listen)?);
    Ok(())
}

/// Without the `nats` feature there is no server configuration to write.
#[cfg(not(feature = "nats"))]
pub fn nats_config(_args: &NatsConfigArgs) -> Result<(), Error> {
    Err(Error::value(
        "distopt nats-config needs a build with the `nats` feature (cargo build -p distopt-cli --features nats)",
    ))
}

/// Without the `nats` feature, `--world` is an error that says how to build it.
#[cfg(not(feature = "nats"))]
pub fn join_nats(_args: &WorldArgs, _ranks: Option<usize>) -> Result<Arc<dyn Communicator>, Error> {
    Err(Error::value(
        "--world needs the `nats` feature: cargo build --release -p distopt-cli --features nats",
    ))
}
