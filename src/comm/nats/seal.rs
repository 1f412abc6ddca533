//! Ranks bound to their claims: each process of a run makes a fresh NKey (NATS's Ed25519 key
//! format) when it joins and writes its public half into its rank's claim beside its token
//! (`join.rs`); every frame it sends carries its signature of the frame's digest
//! ([`Frame::digest`]: BLAKE3 of the header's fields and the payload), and a receiver checks
//! it against the key in the sender's claim before the frame counts for anything — before it
//! is kept for a collective or marks its sender alive. A client of the run that publishes in
//! another rank's name (it can read the claims, but holds no rank's secret key) is detected:
//! its frames are dropped and counted ([`NatsWorld::forged_frames`](super::NatsWorld)), and
//! the genuine frames are summed as if it were not there. The run's membership statements in
//! its bucket (a rank's arrival at a sync point, the agreed live ranks) are sealed the same way
//! ([`Signer::seal_statement`]), so that no client can speak for a rank there either.

use nkeys::KeyPair;

use crate::comm::wire::{Frame, SEAL_BYTES};
use crate::error::{Error, Result};

/// This process's signing key.
pub(super) struct Signer {
    key: KeyPair,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({})", self.key.public_key())
    }
}

impl Signer {
    /// A fresh key from the operating system's random source (in wasm, the browser's or
    /// Node's `crypto.getRandomValues`).
    pub(super) fn new() -> Result<Signer> {
        let mut seed = [0u8; 32];
        getrandom::getrandom(&mut seed)
            .map_err(|e| Error::runtime(format!("no random source for a rank's key: {e}")))?;
        let key = KeyPair::new_from_raw(nkeys::KeyPairType::User, seed)
            .map_err(|e| Error::runtime(format!("cannot make a rank's key: {e}")))?;
        Ok(Signer { key })
    }

    /// The public key, as the claim carries it (an NKey: `U…`).
    pub(super) fn public_key(&self) -> String {
        self.key.public_key()
    }

    /// The seal of `statement` (bytes that say what they are, the run and the sync point
    /// included, so that a seal cannot be replayed for another statement).
    pub(super) fn seal_statement(&self, statement: &[u8]) -> [u8; SEAL_BYTES] {
        self.seal(blake3::hash(statement).as_bytes())
    }

    /// The seal of a frame whose digest is `digest`.
    pub(super) fn seal(&self, digest: &[u8; 32]) -> [u8; SEAL_BYTES] {
        let mut seal = [0; SEAL_BYTES];
        if let Ok(signature) = self.key.sign(digest) {
            seal.copy_from_slice(&signature);
        }
        seal
    }
}

/// Every rank's public key, from the claims, by rank.
pub(super) struct Keys {
    keys: Vec<KeyPair>,
    /// The same keys as the claims hold them.
    public: Vec<String>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keys({} ranks)", self.keys.len())
    }
}

impl Keys {
    /// The keys of `public` (one NKey per rank, in rank order), checked.
    ///
    /// # Errors
    /// A `RuntimeError` naming the rank whose claim holds no valid public key.
    pub(super) fn new(run: &str, public: &[String]) -> Result<Keys> {
        let keys = public
            .iter()
            .enumerate()
            .map(|(rank, key)| {
                KeyPair::from_public_key(key).map_err(|e| {
                    Error::runtime(format!(
                        "run '{run}': rank {rank}'s claim holds no valid public key ('{key}': {e})"
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Keys {
            keys,
            public: public.to_vec(),
        })
    }

    /// These keys with rank `rank`'s replaced by `key` (a process that joined as that rank).
    ///
    /// # Errors
    /// Those of [`Keys::new`].
    pub(super) fn replaced(&self, run: &str, rank: usize, key: &str) -> Result<Keys> {
        let mut public = self.public.clone();
        if let Some(slot) = public.get_mut(rank) {
            *slot = key.to_string();
        }
        Keys::new(run, &public)
    }

    /// Whether `seal` is rank `rank`'s seal of `statement` ([`Signer::seal_statement`]).
    pub(super) fn sealed_statement(&self, rank: usize, statement: &[u8], seal: &[u8]) -> bool {
        self.keys
            .get(rank)
            .is_some_and(|key| key.verify(blake3::hash(statement).as_bytes(), seal).is_ok())
    }

    /// Whether `seal` is the seal of `statement` by the holder of public key `key` (a claim's,
    /// before it is one of the run's keys).
    pub(super) fn sealed_by_key(key: &str, statement: &[u8], seal: &[u8]) -> bool {
        KeyPair::from_public_key(key)
            .is_ok_and(|key| key.verify(blake3::hash(statement).as_bytes(), seal).is_ok())
    }

    /// Whether `frame` is sealed by the rank it names as its sender.
    pub(super) fn sealed_by_sender(&self, frame: &Frame<'_>) -> bool {
        self.keys
            .get(frame.id.from as usize)
            .is_some_and(|key| key.verify(&frame.digest(), frame.seal).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::wire::{MessageId, frames, frames_sealed};

    fn id(from: u32) -> MessageId {
        MessageId {
            run: 7,
            epoch: 0,
            seq: 3,
            from,
            kind: 1,
        }
    }

    #[test]
    fn only_the_claimed_key_seals_a_rank_s_frames() {
        let (zero, one) = (Signer::new().unwrap(), Signer::new().unwrap());
        let keys = Keys::new("r", &[zero.public_key(), one.public_key()]).unwrap();
        let sealed = |signer: &Signer, from| {
            frames_sealed(&id(from), &[5; 300], 256, Vec::new, |d| signer.seal(d)).unwrap()
        };
        for bytes in sealed(&one, 1) {
            assert!(keys.sealed_by_sender(&Frame::parse(&bytes).unwrap()));
        }
        // Rank 0's key in rank 1's name, an unsealed frame, and a rank without a claim.
        for bytes in sealed(&zero, 1)
            .into_iter()
            .chain(frames(&id(1), &[5; 300], 256).unwrap())
            .chain(sealed(&zero, 2))
        {
            assert!(!keys.sealed_by_sender(&Frame::parse(&bytes).unwrap()));
        }
        // A sealed frame whose payload was changed (it carries no CRC-32: the seal is its
        // check): the seal no longer matches.
        let mut changed = sealed(&one, 1).remove(0);
        let last = changed.len() - 1;
        changed[last] ^= 1;
        let frame = Frame::parse(&changed).unwrap();
        assert!(!keys.sealed_by_sender(&frame));
    }

    #[test]
    fn a_statement_is_sealed_by_its_rank_only_and_for_itself_only() {
        let (zero, one) = (Signer::new().unwrap(), Signer::new().unwrap());
        let keys = Keys::new("r", &[zero.public_key(), one.public_key()]).unwrap();
        let seal = one.seal_statement(b"sync 3 at 1");
        assert!(keys.sealed_statement(1, b"sync 3 at 1", &seal));
        assert!(!keys.sealed_statement(0, b"sync 3 at 1", &seal));
        assert!(!keys.sealed_statement(1, b"sync 4 at 1", &seal));
        assert!(!keys.sealed_statement(2, b"sync 3 at 1", &seal));
        assert!(!keys.sealed_statement(1, b"sync 3 at 1", &seal[..63]));
    }

    #[test]
    fn a_claim_without_a_key_is_refused_naming_the_rank() {
        let e = Keys::new(
            "r",
            &[Signer::new().unwrap().public_key(), "nonsense".into()],
        )
        .unwrap_err();
        assert!(
            e.message()
                .starts_with("run 'r': rank 1's claim holds no valid public key"),
            "{}",
            e.message()
        );
    }
}
