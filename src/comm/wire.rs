//! The frames a networked world's ranks exchange: a message (one rank's contribution to one
//! collective) cut into frames under the transport's largest payload, each naming its run,
//! membership epoch, collective sequence number, sender and chunk, carrying its sender's
//! *seal* (a signature of its [`Frame::digest`], made by the networked world with the sending
//! rank's key) or, unsealed, a CRC-32 of itself; and the [`Assembler`] that puts one expected
//! message back together. This module computes the digest and carries the seal; who signs and who
//! checks is the world's business (`comm::nats`, NKeys).
//!
//! Nothing a peer sends is trusted: a frame is parsed ([`Frame::parse`]) before anything is
//! read from it, the sizes it declares are checked against each other, against the size
//! expected and against the memory budget before any buffer is allocated, and the assembled
//! message is handed over only once every chunk has arrived intact. A frame of another run, of
//! an older epoch or collective, or one already received is [`WireError::is_stale`]: a
//! receiver drops it. Any other defect is an error of the collective it belongs to. So a
//! malformed, resized, stale, out-of-order or duplicated frame is never summed into parameters.
//!
//! Layout (little-endian, [`HEADER_BYTES`] bytes, then the payload):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `DOPT` |
//! | 4 | version (3) |
//! | 5 | kind: what the message is, the caller's tag |
//! | 6..8 | reserved, 0 |
//! | 8..16 | run ([`run_id`] of the run's name) |
//! | 16..24 | membership epoch |
//! | 24..32 | collective sequence number |
//! | 32..36 | sender's rank |
//! | 36..40 | chunk index |
//! | 40..44 | chunk count |
//! | 44..48 | this chunk's payload bytes |
//! | 48..52 | the message's chunk length (every chunk but the last has it) |
//! | 52..60 | the whole message's bytes |
//! | 60..124 | seal: the sender's signature of the frame's [`Frame::digest`] (zeros unsealed) |
//! | 124..128 | unsealed: CRC-32 (IEEE) of bytes 0..124 and the payload; sealed: 0 |
//!
//! A sealed frame carries no CRC-32: its seal signs the BLAKE3 digest of the same bytes, which
//! whoever checks the seal computes anyway, so a damaged frame fails that check (version 2 computed
//! both, a pass over every byte sent and received that a WebAssembly rank, without a CRC
//! instruction, paid for at about 1.5 GB/s).

use std::fmt;

use crate::budget;
use crate::error::Error;

/// Bytes of a frame's header.
pub const HEADER_BYTES: usize = 128;
/// Bytes of a frame's seal (an Ed25519 signature).
pub const SEAL_BYTES: usize = 64;
/// Where the seal starts: the header's fields before it are what the digest covers.
const SEAL_AT: usize = 60;
/// Where the CRC-32 starts.
const CRC_AT: usize = SEAL_AT + SEAL_BYTES;
const MAGIC: [u8; 4] = *b"DOPT";
const VERSION: u8 = 3;

/// A stable 64-bit id of a run's name (FNV-1a): what frames carry instead of the name.
pub fn run_id(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Which message a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageId {
    /// [`run_id`] of the run.
    pub run: u64,
    /// The membership epoch the collective runs in.
    pub epoch: u64,
    /// The collective's sequence number within the epoch.
    pub seq: u64,
    /// The sending rank.
    pub from: u32,
    /// The caller's tag for what the message is (a contribution, a result, a broadcast, …).
    pub kind: u8,
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message {} of rank {} (epoch {}, collective {}, run {:#x})",
            self.kind, self.from, self.epoch, self.seq, self.run
        )
    }
}

/// What is wrong with a frame, naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// Not a frame of this protocol: too short, another magic or version, sizes that
    /// contradict each other, a reserved field set.
    Malformed(String),
    /// The CRC-32 does not match: the frame was damaged in transit.
    Checksum {
        /// The message the damaged frame says it belongs to.
        id: MessageId,
        /// Its chunk index.
        chunk: u32,
    },
    /// A frame of another run (dropped).
    OtherRun {
        /// The frame's message.
        id: MessageId,
    },
    /// A frame of an older epoch or an earlier collective (dropped).
    Stale {
        /// The frame's message.
        id: MessageId,
        /// The message awaited.
        expected: MessageId,
    },
    /// A chunk that has already arrived (dropped).
    Duplicate {
        /// The frame's message.
        id: MessageId,
        /// The chunk that arrived again.
        chunk: u32,
    },
    /// A frame of a later epoch or collective than the one being assembled, or from another
    /// rank or of another kind than expected: the peers disagree on the collective.
    OutOfOrder {
        /// The frame's message.
        id: MessageId,
        /// The message awaited.
        expected: MessageId,
    },
    /// The message's size differs from the size expected, or its frames disagree on it.
    Size(String),
    /// The message would not fit the memory budget (nothing was allocated).
    Budget(String),
}

impl WireError {
    /// Whether a receiver drops the frame and goes on waiting (another run's, an older
    /// epoch's or collective's, a chunk received already), rather than failing the collective.
    pub fn is_stale(&self) -> bool {
        matches!(
            self,
            WireError::OtherRun { .. } | WireError::Stale { .. } | WireError::Duplicate { .. }
        )
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Malformed(why) => write!(f, "a malformed frame: {why}"),
            WireError::Checksum { id, chunk } => {
                write!(f, "chunk {chunk} of {id} is damaged (CRC-32 mismatch)")
            }
            WireError::OtherRun { id } => write!(f, "{id} belongs to another run"),
            WireError::Stale { id, expected } => {
                write!(f, "{id} is older than the awaited {expected}")
            }
            WireError::Duplicate { id, chunk } => {
                write!(f, "chunk {chunk} of {id} arrived twice")
            }
            WireError::OutOfOrder { id, expected } => {
                write!(f, "{id} arrived while {expected} was awaited")
            }
            WireError::Size(why) | WireError::Budget(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for WireError {}

impl From<WireError> for Error {
    /// A `RuntimeError` saying what the frame was and what is wrong with it.
    fn from(e: WireError) -> Error {
        Error::runtime(e.to_string())
    }
}

/// One frame, parsed and checked ([`Frame::parse`]); `payload` borrows the received bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The message it belongs to.
    pub id: MessageId,
    /// Its index among the message's chunks.
    pub chunk: u32,
    /// The message's chunk count.
    pub chunks: u32,
    /// The message's chunk length: chunk `k` holds bytes `k * stride ..` of the message.
    pub stride: u32,
    /// The whole message's bytes.
    pub total: u64,
    /// This chunk of the message.
    pub payload: &'a [u8],
    /// The sender's seal (see [`Frame::digest`]).
    pub seal: &'a [u8; SEAL_BYTES],
    /// The header's fields the digest covers.
    fields: &'a [u8],
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn checksum(header: &[u8], payload: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header[..CRC_AT]);
    crc.update(payload);
    crc.finalize()
}

impl<'a> Frame<'a> {
    /// Reads a frame from `bytes` (a whole transport message), checking its magic, version,
    /// sizes and, unsealed, its CRC-32 before anything else is trusted. A sealed frame's bytes
    /// are checked by its seal ([`Frame::digest`]), which the caller must check before it uses them.
    ///
    /// # Errors
    /// [`WireError::Malformed`] or [`WireError::Checksum`].
    pub fn parse(bytes: &'a [u8]) -> Result<Frame<'a>, WireError> {
        let frame = Frame::parse_header(bytes)?;
        if frame.is_sealed() {
            // Sealed, its CRC field is 0: a set one is a damaged seal or field.
            if u32_at(bytes, CRC_AT) != 0 {
                return Err(WireError::Malformed(format!(
                    "chunk {} of {} is sealed and carries a CRC-32",
                    frame.chunk, frame.id
                )));
            }
        } else if checksum(bytes, frame.payload) != u32_at(bytes, CRC_AT) {
            return Err(WireError::Checksum {
                id: frame.id,
                chunk: frame.chunk,
            });
        }
        Ok(frame)
    }

    /// [`Frame::parse`] without the CRC-32, for bytes this process parsed (and so checked)
    /// before, as a receiver that keeps frames does when it reads them again.
    ///
    /// # Errors
    /// [`WireError::Malformed`].
    pub fn parse_header(bytes: &'a [u8]) -> Result<Frame<'a>, WireError> {
        let malformed = |why: String| Err(WireError::Malformed(why));
        if bytes.len() < HEADER_BYTES {
            return malformed(format!(
                "{} bytes, shorter than the {HEADER_BYTES}-byte header",
                bytes.len()
            ));
        }
        if bytes[0..4] != MAGIC {
            return malformed("not a distopt frame (no DOPT magic)".into());
        }
        if bytes[4] != VERSION {
            return malformed(format!(
                "protocol version {}, this build speaks {VERSION}",
                bytes[4]
            ));
        }
        if bytes[6..8] != [0, 0] {
            return malformed("reserved bytes are set".into());
        }
        let id = MessageId {
            run: u64_at(bytes, 8),
            epoch: u64_at(bytes, 16),
            seq: u64_at(bytes, 24),
            from: u32_at(bytes, 32),
            kind: bytes[5],
        };
        let (chunk, chunks) = (u32_at(bytes, 36), u32_at(bytes, 40));
        let (len, stride, total) = (u32_at(bytes, 44), u32_at(bytes, 48), u64_at(bytes, 52));
        let payload = &bytes[HEADER_BYTES..];
        if payload.len() != len as usize {
            return malformed(format!(
                "chunk {chunk} of {id} declares {len} payload bytes and carries {}",
                payload.len()
            ));
        }
        // The chunking must follow from the size: `chunks` chunks of `stride` bytes, the last
        // one holding the rest (an empty message is one empty chunk).
        let expected_chunks = total.div_ceil(u64::from(stride.max(1))).max(1);
        let start = u64::from(chunk) * u64::from(stride);
        let expected_len = u64::from(stride).min(total.saturating_sub(start));
        if stride == 0
            || u64::from(chunks) != expected_chunks
            || chunk >= chunks
            || u64::from(len) != expected_len
        {
            return malformed(format!(
                "chunk {chunk} of {chunks} of {id} carries {len} bytes, which does not fit a {total}-byte message in chunks of {stride}"
            ));
        }
        Ok(Frame {
            id,
            chunk,
            chunks,
            stride,
            total,
            payload,
            seal: bytes[SEAL_AT..CRC_AT].try_into().expect("64 bytes"),
            fields: &bytes[..SEAL_AT],
        })
    }

    /// Whether the frame carries a seal (unsealed frames' seal is zeros).
    pub fn is_sealed(&self) -> bool {
        is_seal(self.seal)
    }

    /// What the frame's seal signs: the BLAKE3 hash of its header's fields (run, epoch,
    /// collective, sender, chunk, sizes) and its payload. A seal that checks against the
    /// sender's key proves the frame is the sender's, as it sent it.
    pub fn digest(&self) -> [u8; 32] {
        digest(self.fields, self.payload)
    }
}

/// Whether `seal` is one (an unsealed frame's seal field is zeros).
fn is_seal(seal: &[u8; SEAL_BYTES]) -> bool {
    seal.iter().any(|&b| b != 0)
}

fn digest(fields: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(fields);
    hasher.update(payload);
    *hasher.finalize().as_bytes()
}

/// `payload` as the frames of message `id`, each at most `max_frame` bytes (the transport's
/// largest payload, say NATS's `max_payload`), in chunk order, unsealed (their seal is zeros:
/// see [`frames_sealed`]). An empty payload is one frame.
///
/// # Errors
/// A `ValueError` when `max_frame` leaves no room for payload after the header, or the message
/// needs more than 2³² chunks.
pub fn frames(
    id: &MessageId,
    payload: &[u8],
    max_frame: usize,
) -> crate::error::Result<Vec<Vec<u8>>> {
    frames_sealed(id, payload, max_frame, Vec::new, |_| [0; SEAL_BYTES])
}

/// [`frames`], each frame written into a buffer from `buffer` (cleared first: a sender that
/// keeps the buffers of the frames it sent reuses their memory) and sealed with `seal` of its
/// [`Frame::digest`] (the sender's signature).
///
/// # Errors
/// Those of [`frames`].
pub fn frames_sealed(
    id: &MessageId,
    payload: &[u8],
    max_frame: usize,
    mut buffer: impl FnMut() -> Vec<u8>,
    seal: impl Fn(&[u8; 32]) -> [u8; SEAL_BYTES],
) -> crate::error::Result<Vec<Vec<u8>>> {
    let framer = Framer::new(id, payload, max_frame)?;
    Ok((0..framer.chunks())
        .map(|chunk| framer.frame(chunk, buffer(), &seal))
        .collect())
}

/// The frames of one message, built one at a time: a sender can publish each as soon as it
/// is built, overlapping the next frame's copy and seal with the transport's write.
#[derive(Debug, Clone, Copy)]
pub struct Framer<'a> {
    id: MessageId,
    payload: &'a [u8],
    room: usize,
    chunks: u32,
}

impl<'a> Framer<'a> {
    /// The framing of `payload` as message `id` in frames of at most `max_frame` bytes.
    ///
    /// # Errors
    /// Those of [`frames`].
    pub fn new(
        id: &MessageId,
        payload: &'a [u8],
        max_frame: usize,
    ) -> crate::error::Result<Framer<'a>> {
        if max_frame <= HEADER_BYTES {
            return Err(Error::value(format!(
                "a frame of at most {max_frame} bytes has no room after its {HEADER_BYTES}-byte header"
            )));
        }
        let room = (max_frame - HEADER_BYTES).min(u32::MAX as usize);
        let chunks = payload.len().div_ceil(room).max(1);
        let chunks = u32::try_from(chunks).map_err(|_| {
            Error::value(format!(
                "a message of {} bytes needs {chunks} frames of {max_frame} bytes, more than 2^32",
                payload.len()
            ))
        })?;
        Ok(Framer {
            id: *id,
            payload,
            room,
            chunks,
        })
    }

    /// How many frames the message takes.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    /// Frame `chunk` (below [`Framer::chunks`]), written into `frame` (cleared first) and
    /// sealed with `seal` of its [`Frame::digest`].
    pub fn frame(
        &self,
        chunk: u32,
        mut frame: Vec<u8>,
        seal: impl Fn(&[u8; 32]) -> [u8; SEAL_BYTES],
    ) -> Vec<u8> {
        let (id, payload, room) = (&self.id, self.payload, self.room);
        let start = chunk as usize * room;
        let part = &payload[start.min(payload.len())..(start + room).min(payload.len())];
        frame.clear();
        frame.reserve_exact(HEADER_BYTES + part.len());
        frame.extend_from_slice(&MAGIC);
        frame.push(VERSION);
        frame.push(id.kind);
        frame.extend_from_slice(&[0, 0]);
        frame.extend_from_slice(&id.run.to_le_bytes());
        frame.extend_from_slice(&id.epoch.to_le_bytes());
        frame.extend_from_slice(&id.seq.to_le_bytes());
        frame.extend_from_slice(&id.from.to_le_bytes());
        frame.extend_from_slice(&chunk.to_le_bytes());
        frame.extend_from_slice(&self.chunks.to_le_bytes());
        frame.extend_from_slice(&(part.len() as u32).to_le_bytes());
        frame.extend_from_slice(&(room as u32).to_le_bytes());
        frame.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        let sealed = seal(&digest(&frame, part));
        frame.extend_from_slice(&sealed);
        frame.extend_from_slice(&[0; 4]);
        if !is_seal(&sealed) {
            let crc = checksum(&frame, part);
            frame[CRC_AT..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
        }
        frame.extend_from_slice(part);
        frame
    }
}

/// Puts one expected message back together from its frames, in any order.
#[derive(Debug)]
pub struct Assembler {
    expected: MessageId,
    /// The message's bytes when the receiver knows them; `None` takes the size the first frame
    /// declares (after the memory budget's check).
    size: Option<usize>,
    /// `(chunks, stride)` of the message, from its first frame.
    layout: Option<(u32, u32)>,
    received: Vec<bool>,
    missing: u32,
    data: Vec<u8>,
}

impl Assembler {
    /// Awaits message `expected` of exactly `size` bytes (both sides of a collective know the
    /// size of each contribution). The buffer is allocated when the first frame arrives, after
    /// the memory budget's check.
    pub fn new(expected: MessageId, size: usize) -> Assembler {
        Assembler {
            expected,
            size: Some(size),
            layout: None,
            received: Vec::new(),
            missing: 0,
            data: Vec::new(),
        }
    }

    /// Awaits message `expected` of a size only its sender knows (a serialized object): the
    /// size its first frame declares is checked against the memory budget, and every later
    /// frame must declare the same.
    pub fn any_size(expected: MessageId) -> Assembler {
        Assembler {
            expected,
            size: None,
            layout: None,
            received: Vec::new(),
            missing: 0,
            data: Vec::new(),
        }
    }

    /// The message awaited.
    pub fn expected(&self) -> &MessageId {
        &self.expected
    }

    /// Takes one frame: `Ok(Some(message))` when it was the last one missing, `Ok(None)` when
    /// more are awaited. A refused frame changes nothing.
    ///
    /// # Errors
    /// A [`WireError`] saying why the frame is refused: [`WireError::is_stale`] ones are to be
    /// dropped; the others fail the collective.
    pub fn accept(&mut self, frame: &Frame<'_>) -> Result<Option<Vec<u8>>, WireError> {
        if !self.take(frame, None)? {
            return Ok(None);
        }
        Ok(Some(std::mem::take(&mut self.data)))
    }

    /// [`Assembler::accept`] writing the message into `dest` (exactly the expected size, the
    /// same buffer for every frame of the message) instead of a buffer of its own: `Ok(true)`
    /// when the frame was the last one missing. Every byte of `dest` is written once the
    /// message is complete (each chunk's length follows from the size and is checked), so
    /// `dest` may hold anything before — a buffer kept between messages needs no clearing.
    ///
    /// # Errors
    /// Those of [`Assembler::accept`], and a size error when `dest` is not of the expected size
    /// (or the assembler was made with [`Assembler::any_size`]).
    pub fn accept_into(&mut self, frame: &Frame<'_>, dest: &mut [u8]) -> Result<bool, WireError> {
        self.take(frame, Some(dest))
    }

    /// Checks `frame` against the message awaited and copies its payload to `dest`, or to the
    /// assembler's buffer without one: true when the message is complete.
    fn take(&mut self, frame: &Frame<'_>, dest: Option<&mut [u8]>) -> Result<bool, WireError> {
        let (id, expected) = (frame.id, self.expected);
        if id.run != expected.run {
            return Err(WireError::OtherRun { id });
        }
        if (id.epoch, id.seq) < (expected.epoch, expected.seq) {
            return Err(WireError::Stale { id, expected });
        }
        if id != expected {
            return Err(WireError::OutOfOrder { id, expected });
        }
        let size = match self.size {
            Some(size) if frame.total != size as u64 => {
                return Err(WireError::Size(format!(
                    "{id} has {} bytes, {size} were expected",
                    frame.total
                )));
            }
            Some(size) => size,
            None => usize::try_from(frame.total)
                .map_err(|_| WireError::Budget(format!("{id} declares {} bytes", frame.total)))?,
        };
        match self.layout {
            Some((chunks, stride)) if (frame.chunks, frame.stride) != (chunks, stride) => {
                return Err(WireError::Size(format!(
                    "chunk {} of {id} says {} chunks of {} bytes, its first frame said {chunks} of {stride}",
                    frame.chunk, frame.chunks, frame.stride
                )));
            }
            Some(_) => {}
            None if dest.is_some() => {
                let len = dest.as_deref().map_or(0, <[u8]>::len);
                if self.size != Some(len) {
                    return Err(WireError::Size(format!(
                        "{id} has {size} bytes, the buffer awaiting it {len}"
                    )));
                }
                self.received = vec![false; frame.chunks as usize];
                self.missing = frame.chunks;
                self.layout = Some((frame.chunks, frame.stride));
            }
            None => {
                let what = id.to_string();
                budget::check(size, &what)
                    .map_err(|e| WireError::Budget(e.message().to_string()))?;
                let mut data = Vec::new();
                data.try_reserve_exact(size).map_err(|_| {
                    WireError::Budget(format!("not enough memory for the {size} bytes of {what}"))
                })?;
                data.resize(size, 0);
                self.size = Some(size);
                self.data = data;
                self.received = vec![false; frame.chunks as usize];
                self.missing = frame.chunks;
                self.layout = Some((frame.chunks, frame.stride));
            }
        }
        let k = frame.chunk as usize;
        if self.received[k] {
            return Err(WireError::Duplicate {
                id,
                chunk: frame.chunk,
            });
        }
        let start = k * frame.stride as usize;
        let data = match dest {
            Some(dest) => dest,
            None => &mut self.data[..],
        };
        data[start..start + frame.payload.len()].copy_from_slice(frame.payload);
        self.received[k] = true;
        self.missing -= 1;
        if self.missing > 0 {
            return Ok(false);
        }
        self.layout = None;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> MessageId {
        MessageId {
            run: run_id("test run"),
            epoch: 3,
            seq: 17,
            from: 2,
            kind: 1,
        }
    }

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + 7) as u8).collect()
    }

    /// A frame with any header fields (and a valid CRC-32), to forge what a peer could send.
    fn forged(
        id: &MessageId,
        chunk: u32,
        chunks: u32,
        stride: u32,
        total: u64,
        part: &[u8],
    ) -> Vec<u8> {
        let mut f = frames(id, &[], 1024).unwrap().remove(0);
        f.truncate(HEADER_BYTES);
        f[36..40].copy_from_slice(&chunk.to_le_bytes());
        f[40..44].copy_from_slice(&chunks.to_le_bytes());
        f[44..48].copy_from_slice(&(part.len() as u32).to_le_bytes());
        f[48..52].copy_from_slice(&stride.to_le_bytes());
        f[52..60].copy_from_slice(&total.to_le_bytes());
        let crc = checksum(&f, part);
        f[CRC_AT..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
        f.extend_from_slice(part);
        f
    }

    fn assemble(
        expected: MessageId,
        size: usize,
        frames: &[Vec<u8>],
    ) -> Result<Vec<u8>, WireError> {
        let mut a = Assembler::new(expected, size);
        let mut out = None;
        for f in frames {
            let frame = Frame::parse(f)?;
            if let Some(message) = a.accept(&frame)? {
                assert!(out.is_none(), "a message completed twice");
                out = Some(message);
            }
        }
        Ok(out.expect("every frame was given"))
    }

    #[test]
    fn messages_round_trip_in_any_chunk_order() {
        for n in [0, 1, 3, 4, 63, 64, 65, 1000, 4096] {
            for max_frame in [
                HEADER_BYTES + 1,
                HEADER_BYTES + 4,
                HEADER_BYTES + 36,
                4096 + HEADER_BYTES,
                1 << 20,
            ] {
                let data = payload(n);
                let mut fs = frames(&id(), &data, max_frame).unwrap();
                let room = max_frame - HEADER_BYTES;
                assert_eq!(fs.len(), n.div_ceil(room).max(1), "n {n}, max {max_frame}");
                assert!(fs.iter().all(|f| f.len() <= max_frame));
                assert_eq!(assemble(id(), n, &fs).unwrap(), data);
                fs.reverse();
                assert_eq!(assemble(id(), n, &fs).unwrap(), data);
                if fs.len() > 2 {
                    let mid = fs.len() / 2;
                    fs.swap(0, mid);
                    assert_eq!(assemble(id(), n, &fs).unwrap(), data);
                }
            }
        }
        assert!(
            frames(&id(), &[1], HEADER_BYTES).is_err(),
            "no room for a payload"
        );
    }

    #[test]
    fn a_message_assembles_into_a_kept_buffer_whatever_it_held() {
        let data = payload(1000);
        let mut fs = frames(&id(), &data, 100 + HEADER_BYTES).unwrap();
        fs.reverse();
        // A buffer kept from an earlier message: every byte is overwritten.
        let mut dest = vec![0xAB; 1000];
        let mut a = Assembler::new(id(), 1000);
        let done: Vec<bool> = fs
            .iter()
            .map(|f| a.accept_into(&Frame::parse(f).unwrap(), &mut dest).unwrap())
            .collect();
        assert_eq!(done.iter().filter(|&&d| d).count(), 1);
        assert!(done[done.len() - 1]);
        assert_eq!(dest, data);
        // A duplicate of a chunk already written is refused, the buffer unchanged.
        let mut a = Assembler::new(id(), 1000);
        let first = Frame::parse(&fs[0]).unwrap();
        assert!(!a.accept_into(&first, &mut dest).unwrap());
        let e = a.accept_into(&first, &mut dest).unwrap_err();
        assert!(matches!(e, WireError::Duplicate { .. }), "{e}");
        assert_eq!(dest, data);
        // A buffer of another size, or an assembler of any size, is refused before a write.
        let mut short = vec![0u8; 999];
        let e = Assembler::new(id(), 1000)
            .accept_into(&first, &mut short)
            .unwrap_err();
        assert!(e.to_string().contains("the buffer awaiting it 999"), "{e}");
        let e = Assembler::any_size(id())
            .accept_into(&first, &mut dest)
            .unwrap_err();
        assert!(matches!(e, WireError::Size(_)), "{e}");
        assert!(short.iter().all(|&b| b == 0));
    }

    #[test]
    fn every_damaged_or_truncated_byte_is_refused() {
        let fs = frames(&id(), &payload(40), HEADER_BYTES + 16).unwrap();
        assert_eq!(fs.len(), 3);
        for f in &fs {
            for at in 0..f.len() {
                for bit in [0x01u8, 0x80] {
                    let mut bad = f.clone();
                    bad[at] ^= bit;
                    assert!(Frame::parse(&bad).is_err(), "byte {at} ^ {bit:#x} passed");
                }
            }
            for len in 0..f.len() {
                assert!(
                    Frame::parse(&f[..len]).is_err(),
                    "a prefix of {len} bytes passed"
                );
            }
            let mut longer = f.clone();
            longer.push(0);
            assert!(matches!(
                Frame::parse(&longer),
                Err(WireError::Malformed(_))
            ));
        }
        let mut other = fs[0].clone();
        other[0] = b'X';
        assert!(
            matches!(Frame::parse(&other), Err(WireError::Malformed(m)) if m.contains("magic"))
        );
    }

    #[test]
    fn a_sealed_frame_carries_no_crc_and_a_set_one_is_malformed() {
        let sealed = frames_sealed(&id(), &payload(40), HEADER_BYTES + 16, Vec::new, |_| {
            [7; SEAL_BYTES]
        })
        .unwrap();
        for f in &sealed {
            assert_eq!(u32_at(f, CRC_AT), 0);
            let frame = Frame::parse(f).unwrap();
            assert!(frame.is_sealed());
            // A damaged payload parses: the seal over its digest is what catches it.
            let mut bad = f.clone();
            *bad.last_mut().unwrap() ^= 1;
            assert_ne!(Frame::parse(&bad).unwrap().digest(), frame.digest());
            let mut crc = f.clone();
            crc[CRC_AT] = 1;
            assert!(
                matches!(Frame::parse(&crc), Err(WireError::Malformed(m)) if m.contains("sealed"))
            );
        }
    }

    #[test]
    fn chunkings_that_contradict_the_size_are_malformed() {
        let id = id();
        // Claims 2 chunks of 8 for a 9-byte message but carries 5 bytes in the last one.
        let f = forged(&id, 1, 2, 8, 9, &[0; 5]);
        assert!(matches!(Frame::parse(&f), Err(WireError::Malformed(_))));
        // Chunk index past the count, a zero stride, a chunk count that does not follow.
        for f in [
            forged(&id, 2, 2, 8, 9, &[0; 1]),
            forged(&id, 0, 1, 0, 0, &[]),
            forged(&id, 0, 3, 8, 9, &[0; 8]),
        ] {
            assert!(
                matches!(Frame::parse(&f), Err(WireError::Malformed(_))),
                "{f:?}"
            );
        }
        // A well-formed empty message.
        let f = forged(&id, 0, 1, 8, 0, &[]);
        assert_eq!(Frame::parse(&f).unwrap().payload, &[] as &[u8]);
    }

    #[test]
    fn frames_of_other_runs_epochs_collectives_and_ranks_are_told_apart() {
        let data = payload(100);
        let ok = frames(&id(), &data, HEADER_BYTES + 40).unwrap();
        let of = |change: fn(&mut MessageId)| {
            let mut other = id();
            change(&mut other);
            frames(&other, &data, HEADER_BYTES + 40).unwrap().remove(0)
        };
        // (how the frame's message differs, whether the frame is stale)
        type Case = (fn(&mut MessageId), bool);
        let cases: [Case; 7] = [
            (|m| m.run = run_id("another run"), true),
            (|m| m.epoch -= 1, true),
            (|m| m.seq -= 1, true),
            (|m| m.epoch += 1, false),
            (|m| m.seq += 1, false),
            (|m| m.from = 0, false),
            (|m| m.kind = 9, false),
        ];
        for (change, stale) in cases {
            let frame_bytes = of(change);
            let frame = Frame::parse(&frame_bytes).unwrap();
            let mut a = Assembler::new(id(), data.len());
            let error = a.accept(&frame).unwrap_err();
            assert_eq!(error.is_stale(), stale, "{error}");
            assert!(matches!(
                error,
                WireError::OtherRun { .. } | WireError::Stale { .. } | WireError::OutOfOrder { .. }
            ));
            // Refused: the assembler still completes the awaited message.
            for f in &ok[..ok.len() - 1] {
                assert_eq!(a.accept(&Frame::parse(f).unwrap()).unwrap(), None);
            }
            let last = Frame::parse(ok.last().unwrap()).unwrap();
            assert_eq!(a.accept(&last).unwrap(), Some(data.clone()));
        }
        let message = format!(
            "{}",
            Assembler::new(id(), 100)
                .accept(&Frame::parse(&of(|m| m.seq += 1)).unwrap())
                .unwrap_err()
        );
        assert!(
            message.contains("rank 2") && message.contains("collective 18"),
            "{message}"
        );
    }

    #[test]
    fn duplicates_and_resized_messages_are_refused_and_change_nothing() {
        let data = payload(100);
        let fs = frames(&id(), &data, HEADER_BYTES + 40).unwrap();
        let mut a = Assembler::new(id(), data.len());
        assert_eq!(a.accept(&Frame::parse(&fs[0]).unwrap()).unwrap(), None);
        let again = a.accept(&Frame::parse(&fs[0]).unwrap()).unwrap_err();
        assert!(matches!(again, WireError::Duplicate { chunk: 0, .. }) && again.is_stale());
        // The same message cut into other chunks: its frames disagree with the first one.
        let recut = frames(&id(), &data, HEADER_BYTES + 30).unwrap();
        let e = a.accept(&Frame::parse(&recut[1]).unwrap()).unwrap_err();
        assert!(matches!(e, WireError::Size(_)) && !e.is_stale(), "{e}");
        for f in &fs[1..fs.len() - 1] {
            assert_eq!(a.accept(&Frame::parse(f).unwrap()).unwrap(), None);
        }
        assert_eq!(
            a.accept(&Frame::parse(fs.last().unwrap()).unwrap())
                .unwrap(),
            Some(data)
        );
        // Another size than the one expected.
        let e = Assembler::new(id(), 99)
            .accept(&Frame::parse(&fs[0]).unwrap())
            .unwrap_err();
        assert!(
            matches!(e, WireError::Size(ref m) if m.contains("100 bytes, 99 were expected")),
            "{e}"
        );
    }

    #[test]
    fn a_message_beyond_the_memory_budget_is_refused_before_any_allocation() {
        // The last chunk of a message just over the budget: its header is consistent, only
        // its size is too large.
        let stride = 1u32 << 31;
        let total = (budget::limit() as u64 / u64::from(stride) + 1) * u64::from(stride) + 8;
        let chunks = u32::try_from(total.div_ceil(u64::from(stride))).unwrap();
        let f = forged(&id(), chunks - 1, chunks, stride, total, &[7; 8]);
        let frame = Frame::parse(&f).unwrap();
        let before = budget::in_use();
        let e = Assembler::new(id(), total as usize)
            .accept(&frame)
            .unwrap_err();
        assert!(matches!(e, WireError::Budget(_)), "{e}");
        assert_eq!(budget::in_use(), before);
        assert_eq!(Error::from(e).kind(), crate::error::ErrorKind::RuntimeError);
    }

    #[test]
    fn random_messages_round_trip() {
        let mut rng = crate::rng::SplitMix64::from_state(0x0001_f00d);
        for _ in 0..200 {
            let n = rng.below(3000);
            let max_frame = HEADER_BYTES + 1 + rng.below(600);
            let data: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            let mut fs = frames(&id(), &data, max_frame).unwrap();
            rng.shuffle(&mut fs);
            assert_eq!(
                assemble(id(), n, &fs).unwrap(),
                data,
                "n {n}, max {max_frame}"
            );
        }
    }
}
