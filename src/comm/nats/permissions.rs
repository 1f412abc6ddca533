//! Isolation between runs on one server: a user per run, named after it, whose password is the
//! run's secret and whose permissions reach that run's subjects and key-value bucket only.
//!
//! A process of run `NAME` publishes on `distopt.NAME.>` (its own subjects and the common one),
//! writes the bucket `distopt_NAME` (`$KV.distopt_NAME.>` and the JetStream API calls about its
//! stream `KV_distopt_NAME`), and receives replies on an inbox of the run's own
//! (`_INBOX.distopt.NAME.>`). The server refuses anything else — another run's subjects or
//! bucket, or other clients' replies — so a client holding one run's secret can neither read
//! nor write another run. [`server_config`] writes a `nats-server` configuration with one such
//! user per run; `distopt nats-config` prints it.

use crate::error::{Error, Result};

/// What a run's user may publish and subscribe to (NATS subject patterns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPermissions {
    /// Subjects the run's processes publish to.
    pub publish: Vec<String>,
    /// Subjects the run's processes subscribe to.
    pub subscribe: Vec<String>,
}

/// The prefix of the reply subjects of run `run`'s processes.
pub(super) fn inbox_prefix(run: &str) -> String {
    format!("_INBOX.distopt.{run}")
}

/// The permissions of run `run`'s user.
///
/// # Errors
/// A `ValueError` for a run name that is not 1 to 64 letters, digits, `-` and `_`.
pub fn run_permissions(run: &str) -> Result<RunPermissions> {
    super::join::check_run_name(run)?;
    let bucket = super::join::bucket_name(run);
    let stream = format!("KV_{bucket}");
    Ok(RunPermissions {
        publish: vec![
            format!("distopt.{run}.>"),
            format!("$KV.{bucket}.>"),
            "$JS.API.INFO".into(),
            format!("$JS.API.STREAM.*.{stream}"),
            format!("$JS.API.STREAM.MSG.GET.{stream}"),
            format!("$JS.API.DIRECT.GET.{stream}"),
            format!("$JS.API.DIRECT.GET.{stream}.>"),
            format!("$JS.API.CONSUMER.*.{stream}"),
            format!("$JS.API.CONSUMER.*.{stream}.>"),
            // The flow-control replies of the membership agreement's watch of the bucket.
            format!("$JS.FC.{stream}.>"),
        ],
        subscribe: vec![
            format!("distopt.{run}.>"),
            format!("{}.>", inbox_prefix(run)),
        ],
    })
}

/// One run a server admits: its name and its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCredentials {
    /// The run's name (the user's name on the server).
    pub run: String,
    /// The run's secret (the user's password): what a join link carries.
    pub secret: String,
}

/// Where a server listens, for [`server_config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerListen {
    /// The client port, `HOST:PORT`.
    pub client: String,
    /// The WebSocket port for browsers, `HOST:PORT`, without TLS (put a TLS proxy or the
    /// server's `tls` block in front of it on the internet).
    pub websocket: Option<String>,
    /// JetStream's store folder (its default when `None`).
    pub store_dir: Option<String>,
}

fn check_secret(secret: &str) -> Result<()> {
    if secret.len() < 8
        || secret.len() > 128
        || !secret
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c))
    {
        return Err(Error::value(
            "a run's secret holds 8 to 128 letters, digits, '-', '.', '_' and '~' (it travels in join links)",
        ));
    }
    Ok(())
}

fn quoted(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    format!("[{}]", items.join(", "))
}

/// A `nats-server` configuration admitting `runs`, each as a user of its own whose
/// permissions are [`run_permissions`], with JetStream on.
///
/// # Errors
/// A `ValueError` when there is no run, a run's name or secret is malformed (secrets: 8 to 128
/// characters of `A-Z a-z 0-9 - . _ ~`), a run is named twice, or an address holds a quote.
pub fn server_config(runs: &[RunCredentials], listen: &ServerListen) -> Result<String> {
    if runs.is_empty() {
        return Err(Error::value(
            "a server configuration needs at least one run",
        ));
    }
    let addresses = [
        Some(&listen.client),
        listen.websocket.as_ref(),
        listen.store_dir.as_ref(),
    ];
    if addresses
        .iter()
        .flatten()
        .any(|a| a.contains(['"', '\\', '\n']))
    {
        return Err(Error::value(
            "an address or folder of the server holds a quote",
        ));
    }
    let mut users = Vec::with_capacity(runs.len());
    for (i, credentials) in runs.iter().enumerate() {
        check_secret(&credentials.secret)?;
        if runs[..i].iter().any(|r| r.run == credentials.run) {
            return Err(Error::value(format!(
                "run '{}' is named twice",
                credentials.run
            )));
        }
        let permissions = run_permissions(&credentials.run)?;
        users.push(format!(
            "    {{ user: \"{}\", password: \"{}\", permissions: {{ publish: {{ allow: {} }}, subscribe: {{ allow: {} }} }} }}",
            credentials.run,
            credentials.secret,
            quoted(&permissions.publish),
            quoted(&permissions.subscribe)
        ));
    }
    let mut config = format!(
        "# nats-server configuration written by distopt: one user per run\nlisten: \"{}\"\n",
        listen.client
    );
    match &listen.store_dir {
        Some(dir) => config += &format!("jetstream {{ store_dir: \"{dir}\" }}\n"),
        None => config += "jetstream {}\n",
    }
    if let Some(websocket) = &listen.websocket {
        config += &format!("websocket {{ listen: \"{websocket}\", no_tls: true }}\n");
    }
    config += &format!(
        "authorization {{\n  users = [\n{}\n  ]\n}}\n",
        users.join(",\n")
    );
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_permissions_name_its_own_subjects_and_bucket_only() {
        let p = run_permissions("alpha").unwrap();
        assert!(
            p.publish
                .iter()
                .all(|s| s.contains("alpha") || s == "$JS.API.INFO")
        );
        assert!(p.subscribe.iter().all(|s| s.contains(".alpha.")));
        assert_eq!(p.subscribe[1], "_INBOX.distopt.alpha.>");
        assert!(run_permissions("a.b").is_err());
    }

    #[test]
    fn a_config_refuses_a_weak_or_unsafe_secret_and_a_doubled_run() {
        let listen = ServerListen {
            client: "127.0.0.1:4222".into(),
            websocket: Some("127.0.0.1:8080".into()),
            store_dir: None,
        };
        let run = |run: &str, secret: &str| RunCredentials {
            run: run.into(),
            secret: secret.into(),
        };
        let config =
            server_config(&[run("a", "s3cret-a1"), run("b", "s3cret-b2")], &listen).unwrap();
        assert!(config.contains("user: \"b\", password: \"s3cret-b2\""));
        assert!(config.contains("websocket { listen: \"127.0.0.1:8080\", no_tls: true }"));
        for (runs, why) in [
            (vec![run("a", "short")], "8 to 128"),
            (vec![run("a", "with\"quote")], "8 to 128"),
            (
                vec![run("a", "s3cret-a1"), run("a", "s3cret-a2")],
                "named twice",
            ),
            (vec![], "at least one run"),
        ] {
            let e = server_config(&runs, &listen).unwrap_err();
            assert!(e.message().contains(why), "{}", e.message());
        }
    }
}
