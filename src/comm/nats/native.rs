//! The [`Link`] of a native process: async-nats, on the world's own tokio runtime.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use tokio::runtime::Handle;

use super::link::{
    Beat, Bucket, Deliver, Entry, Link, LinkError, LinkResult, Pending, Refused, Task, Update,
    Watch, Watched,
};
use super::options::NatsOptions;
use super::permissions;
use crate::error::{Error, Result};

/// A connection of async-nats, its tasks spawned on `handle`'s runtime.
pub(super) struct NativeLink {
    client: async_nats::Client,
    handle: Handle,
    /// Where the server's refusals go, once the world says ([`Link::report_refusals`]).
    refused: Arc<OnceLock<Refused>>,
}

impl NativeLink {
    /// Connects to `options.url` for run `options.run` (with the options' token, run secret
    /// and TLS authorities): a publish or subscription the server's permissions refuse is
    /// reported ([`Link::report_refusals`]). Runs on the world's runtime (inside its
    /// `block_on`).
    ///
    /// # Errors
    /// A `ValueError` for a TLS authorities file that does not exist; a `RuntimeError` when
    /// the server cannot be reached.
    pub(super) async fn connect(options: &NatsOptions) -> Result<NativeLink> {
        let run = options.run.as_str();
        let refused: Arc<OnceLock<Refused>> = Arc::default();
        let refusals = refused.clone();
        let mut connect = async_nats::ConnectOptions::new()
            .no_echo()
            .name(format!("distopt run {run}"))
            .custom_inbox_prefix(permissions::inbox_prefix(run))
            .event_callback(move |event| {
                let refusals = refusals.clone();
                async move {
                    // A publish or subscription the server's permissions refuse: the next
                    // collective fails naming it instead of waiting for the bound.
                    if let async_nats::Event::ServerError(e) = event
                        && let Some(report) = refusals.get()
                    {
                        report(&e.to_string());
                    }
                }
            });
        if let Some(secret) = &options.token {
            connect = connect.token(secret.clone());
        }
        if let Some(secret) = &options.secret {
            connect = connect.user_and_password(run.to_string(), secret.clone());
        }
        if let Some(ca) = &options.tls_ca {
            if !ca.is_file() {
                return Err(Error::value(format!(
                    "run '{run}': the TLS certificate authorities file {} does not exist",
                    ca.display()
                )));
            }
            connect = connect.add_root_certificates(ca.clone()).require_tls(true);
        }
        let client = connect.connect(options.url.as_str()).await.map_err(|e| {
            Error::runtime(format!(
                "run '{run}': cannot connect to {}: {e}",
                options.url
            ))
        })?;
        Ok(NativeLink {
            client,
            handle: Handle::current(),
            refused,
        })
    }
}

impl Link for NativeLink {
    fn report_refusals(&self, refused: Refused) {
        let _ = self.refused.set(refused);
    }

    fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
    }

    fn publish<'a>(&'a self, subject: &'a str, payload: Bytes) -> Pending<'a, LinkResult<()>> {
        Box::pin(async move {
            self.client
                .publish(subject.to_string(), payload)
                .await
                .map_err(LinkError::of)
        })
    }

    fn flush(&self) -> Pending<'_, LinkResult<()>> {
        Box::pin(async move { self.client.flush().await.map_err(LinkError::of) })
    }

    fn subscribe<'a>(
        &'a self,
        subject: &'a str,
        deliver: Deliver,
    ) -> Pending<'a, LinkResult<Task>> {
        Box::pin(async move {
            let mut subscription = self
                .client
                .subscribe(subject.to_string())
                .await
                .map_err(LinkError::of)?;
            let task = self.handle.spawn(async move {
                while let Some(message) = subscription.next().await {
                    deliver(message.payload);
                }
            });
            Ok(Task::new(move || task.abort()))
        })
    }

    fn heartbeat(&self, subject: String, period: Duration, beat: Beat) -> Task {
        let client = self.client.clone();
        let task = self.handle.spawn(async move {
            for n in 1.. {
                if let Some(frame) = beat(n)
                    && client.publish(subject.clone(), frame).await.is_ok()
                {
                    let _ = client.flush().await;
                }
                tokio::time::sleep(period).await;
            }
        });
        Task::new(move || task.abort())
    }

    fn bucket<'a>(
        &'a self,
        name: &'a str,
        create: bool,
    ) -> Pending<'a, LinkResult<Box<dyn Bucket>>> {
        Box::pin(async move {
            let js = jetstream::new(self.client.clone());
            let opened = match js.get_key_value(name).await {
                Ok(store) => Ok(store),
                Err(e) if !create => Err(LinkError::of(e)),
                Err(_) => match js
                    .create_key_value(kv::Config {
                        bucket: name.to_string(),
                        history: 1,
                        storage: jetstream::stream::StorageType::Memory,
                        ..Default::default()
                    })
                    .await
                {
                    Ok(store) => Ok(store),
                    // Another process created it meanwhile.
                    Err(first) => js
                        .get_key_value(name)
                        .await
                        .map_err(|_| LinkError::of(first)),
                },
            };
            opened.map(|store| {
                Box::new(NativeBucket {
                    store,
                    handle: self.handle.clone(),
                }) as Box<dyn Bucket>
            })
        })
    }
}

/// A JetStream key-value bucket of async-nats.
struct NativeBucket {
    store: kv::Store,
    handle: Handle,
}

impl Bucket for NativeBucket {
    fn get<'a>(&'a self, key: &'a str) -> Pending<'a, LinkResult<Option<Bytes>>> {
        Box::pin(async move { self.store.get(key).await.map_err(LinkError::of) })
    }

    fn entry<'a>(&'a self, key: &'a str) -> Pending<'a, LinkResult<Option<Entry>>> {
        Box::pin(async move {
            let entry = self.store.entry(key).await.map_err(LinkError::of)?;
            Ok(entry.map(|entry| Entry {
                deleted: entry.operation != kv::Operation::Put,
                value: entry.value,
            }))
        })
    }

    fn put<'a>(&'a self, key: &'a str, value: Bytes) -> Pending<'a, LinkResult<()>> {
        Box::pin(async move { written(self.store.put(key, value).await) })
    }

    fn create<'a>(&'a self, key: &'a str, value: Bytes) -> Pending<'a, LinkResult<()>> {
        Box::pin(async move { written(self.store.create(key, value).await) })
    }

    fn delete<'a>(&'a self, key: &'a str) -> Pending<'a, LinkResult<()>> {
        Box::pin(async move { self.store.delete(key).await.map_err(LinkError::of) })
    }

    fn watch<'a>(&'a self, pattern: &'a str) -> Pending<'a, LinkResult<Box<dyn Watch>>> {
        Box::pin(async move {
            let watch = self.store.watch(pattern).await.map_err(LinkError::of)?;
            Ok(Box::new(NativeWatch {
                watch: Some(watch),
                handle: self.handle.clone(),
            }) as Box<dyn Watch>)
        })
    }

    fn pause(&self, duration: Duration) -> Pending<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A put's or create's outcome, its revision dropped.
fn written<E: std::fmt::Display>(result: std::result::Result<u64, E>) -> LinkResult<()> {
    result.map(|_revision| ()).map_err(LinkError::of)
}

/// A watch of async-nats.
struct NativeWatch {
    /// `None` once dropped.
    watch: Option<kv::Watch>,
    handle: Handle,
}

/// An entry of the watch as an [`Update`].
fn update(entry: kv::Entry) -> Update {
    let value = (entry.operation == kv::Operation::Put).then_some(entry.value);
    Update {
        key: entry.key,
        value,
    }
}

impl Watch for NativeWatch {
    fn next_before(&mut self, deadline: Instant) -> Pending<'_, Watched> {
        Box::pin(async move {
            let Some(watch) = self.watch.as_mut() else {
                return Watched::Ended;
            };
            let deadline = tokio::time::Instant::from_std(deadline);
            match tokio::time::timeout_at(deadline, watch.next()).await {
                Err(_) => Watched::Quiet,
                Ok(Some(Ok(entry))) => Watched::Update(update(entry)),
                Ok(_) => Watched::Ended,
            }
        })
    }

    fn ready(&mut self) -> Option<Update> {
        match self.watch.as_mut()?.next().now_or_never() {
            Some(Some(Ok(entry))) => Some(update(entry)),
            _ => None,
        }
    }
}

impl Drop for NativeWatch {
    fn drop(&mut self) {
        // The watch's subscription unsubscribes through the client's runtime.
        let _runtime = self.handle.enter();
        drop(self.watch.take());
    }
}
