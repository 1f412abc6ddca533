//! [`NatsOptions`]: how a process joins a run over NATS.

use std::time::Duration;

/// How a process joins a run (see [`NatsWorld::join`](super::NatsWorld::join)).
#[derive(Debug, Clone)]
pub struct NatsOptions {
    /// The server, `nats://HOST:PORT` (or `HOST:PORT`).
    pub url: String,
    /// The run's name: letters, digits, `-` and `_`.
    pub run: String,
    /// Ranks in the run (the target world size).
    pub ranks: usize,
    /// The rank to take; the lowest free one when `None`.
    pub rank: Option<usize>,
    /// How long to wait for all ranks to join.
    pub join_timeout: Duration,
    /// How long a rank may be silent before a collective waiting on it fails.
    pub failure_bound: Duration,
    /// The server's authentication token, when it asks for one.
    pub token: Option<String>,
    /// The run's secret, on a server with a user per run (`permissions.rs`,
    /// [`server_config`](super::server_config)): the password of the user named after the run.
    pub secret: Option<String>,
    /// A PEM file of the certificate authorities to trust for the server's TLS certificate
    /// (a server with a certificate of its own CA, say); TLS is then required. A `tls://` URL
    /// without it trusts the system's authorities.
    pub tls_ca: Option<std::path::PathBuf>,
    /// Join a running run (`distopt train --join`): take the rank of a process that left it
    /// (`rank`, or the lowest one outside its last membership), be admitted at its next sync
    /// point and healed there from a live rank, instead of forming a new run.
    pub join: bool,
}

impl NatsOptions {
    /// Options for run `run` of `ranks` ranks on the server at `url`, with the defaults: the
    /// lowest free rank, 60 s to join, a 5 s failure bound, no token.
    pub fn new(url: impl Into<String>, run: impl Into<String>, ranks: usize) -> NatsOptions {
        NatsOptions {
            url: url.into(),
            run: run.into(),
            ranks,
            rank: None,
            join_timeout: Duration::from_secs(60),
            failure_bound: Duration::from_secs(5),
            token: None,
            secret: None,
            tls_ca: None,
            join: false,
        }
    }
}
