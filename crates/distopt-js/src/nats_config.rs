//! The server side of runs over NATS: `natsServerConfig`, the `nats-server` configuration with a
//! user per run (`distopt::comm::server_config`, as `distopt nats-config` prints it), for a
//! JavaScript program that starts the server for its runs (the demo's `scripts/demo.mjs`).

use serde::Deserialize;
use tsify::Tsify;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, js, js_error};
use distopt::comm::{RunCredentials, ServerListen, server_config};
use distopt::error::Error;

/// A run a server admits (`natsServerConfig`).
#[derive(Deserialize, Tsify)]
pub struct NatsRun {
    /// The run's name (the user's name on the server): 1 to 64 letters, digits, `-` and `_`.
    run: String,
    /// The run's secret (the user's password; what a join link carries): 8 to 128 characters
    /// of `A-Z a-z 0-9 - . _ ~`.
    secret: String,
}

/// Where a server listens (`natsServerConfig`).
#[derive(Deserialize, Tsify)]
#[serde(rename_all = "camelCase")]
pub struct NatsListen {
    /// The client port, `HOST:PORT`.
    client: String,
    /// The WebSocket port for browsers, `HOST:PORT`, without TLS.
    #[tsify(optional)]
    websocket: Option<String>,
    /// JetStream's store folder (the server's default when omitted).
    #[tsify(optional)]
    store_dir: Option<String>,
}

/// A `nats-server` configuration admitting `runs`, each as a user of its own (named after the
/// run, its password the run's secret) allowed its run's subjects and key-value bucket only,
/// with JetStream on — what `distopt nats-config` prints. A rank of such a run connects with
/// `openPort({servers, run, secret})`. A `ValueError` for no run, a malformed name or secret, a
/// run named twice, or an address holding a quote.
#[wasm_bindgen(js_name = natsServerConfig)]
pub fn nats_server_config(
    #[wasm_bindgen(unchecked_param_type = "readonly NatsRun[]")] runs: JsValue,
    #[wasm_bindgen(unchecked_param_type = "NatsListen")] listen: JsValue,
) -> JsResult<String> {
    if !js_sys::Array::is_array(&runs) {
        return Err(js_error(Error::type_error(
            "natsServerConfig: runs must be an array of {run, secret}",
        )));
    }
    if !listen.is_object() {
        return Err(js_error(Error::type_error(
            "natsServerConfig: listen must be an object {client, websocket?, storeDir?}",
        )));
    }
    let runs: Vec<NatsRun> = read(runs, "runs")?;
    let listen: NatsListen = read(listen, "listen")?;
    let runs: Vec<RunCredentials> = runs
        .into_iter()
        .map(|r| RunCredentials {
            run: r.run,
            secret: r.secret,
        })
        .collect();
    let listen = ServerListen {
        client: listen.client,
        websocket: listen.websocket,
        store_dir: listen.store_dir,
    };
    js(server_config(&runs, &listen)
        .map_err(|e| Error::value(format!("natsServerConfig: {}", e.message()))))
}

/// Argument `what` read by serde: a wrong shape is a `TypeError` naming it and serde's reason.
fn read<T: serde::de::DeserializeOwned>(value: JsValue, what: &str) -> JsResult<T> {
    serde_wasm_bindgen::from_value(value).map_err(|e| {
        let reason = e.to_string();
        let reason = reason.strip_prefix("Error: ").unwrap_or(&reason);
        js_error(Error::type_error(format!(
            "natsServerConfig: {what}: {reason}"
        )))
    })
}
