//! Deadlines on an HTTP/2 connection, from the client's frames as they pass.
//!
//! Pingora hands an HTTP/2 connection to the `h2` crate, which has no deadline for a request
//! head or body. This scanner reads the frame headers of the client's half of the connection
//! (nine bytes each; payloads are counted, never decoded or changed) and knows, at any time:
//!
//! - whether a request head is in progress, and since when: from the first byte of a `HEADERS`
//!   frame to the end of the frame carrying `END_HEADERS` (with its `CONTINUATION`s); until the
//!   first head has completed, since the connection opened; and any frame header not yet
//!   complete counts as a head that may be starting;
//! - which streams still owe their request body, and its deadline: from the end of their head
//!   to a `DATA` (or trailing `HEADERS`) frame with `END_STREAM`, or an `RST_STREAM`.
//!
//! [`H2Out`] follows the server's frame headers as they are written: a stream the server resets
//! owes no body any more (it answered early; Pingora resets such a stream).
//!
//! [`H2Scan::deadline`] is the earliest of those; the stream wrapper ends the connection when
//! it passes. An idle connection (no open stream) is closed by Pingora's HTTP/2 idle timeout.

use crate::clock::Nanos;

const PREFACE_LEN: usize = 24;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// More streams owing a body than any well-behaved client opens (the server allows 100 at
/// once): a client past this is ending the connection.
const MAX_TRACKED_STREAMS: usize = 1024;

/// The largest header list the HTTP/2 layer takes, decoded (`SETTINGS_MAX_HEADER_LIST_SIZE`)
/// or as sent (a header block, HPACK never making one longer than the list it carries by
/// more than this counts): twice `server.max_header_bytes`, as an HTTP/1.1 head is read (the
/// edge stream), and 32 bytes for each field the caps let through and the four pseudo-fields
/// (h2 counts 32 a field where the caps count 4); at least Pingora's own 64 KiB. Under it, a
/// head over a cap reaches the request path's own check and is answered `431
/// headers_too_large` as problem+json; over it, the h2 crate refuses the stream (its bare 431)
/// or this scanner ends the connection, memory bounded either way.
pub(crate) fn header_ceiling(settings: &crate::config::Server) -> usize {
    let fields = settings.max_headers.saturating_add(4);
    settings
        .max_header_bytes
        .saturating_mul(2)
        .saturating_add(fields.saturating_mul(32))
        .max(64 * 1024)
}

/// The limits the scanner enforces, in ns.
#[derive(Clone, Copy, Debug)]
pub(crate) struct H2Limits {
    pub header_timeout: Nanos,
    pub body_timeout: Nanos,
    /// Bytes of one header block (HPACK-compressed, as sent): [`header_ceiling`].
    pub max_block_bytes: usize,
}

#[derive(Clone, Copy, Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    stream: u32,
    started: Nanos,
    end_stream: bool,
    bytes: usize,
}

/// A frame header read whole: its payload's length, and the frame.
fn frame_head(h: &[u8; 9]) -> (usize, Frame) {
    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
    let frame = Frame {
        kind: h[3],
        flags: h[4],
        stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
    };
    (len, frame)
}

/// The server's half of one HTTP/2 connection, followed frame header by frame header as it
/// is written (it starts with a frame: the server's preface is its `SETTINGS`): which streams
/// the server resets. Only lengths and headers are read, never a payload.
#[derive(Debug, Default)]
pub(crate) struct H2Out {
    head: [u8; 9],
    head_len: usize,
    payload_left: usize,
}

impl H2Out {
    /// Follow `bytes` written to the client, in order; each stream a `RST_STREAM` frame of
    /// the server's resets is handed to `reset`.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], mut reset: impl FnMut(u32)) {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                self.payload_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.head_len).min(bytes.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
            self.head_len += n;
            bytes = &bytes[n..];
            if self.head_len == 9 {
                self.head_len = 0;
                let (len, frame) = frame_head(&self.head);
                self.payload_left = len;
                if frame.kind == RST_STREAM {
                    reset(frame.stream);
                }
            }
        }
    }
}

/// The client's half of one HTTP/2 connection, followed frame by frame.
#[derive(Debug)]
pub(crate) struct H2Scan {
    preface_left: usize,
    head: [u8; 9],
    head_len: usize,
    frame_started: Nanos,
    /// The frame whose payload is being read, and how much of it is left.
    frame: Option<Frame>,
    payload_left: usize,
    block: Option<Block>,
    first_done: bool,
    /// Streams that owe their request body: (stream, deadline).
    bodies: Vec<(u32, Nanos)>,
}

impl Default for H2Scan {
    fn default() -> Self {
        Self::new()
    }
}

impl H2Scan {
    pub(crate) fn new() -> Self {
        Self {
            preface_left: PREFACE_LEN,
            head: [0; 9],
            head_len: 0,
            frame_started: 0,
            frame: None,
            payload_left: 0,
            block: None,
            first_done: false,
            bodies: Vec::new(),
        }
    }

    /// Follow `bytes` from the client, read at `now` (ns since the connection opened). An
    /// error names the limit broken; the connection must end.
    pub(crate) fn feed(
        &mut self,
        mut bytes: &[u8],
        now: Nanos,
        lim: &H2Limits,
    ) -> Result<(), &'static str> {
        while !bytes.is_empty() {
            if self.preface_left > 0 {
                let n = self.preface_left.min(bytes.len());
                self.preface_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            match self.frame {
                None => {
                    if self.head_len == 0 {
                        self.frame_started = now;
                    }
                    let n = (9 - self.head_len).min(bytes.len());
                    self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
                    self.head_len += n;
                    bytes = &bytes[n..];
                    if self.head_len == 9 {
                        self.head_len = 0;
                        let (len, frame) = frame_head(&self.head);
                        self.start(frame);
                        self.frame = Some(frame);
                        self.payload_left = len;
                        if len == 0 {
                            self.end(frame, now, lim)?;
                        }
                    }
                }
                Some(frame) => {
                    let n = self.payload_left.min(bytes.len());
                    self.payload_left -= n;
                    bytes = &bytes[n..];
                    if let Some(b) = self.block.as_mut() {
                        if matches!(frame.kind, HEADERS | CONTINUATION) {
                            b.bytes += n;
                            if b.bytes > lim.max_block_bytes {
                                return Err("a header block over twice server.max_header_bytes");
                            }
                        }
                    }
                    if self.payload_left == 0 {
                        self.end(frame, now, lim)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn start(&mut self, f: Frame) {
        if f.kind == HEADERS && self.block.is_none() {
            self.block = Some(Block {
                stream: f.stream,
                started: self.frame_started,
                end_stream: f.flags & END_STREAM != 0,
                bytes: 0,
            });
        }
    }

    fn end(&mut self, f: Frame, now: Nanos, lim: &H2Limits) -> Result<(), &'static str> {
        self.frame = None;
        match f.kind {
            HEADERS | CONTINUATION if f.flags & END_HEADERS != 0 => {
                let Some(b) = self.block.take() else {
                    return Ok(());
                };
                self.first_done = true;
                let owed = self.bodies.iter().position(|&(s, _)| s == b.stream);
                match (owed, b.end_stream) {
                    // Trailers end the body.
                    (Some(i), true) => {
                        self.bodies.swap_remove(i);
                    }
                    (Some(_), false) => {}
                    (None, true) => {}
                    (None, false) => {
                        if self.bodies.len() >= MAX_TRACKED_STREAMS {
                            return Err("too many streams owe a request body");
                        }
                        self.bodies.push((b.stream, now + lim.body_timeout));
                    }
                }
            }
            DATA if f.flags & END_STREAM != 0 => self.body_ended(f.stream),
            RST_STREAM => self.body_ended(f.stream),
            _ => {}
        }
        Ok(())
    }

    /// The server reset `stream` (it answered before the body came, and will read no more of
    /// it: Pingora resets such a stream): no body is owed on it any more.
    pub(crate) fn server_reset(&mut self, stream: u32) {
        self.body_ended(stream);
    }

    fn body_ended(&mut self, stream: u32) {
        if let Some(i) = self.bodies.iter().position(|&(s, _)| s == stream) {
            self.bodies.swap_remove(i);
        }
    }

    /// The earliest deadline in force, in ns since the connection opened: the head in
    /// progress (or the first one awaited), and every body owed.
    pub(crate) fn deadline(&self, lim: &H2Limits) -> Option<Nanos> {
        let mut d: Option<Nanos> = None;
        let mut at = |t: Nanos| d = Some(d.map_or(t, |d| d.min(t)));
        if !self.first_done {
            at(lim.header_timeout);
        }
        if let Some(b) = &self.block {
            at(b.started + lim.header_timeout);
        }
        if self.head_len > 0 {
            at(self.frame_started + lim.header_timeout);
        }
        for &(_, deadline) in &self.bodies {
            at(deadline);
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIM: H2Limits = H2Limits {
        header_timeout: 10,
        body_timeout: 30,
        max_block_bytes: 100,
    };

    fn frame(kind: u8, flags: u8, stream: u32, len: usize) -> Vec<u8> {
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend(std::iter::repeat_n(0u8, len));
        f
    }

    fn preface() -> Vec<u8> {
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()
    }

    #[test]
    fn the_first_head_is_due_header_timeout_after_the_connection_opens() {
        let mut s = H2Scan::new();
        assert_eq!(s.deadline(&LIM), Some(10));
        let mut bytes = preface();
        bytes.extend(frame(0x4, 0, 0, 6)); // SETTINGS
        s.feed(&bytes, 1, &LIM).unwrap();
        assert_eq!(s.deadline(&LIM), Some(10));
        // A complete GET head: nothing is due any more.
        s.feed(&frame(HEADERS, END_HEADERS | END_STREAM, 1, 20), 3, &LIM)
            .unwrap();
        assert_eq!(s.deadline(&LIM), None);
    }

    #[test]
    fn a_later_head_is_due_from_its_first_byte_even_when_dripped() {
        let mut s = H2Scan::new();
        let mut bytes = preface();
        bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, 20));
        s.feed(&bytes, 1, &LIM).unwrap();
        assert_eq!(s.deadline(&LIM), None);
        // The next head arrives one byte at a time from t = 100.
        let next = frame(HEADERS, 0, 3, 10);
        for (i, b) in next.iter().enumerate() {
            s.feed(&[*b], 100 + i as Nanos, &LIM).unwrap();
            assert_eq!(s.deadline(&LIM), Some(110), "byte {i}");
        }
        // A CONTINUATION ends it; the stream then owes its body (no END_STREAM).
        s.feed(&frame(CONTINUATION, END_HEADERS, 3, 5), 120, &LIM)
            .unwrap();
        assert_eq!(s.deadline(&LIM), Some(150));
    }

    #[test]
    fn a_stream_the_server_resets_owes_no_body() {
        let mut s = H2Scan::new();
        s.feed(&preface(), 0, &LIM).unwrap();
        // Stream 1's head, its body to come; stream 3's too.
        s.feed(&frame(HEADERS, END_HEADERS, 1, 5), 1, &LIM).unwrap();
        s.feed(&frame(HEADERS, END_HEADERS, 3, 5), 1, &LIM).unwrap();
        assert_eq!(s.deadline(&LIM), Some(1 + LIM.body_timeout));
        // The server answers stream 1 (a head, a body) and resets it, its frames written in
        // pieces of every size; stream 3 it leaves be.
        let mut written = Vec::new();
        written.extend(frame(0x4, 0, 0, 0)); // SETTINGS, its preface
        written.extend(frame(HEADERS, END_HEADERS, 1, 20));
        written.extend(frame(DATA, END_STREAM, 1, 300));
        written.extend(frame(RST_STREAM, 0, 1, 4));
        for piece in 1..=10 {
            let mut out = H2Out::default();
            let mut reset = Vec::new();
            for chunk in written.chunks(piece) {
                out.feed(chunk, |st| reset.push(st));
            }
            assert_eq!(reset, [1], "in pieces of {piece}");
        }
        s.server_reset(1);
        assert_eq!(s.bodies.len(), 1, "stream 3 still owes its body");
        s.server_reset(3);
        assert_eq!(s.deadline(&LIM), None);
    }

    #[test]
    fn a_body_is_owed_until_end_stream_or_reset() {
        let mut s = H2Scan::new();
        let mut bytes = preface();
        bytes.extend(frame(HEADERS, END_HEADERS, 1, 20));
        bytes.extend(frame(HEADERS, END_HEADERS, 3, 20));
        s.feed(&bytes, 5, &LIM).unwrap();
        assert_eq!(s.deadline(&LIM), Some(35));
        s.feed(&frame(DATA, 0, 1, 7), 6, &LIM).unwrap();
        assert_eq!(s.deadline(&LIM), Some(35), "7 bytes do not end the body");
        s.feed(&frame(DATA, END_STREAM, 1, 0), 7, &LIM).unwrap();
        assert_eq!(s.deadline(&LIM), Some(35), "stream 3 still owes");
        s.feed(&frame(RST_STREAM, 0, 3, 4), 8, &LIM).unwrap();
        assert_eq!(s.deadline(&LIM), None);
        // Trailers with END_STREAM end a body too.
        s.feed(&frame(HEADERS, END_HEADERS, 5, 4), 9, &LIM).unwrap();
        s.feed(&frame(HEADERS, END_HEADERS | END_STREAM, 5, 4), 10, &LIM)
            .unwrap();
        assert_eq!(s.deadline(&LIM), None);
    }

    #[test]
    fn a_header_block_over_the_cap_ends_the_connection() {
        let mut s = H2Scan::new();
        let mut bytes = preface();
        bytes.extend(frame(HEADERS, 0, 1, 60));
        s.feed(&bytes, 1, &LIM).unwrap();
        let e = s.feed(&frame(CONTINUATION, END_HEADERS, 1, 60), 2, &LIM);
        assert!(e.is_err());
    }

    #[test]
    fn split_anywhere_the_scan_is_the_same() {
        let mut all = preface();
        all.extend(frame(0x4, 0, 0, 6));
        all.extend(frame(HEADERS, END_HEADERS, 1, 20));
        all.extend(frame(DATA, 0, 1, 33));
        all.extend(frame(HEADERS, 0, 3, 9));
        for cut in 0..all.len() {
            let mut s = H2Scan::new();
            s.feed(&all[..cut], 1, &LIM).unwrap();
            s.feed(&all[cut..], 1, &LIM).unwrap();
            // Stream 1 owes its body (due 31); stream 3's head is in progress (due 11).
            assert_eq!(s.deadline(&LIM), Some(11), "cut at {cut}");
            assert_eq!(s.bodies, vec![(1, 31)]);
        }
    }
}
