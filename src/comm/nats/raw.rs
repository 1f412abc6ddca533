//! The benchmark's peer: raw NATS publish/subscribe moving the bytes of one all-reduce in the
//! pattern [`NatsWorld`](super::NatsWorld)'s reductions use (each rank's shards to their owners,
//! each owner's shard back to every rank), with no frames, checksums, ordering or arithmetic.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::NatsWorld;
use super::link::Task;
use crate::comm::Communicator;
use crate::error::{Error, Result};

/// Raw subjects of every rank of a world, and the bytes received on this rank's.
pub struct RawPeer<'a> {
    world: &'a NatsWorld,
    subjects: Vec<String>,
    received: Arc<(Mutex<usize>, Condvar)>,
    /// The subscription (dropped with the peer).
    _task: Task,
}

impl NatsWorld {
    /// Subscribes every rank to a raw subject of its own (a collective: every rank calls it).
    ///
    /// # Errors
    /// A `RuntimeError` when the subscription fails, and those of
    /// [`Communicator::all_gather_bytes`].
    pub fn raw_peer(&self) -> Result<RawPeer<'_>> {
        let subject = format!("distopt.{}.raw.{}", self.run, self.rank);
        let received = Arc::new((Mutex::new(0usize), Condvar::new()));
        let counter = received.clone();
        let count = move |payload: Bytes| {
            let (bytes, arrived) = &*counter;
            *bytes.lock().unwrap_or_else(|e| e.into_inner()) += payload.len();
            arrived.notify_all();
        };
        let task = self.runtime.block_on(async {
            let task = self
                .link
                .subscribe(&subject, Box::new(count))
                .await
                .map_err(|e| self.transport_error("cannot subscribe", &e))?;
            self.link
                .flush()
                .await
                .map_err(|e| self.transport_error("cannot flush", &e))?;
            Ok::<_, Error>(task)
        })?;
        // Every rank subscribed before any publishes.
        self.all_gather_bytes(vec![Vec::new()])?;
        Ok(RawPeer {
            world: self,
            subjects: (0..self.size)
                .map(|r| format!("distopt.{}.raw.{r}", self.run))
                .collect(),
            received,
            _task: task,
        })
    }
}

impl RawPeer<'_> {
    /// Moves the bytes of one all-reduce of `bytes` bytes over the whole world: the time it took.
    ///
    /// # Errors
    /// A `RuntimeError` when publishing fails or the bytes do not arrive within the world's
    /// failure bound.
    pub fn all_reduce_bytes(&self, bytes: usize) -> Result<Duration> {
        let world = self.world;
        let (m, me) = (world.size, world.rank);
        let shard = |k: usize| k * bytes / m..(k + 1) * bytes / m;
        let payload = Bytes::from(vec![0u8; bytes]);
        let chunk = world.max_frame;
        let start = Instant::now();
        let publish = |to: usize, range: std::ops::Range<usize>| {
            world.runtime.block_on(async {
                let mut at = range.start;
                while at < range.end {
                    let end = (at + chunk).min(range.end);
                    world
                        .link
                        .publish(&self.subjects[to], payload.slice(at..end))
                        .await
                        .map_err(|e| world.transport_error("cannot publish", &e))?;
                    at = end;
                }
                world
                    .link
                    .flush()
                    .await
                    .map_err(|e| world.transport_error("cannot flush", &e))
            })
        };
        for k in (0..m).filter(|&k| k != me) {
            publish(k, shard(k))?;
        }
        self.wait_for(shard(me).len() * (m - 1))?;
        for k in (0..m).filter(|&k| k != me) {
            publish(k, shard(me))?;
        }
        self.wait_for(bytes - shard(me).len())?;
        Ok(start.elapsed())
    }

    /// Waits until `bytes` more have arrived, and takes them.
    fn wait_for(&self, bytes: usize) -> Result<()> {
        let (received, arrived) = &*self.received;
        let deadline = Instant::now() + self.world.bound;
        let mut got = received.lock().unwrap_or_else(|e| e.into_inner());
        while *got < bytes {
            if Instant::now() > deadline {
                return Err(Error::runtime(format!(
                    "raw NATS: {} of {bytes} bytes arrived within {:.1} s",
                    *got,
                    self.world.bound.as_secs_f64()
                )));
            }
            got = arrived
                .wait_timeout(got, Duration::from_millis(20))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *got -= bytes;
        Ok(())
    }
}
