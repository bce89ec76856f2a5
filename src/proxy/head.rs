//! Request-head handling: pure functions of a request head, unit-tested here.
//!
//! - [`check_framing`]: one `Host`, one `Content-Length`, no transfer coding but `chunked`
//!   (what Pingora leaves to us);
//! - [`check_size`]: the request line and header fields within `server.max_header_bytes` and
//!   `server.max_headers` (431);
//! - [`client`]: the client's address (the peer, or from a trusted proxy's `X-Forwarded-For`);
//! - [`strip_upgrade`] and [`dropped`]: no protocol upgrade, and none of the fields that claim a
//!   client address, host, scheme, port, original URL or method ([`is_claim`]), ever reach the
//!   upstream;
//! - [`declared_length`] and [`framed_as`]: the body's declared length, and whether the client's
//!   own framing can be kept for a checked body;
//! - [`auth_header`]: the `Authorization` fields, for the policy;
//! - [`RequestIds`]: a well-formed incoming `X-Request-Id`, or a generated one;
//! - [`forwarded_for`]: the `X-Forwarded-For` sent upstream;
//! - [`upstream_target`]: the path and query sent upstream, and whether they need rewriting.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::http::RequestHeader;
use pingora::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora::{Error, ErrorType, Result};

use crate::config::Server;
use crate::policy::authenticate::AuthHeader;
use crate::policy::client::Client;
use crate::policy::{Code, Refusal};

pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Requests whose framing or target a server could read two ways. (Pingora itself refuses
/// differing `Content-Length`s, two `Host`s and non-chunked transfer codings with a bare 400,
/// and reads `Transfer-Encoding` + `Content-Length` as chunked and then closes the connection,
/// per RFC 9112 section 6.3, before any filter runs.)
pub(crate) fn check_framing(req: &RequestHeader) -> std::result::Result<(), Refusal> {
    let h = &req.headers;
    if !h.contains_key(HOST) && req.uri.authority().is_none() {
        return Err(Refusal::new(Code::BadRequest, "the request has no Host"));
    }
    if h.get_all(CONTENT_LENGTH).iter().count() > 1 {
        return Err(Refusal::new(
            Code::BadRequest,
            "the request has more than one Content-Length",
        ));
    }
    // Pingora accepts any list that ends in `chunked` (`gzip, chunked`, `chunked, chunked`);
    // an upstream might read those differently. Only plain `chunked` passes.
    let mut te = h.get_all(TRANSFER_ENCODING).iter();
    if let Some(v) = te.next() {
        if te.next().is_some() || !v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked") {
            return Err(Refusal::new(
                Code::BadRequest,
                "the only transfer coding accepted is chunked",
            ));
        }
    }
    Ok(())
}

/// The request line and header fields within `server.max_header_bytes` and
/// `server.max_headers`; over either, `431 headers_too_large`. The size is `raw` when the
/// head's bytes on the wire are known (HTTP/1.1), else counted as HTTP/1.1 would write it
/// (`name: value` and CRLF per field).
pub(crate) fn check_size(
    req: &RequestHeader,
    raw: Option<usize>,
    limits: &Server,
) -> std::result::Result<(), Refusal> {
    let fields = req.headers.len();
    let bytes = raw.unwrap_or_else(|| {
        // "METHOD target HTTP/1.1\r\n", the fields, and the final CRLF.
        let line = req.method.as_str().len() + req.raw_path().len() + 12;
        req.headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>()
            + line
    });
    if fields > limits.max_headers {
        return Err(Refusal::new(
            Code::HeadersTooLarge,
            format!("more than {} header fields", limits.max_headers),
        ));
    }
    if bytes > limits.max_header_bytes {
        return Err(Refusal::new(
            Code::HeadersTooLarge,
            format!(
                "the request line and header fields are over {} bytes",
                limits.max_header_bytes
            ),
        ));
    }
    Ok(())
}

/// The client of a request that came from `peer` (see [`crate::policy::client`]).
pub(crate) fn client(
    peer: Option<&PeerAddr>,
    headers: &HeaderMap,
    limits: &Server,
) -> Option<Client> {
    let PeerAddr::Inet(peer) = peer? else {
        return None;
    };
    if limits.trusted_proxies.is_empty() {
        return Some(Client {
            ip: peer.ip(),
            forwarded_at: None,
        });
    }
    let xff = headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .map(HeaderValue::as_bytes);
    Some(crate::policy::client::client(
        peer.ip(),
        xff,
        &limits.trusted_proxies,
    ))
}

/// Remove a protocol upgrade request (WebSocket, h2c): the request goes on as plain HTTP, and
/// Pingora never treats its answer as a switch to a tunnel.
pub(crate) fn strip_upgrade(req: &mut RequestHeader) {
    if req.headers.contains_key(UPGRADE) {
        req.remove_header(&UPGRADE);
    }
}

/// Whether a header field is a claim the gateway never forwards (unless the operator lets it
/// through, `upstream.pass_headers`). Proxies and frameworks behind the gateway trust fields
/// that say who the client is, which host, scheme or port it called, which URL or method it
/// "really" asked for; a client could write any of them. One rule, by the words of the name
/// (split at `-`, compared lower-case), rather than a list of vendors' spellings. The name is
/// read as the servers behind the gateway read it: CGI, WSGI and Rack map `_` and `-` to one
/// variable (`HTTP_X_FORWARDED_HOST`), so `_` counts as `-` (Puma's CVE-2024-45614), and a
/// leading `HTTP-` is read past as well. Claims:
///
/// - `Forwarded` (RFC 7239) and every `Forwarded-*`, and every `X-Forwarded-*` but
///   `X-Forwarded-For` (which the gateway writes itself, ending with the client it decided on);
/// - any field whose last word is `addr` or `address`, or ends in `ip` or `ipv6`
///   (`True-Client-IP`, `CF-Connecting-IP`, `CF-Connecting-IPv6`, `X-ClientIP`,
///   `X-Azure-ClientIP`, `Client-IP`, `WL-Proxy-Client-IP`, `X-Remote-Addr`, …);
/// - any `X-` field with one of the words `ip`, `addr`, `address`, `real`, `host`, `server`,
///   `proto`, `protocol`, `scheme`, `port`, `ssl`, `https`, `url`, `uri`, `path`, `prefix`,
///   `original`, `rewrite`, `method`, `override`, `envoy` (`X-Real-IP`, `X-Host`,
///   `X-Original-Host`, `X-Url-Scheme`, `X-Original-URL`, `X-Rewrite-URL`, `X-Original-URI`,
///   `X-HTTP-Method-Override`, `X-Envoy-Original-Path`, …);
/// - `Proxy` (httpoxy, CVE-2016-5385: CGI's `HTTP_PROXY` is the outgoing proxy of many
///   clients), `Script-Name`, `Request-URI` and `Destination` (WebDAV's target), with or
///   without `X-`; `Front-End-Https`;
/// - a spelling of a field the gateway writes (`X-Forwarded-For`, `X-Request-Id`) other than
///   the gateway's own (`X_Forwarded_For`, `HTTP-X-Forwarded-For`): a server that maps names
///   to variables would read the client's in place of the gateway's.
///
/// `X-Request-Id` and `X-Forwarded-For` as the gateway writes them pass, and so does every
/// other field.
pub(crate) fn is_claim(name: &str) -> bool {
    // Runs for every field of every request: lengths and suffixes first, no string searchers.
    let b = name.as_bytes();
    if !b.contains(&b'_') {
        return claim_of(b);
    }
    let read: Vec<u8> = as_servers_read(b).collect();
    claim_of(&read) || is_own(&read)
}

/// A field's name as CGI, WSGI and Rack servers read it: `_` as `-`.
pub(crate) fn as_servers_read(name: &[u8]) -> impl Iterator<Item = u8> + '_ {
    name.iter().map(|&c| if c == b'_' { b'-' } else { c })
}

/// Fields the gateway writes on every request it forwards.
fn is_own(name: &[u8]) -> bool {
    matches!(name, b"x-forwarded-for" | b"x-request-id")
}

/// [`is_claim`] of a name with `-` for `_`.
fn claim_of(b: &[u8]) -> bool {
    if let Some(rest) = b.strip_prefix(b"http-") {
        if claim_of(rest) || is_own(rest) {
            return true;
        }
    }
    let last = b.rsplit(|&c| c == b'-').next().unwrap_or(b);
    // An address, in any vendor's spelling: the last word.
    if last.ends_with(b"ip") || last.ends_with(b"ipv6") || matches!(last, b"addr" | b"address") {
        return true;
    }
    let bare = b.strip_prefix(b"x-").unwrap_or(b);
    if matches!(
        bare,
        b"proxy" | b"script-name" | b"request-uri" | b"destination"
    ) {
        return true;
    }
    match b.strip_prefix(b"x-") {
        Some(rest) => is_x_claim(rest),
        None => b == b"forwarded" || b.starts_with(b"forwarded-") || b == b"front-end-https",
    }
}

/// [`is_claim`] for an `X-` field, `rest` its name after `x-`.
fn is_x_claim(rest: &[u8]) -> bool {
    if rest == b"request-id" {
        // The gateway's own field, on every request.
        return false;
    }
    if let Some(f) = rest.strip_prefix(b"forwarded") {
        return f != b"-for";
    }
    let mut word = 0;
    for (i, &c) in rest.iter().enumerate() {
        if c == b'-' {
            if is_claim_word(&rest[word..i]) {
                return true;
            }
            word = i + 1;
        }
    }
    is_claim_word(&rest[word..])
}

/// A word of an `X-` field's name that makes it a claim (see [`is_claim`]).
fn is_claim_word(w: &[u8]) -> bool {
    // By length first: at most a few comparisons for any word.
    match w.len() {
        2 => w == b"ip",
        3 => matches!(w, b"ssl" | b"url" | b"uri"),
        4 => matches!(w, b"addr" | b"real" | b"host" | b"port" | b"path"),
        5 => matches!(w, b"proto" | b"https" | b"envoy"),
        6 => matches!(w, b"server" | b"scheme" | b"prefix" | b"method"),
        7 => matches!(w, b"address" | b"rewrite"),
        8 => matches!(w, b"protocol" | b"original" | b"override"),
        _ => false,
    }
}

/// The fields of `headers` that [`is_claim`] keeps from the upstream, but those named in
/// `pass` (lower case).
pub(crate) fn dropped(headers: &HeaderMap, pass: &[String]) -> Vec<HeaderName> {
    headers
        .keys()
        .filter(|n| is_claim(n.as_str()) && !pass.iter().any(|p| p == n.as_str()))
        .cloned()
        .collect()
}

/// The body length the request declares, if it does.
pub(crate) fn declared_length(h: &HeaderMap) -> std::result::Result<Option<u64>, Refusal> {
    match h.get(CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| Refusal::new(Code::BadRequest, "the Content-Length is not a number")),
    }
}

/// Whether a request's own framing already says exactly `n` bytes: no `Transfer-Encoding`, and
/// its one `Content-Length` (two are refused earlier) is `n` in plain decimal, as Tollgate
/// would write it. Then a checked body goes upstream under the client's own header.
pub(crate) fn framed_as(h: &HeaderMap, n: usize) -> bool {
    !h.contains_key(TRANSFER_ENCODING)
        && h.get(CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() == itoa::Buffer::new().format(n).as_bytes())
}

/// What the request carried in `Authorization`.
pub(crate) fn auth_header(headers: &HeaderMap) -> AuthHeader<'_> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    match (values.next(), values.next()) {
        (None, _) => AuthHeader::Missing,
        (Some(v), None) => AuthHeader::One(v.as_bytes()),
        _ => AuthHeader::Many,
    }
}

/// Request ids: the client's when it is well-formed (`[A-Za-z0-9._:-]{1,128}`), otherwise
/// generated from a per-process random seed and a counter.
#[derive(Debug)]
pub(crate) struct RequestIds {
    seed: u64,
    counter: AtomicU64,
}

impl Default for RequestIds {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestIds {
    pub(crate) fn new() -> Self {
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Self {
            seed,
            counter: AtomicU64::new(0),
        }
    }

    /// The id of a request with these headers: its own field when well-formed (the same bytes,
    /// not a copy), else a new one.
    pub(crate) fn of(&self, headers: &HeaderMap) -> HeaderValue {
        if let Some(v) = headers.get(X_REQUEST_ID) {
            let b = v.as_bytes();
            let ok = !b.is_empty()
                && b.len() <= 128
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b':'));
            if ok {
                return v.clone();
            }
        }
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        hex_id(self.seed, n)
    }
}

/// A generated request id: 32 lower-case hex digits, the process's random seed then a counter
/// (`{seed:016x}{n:016x}`, without `fmt`: this runs for every request).
fn hex_id(seed: u64, n: u64) -> HeaderValue {
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&seed.to_be_bytes());
    raw[8..].copy_from_slice(&n.to_be_bytes());
    let mut id = [0u8; 32];
    hex::encode_to_slice(raw, &mut id).expect("32 digits for 16 bytes");
    HeaderValue::from_bytes(&id).expect("hex digits are a header value")
}

/// A request id as text, for logs (ids are checked to be visible ASCII, so this is the id).
pub(crate) fn id_str(id: &HeaderValue) -> &str {
    id.to_str().unwrap_or("-")
}

/// `X-Forwarded-For` for the upstream: the entries that came before the client's, then the
/// client's address. From an untrusted peer (the client itself) every entry came before it;
/// from a trusted proxy, the entries the proxies added after the client's are dropped, so the
/// last entry is always the client Tollgate decided on. No client (a Unix socket): what came.
pub(crate) fn forwarded_for(prior: &HeaderMap, client: Option<&Client>) -> Result<HeaderValue> {
    let mut v: Vec<u8> = Vec::with_capacity(48);
    match client.and_then(|c| c.forwarded_at) {
        None => {
            for p in prior.get_all(X_FORWARDED_FOR) {
                v.extend_from_slice(p.as_bytes());
                v.extend_from_slice(b", ");
            }
        }
        Some(at) => {
            let entries = prior
                .get_all(X_FORWARDED_FOR)
                .iter()
                .flat_map(|p| p.as_bytes().split(|&b| b == b','))
                .map(<[u8]>::trim_ascii)
                .take(at);
            for e in entries {
                v.extend_from_slice(e);
                v.extend_from_slice(b", ");
            }
        }
    }
    match client.map(|c| c.ip) {
        Some(std::net::IpAddr::V4(ip)) => {
            let mut n = itoa::Buffer::new();
            for (i, o) in ip.octets().into_iter().enumerate() {
                if i > 0 {
                    v.push(b'.');
                }
                v.extend_from_slice(n.format(o).as_bytes());
            }
        }
        Some(ip) => v.extend_from_slice(ip.to_string().as_bytes()),
        // Keep what came (without the trailing ", ").
        None => v.truncate(v.len().saturating_sub(2)),
    }
    header_value(Bytes::from(v))
}

/// A header value built without a copy (the bytes are still checked).
pub(crate) fn header_value(b: Bytes) -> Result<HeaderValue> {
    HeaderValue::from_maybe_shared(b)
        .map_err(|_| Error::explain(ErrorType::InternalError, "not a header value"))
}

/// The path and query to send upstream for `req`, admitted to `path` (normalized, in the
/// catalogue's spelling) with the upstream's `base_path` in front — or `None` when the request
/// target can go as it came.
///
/// As it came is only right when nothing changes: no base path, the path decided on is the
/// request's own, and the request line's raw bytes are exactly that path and query (not the
/// absolute form `POST http://host/v2/...`). Pingora then sends the request line's own bytes.
pub(crate) fn upstream_target(req: &RequestHeader, base_path: &str, path: &str) -> Option<String> {
    let as_it_came = base_path.is_empty()
        && path == req.uri.path()
        && req
            .uri
            .path_and_query()
            .is_some_and(|pq| pq.as_str().as_bytes() == req.raw_path());
    if as_it_came {
        return None;
    }
    let mut target = String::with_capacity(base_path.len() + path.len() + 16);
    target.push_str(base_path);
    target.push_str(path);
    if let Some(q) = req.uri.query() {
        target.push('?');
        target.push_str(q);
    }
    Some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, target: &str, headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build(method, target.as_bytes(), Some(headers.len())).unwrap();
        for (n, v) in headers {
            r.append_header(n.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn the_target_goes_as_it_came_only_when_nothing_changes() {
        let r = request("GET", "/v2/client/getChats?a=1&b=%20", &[]);
        assert_eq!(upstream_target(&r, "", "/v2/client/getChats"), None);
        let r = request("POST", "/v2/sendMessage/", &[]);
        assert_eq!(upstream_target(&r, "", "/v2/sendMessage/"), None);
    }

    #[test]
    fn the_target_is_rewritten_when_the_path_the_base_or_the_form_changes() {
        // Re-spelt (case, trailing slash, decoded escape): the catalogue's spelling, query kept.
        let r = request("GET", "/V2/Client/getChats?c=3", &[]);
        assert_eq!(
            upstream_target(&r, "", "/v2/client/getChats").as_deref(),
            Some("/v2/client/getChats?c=3")
        );
        let r = request("POST", "/v2/sendMessage", &[]);
        assert_eq!(
            upstream_target(&r, "", "/v2/sendMessage/").as_deref(),
            Some("/v2/sendMessage/")
        );
        // A base path goes in front.
        let r = request("GET", "/v2/client/getChats?a=1", &[]);
        assert_eq!(
            upstream_target(&r, "/provider", "/v2/client/getChats").as_deref(),
            Some("/provider/v2/client/getChats?a=1")
        );
        // The absolute form becomes the origin form.
        let r = request("GET", "http://gateway.test/v2/client/getChats?q=2", &[]);
        assert_eq!(
            upstream_target(&r, "", "/v2/client/getChats").as_deref(),
            Some("/v2/client/getChats?q=2")
        );
    }

    #[test]
    fn framing_needs_a_host_and_one_content_length() {
        assert!(check_framing(&request("GET", "/v2/x", &[("Host", "a")])).is_ok());
        let code = |r: &RequestHeader| check_framing(r).unwrap_err().code;
        assert_eq!(code(&request("GET", "/v2/x", &[])), Code::BadRequest);
        let two = request(
            "POST",
            "/v2/x",
            &[
                ("Host", "a"),
                ("Content-Length", "2"),
                ("Content-Length", "2"),
            ],
        );
        assert_eq!(code(&two), Code::BadRequest);
    }

    #[test]
    fn declared_lengths_are_numbers_or_refused() {
        let h = |v: &str| {
            request("POST", "/", &[("Content-Length", v)])
                .headers
                .clone()
        };
        assert_eq!(declared_length(&h("12")), Ok(Some(12)));
        assert_eq!(declared_length(&h("0012")), Ok(Some(12)));
        assert_eq!(declared_length(&HeaderMap::new()), Ok(None));
        assert_eq!(
            declared_length(&h("twelve")).unwrap_err().code,
            Code::BadRequest
        );
    }

    #[test]
    fn authorization_is_missing_one_or_many() {
        let h = |vs: &[&str]| {
            let pairs: Vec<(&str, &str)> = vs.iter().map(|v| ("Authorization", *v)).collect();
            request("GET", "/", &pairs).headers.clone()
        };
        assert!(matches!(auth_header(&h(&[])), AuthHeader::Missing));
        assert!(matches!(
            auth_header(&h(&["Bearer a"])),
            AuthHeader::One(b"Bearer a")
        ));
        assert!(matches!(
            auth_header(&h(&["Bearer a", "Bearer a"])),
            AuthHeader::Many
        ));
    }

    #[test]
    fn request_ids_keep_a_well_formed_one_and_generate_otherwise() {
        let ids = RequestIds::new();
        let h = |v: &str| request("GET", "/", &[("X-Request-Id", v)]).headers.clone();
        assert_eq!(ids.of(&h("abc-123_x.y:z")), "abc-123_x.y:z");
        assert_eq!(id_str(&ids.of(&h("abc-123_x.y:z"))), "abc-123_x.y:z");
        let long = "a".repeat(129);
        for bad in ["a b", "é", long.as_str()] {
            let id = ids.of(&HeaderMap::new());
            let got = ids.of(&h(bad));
            assert_ne!(got, bad);
            assert_eq!(got.len(), 32);
            assert_ne!(got, id, "each generated id is new");
        }
    }

    #[test]
    fn generated_request_ids_are_the_seed_then_the_counter_in_hex() {
        for (seed, n) in [
            (0, 0),
            (1, 2),
            (u64::MAX, 0x0123_4567_89ab_cdef),
            (0xdead_beef, 42),
        ] {
            assert_eq!(
                hex_id(seed, n).as_bytes(),
                format!("{seed:016x}{n:016x}").as_bytes()
            );
        }
    }

    #[test]
    fn a_checked_body_keeps_its_framing_only_when_it_is_exact() {
        let h = |pairs: &[(HeaderName, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(k.clone(), HeaderValue::from_static(v));
            }
            m
        };
        assert!(framed_as(&h(&[(CONTENT_LENGTH, "152")]), 152));
        assert!(framed_as(&h(&[(CONTENT_LENGTH, "0")]), 0));
        assert!(!framed_as(&h(&[(CONTENT_LENGTH, "0152")]), 152));
        assert!(!framed_as(&h(&[(CONTENT_LENGTH, "151")]), 152));
        assert!(!framed_as(&h(&[]), 152));
        assert!(!framed_as(
            &h(&[(CONTENT_LENGTH, "152"), (TRANSFER_ENCODING, "chunked")]),
            152
        ));
        assert!(!framed_as(&h(&[(TRANSFER_ENCODING, "chunked")]), 152));
    }

    fn peer(ip: &str) -> Client {
        Client {
            ip: ip.parse().unwrap(),
            forwarded_at: None,
        }
    }

    #[test]
    fn forwarded_for_appends_the_client_to_what_came() {
        let mut h = HeaderMap::new();
        let got = |h: &HeaderMap, c: Option<&Client>| {
            forwarded_for(h, c).unwrap().to_str().unwrap().to_string()
        };
        assert_eq!(got(&h, Some(&peer("192.0.2.10"))), "192.0.2.10");
        assert_eq!(got(&h, Some(&peer("2001:db8::1"))), "2001:db8::1");
        assert_eq!(got(&h, None), "");
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("203.0.113.9"));
        h.append(
            X_FORWARDED_FOR,
            HeaderValue::from_static("198.51.100.7, 10.0.0.1"),
        );
        assert_eq!(
            got(&h, Some(&peer("192.0.2.10"))),
            "203.0.113.9, 198.51.100.7, 10.0.0.1, 192.0.2.10"
        );
        assert_eq!(got(&h, None), "203.0.113.9, 198.51.100.7, 10.0.0.1");
        for ip in ["0.0.0.0", "255.255.255.255", "10.200.3.40"] {
            assert_eq!(got(&HeaderMap::new(), Some(&peer(ip))), ip);
        }
        // From a trusted proxy: the client was entry 1; what the proxies added after it goes.
        let via_proxy = Client {
            ip: "198.51.100.7".parse().unwrap(),
            forwarded_at: Some(1),
        };
        assert_eq!(got(&h, Some(&via_proxy)), "203.0.113.9, 198.51.100.7");
    }

    #[test]
    fn only_plain_chunked_is_a_transfer_coding() {
        let ok = request(
            "POST",
            "/v2/x",
            &[("Host", "a"), ("Transfer-Encoding", " Chunked ")],
        );
        assert!(check_framing(&ok).is_ok());
        for bad in [
            vec![("Transfer-Encoding", "gzip, chunked")],
            vec![("Transfer-Encoding", "chunked, chunked")],
            vec![("Transfer-Encoding", "identity")],
            vec![
                ("Transfer-Encoding", "chunked"),
                ("Transfer-Encoding", "chunked"),
            ],
        ] {
            let mut h = vec![("Host", "a")];
            h.extend(bad.iter().copied());
            let r = request("POST", "/v2/x", &h);
            assert_eq!(
                check_framing(&r).unwrap_err().code,
                Code::BadRequest,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn heads_over_the_caps_are_431() {
        let limits = tollgate_core::testing::TestConfig::new()
            .server(|s| {
                s.max_header_bytes = 1024;
                s.max_headers = 4;
            })
            .parse()
            .server;
        let fields = |n: usize| {
            let names: Vec<String> = (0..n).map(|i| format!("x-f{i}")).collect();
            let pairs: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
            request("GET", "/v2/x", &pairs)
        };
        assert!(check_size(&fields(4), None, &limits).is_ok());
        assert_eq!(
            check_size(&fields(5), None, &limits).unwrap_err().code,
            Code::HeadersTooLarge
        );
        // The head's own size on the wire, when known, is what counts.
        assert!(check_size(&fields(1), Some(1024), &limits).is_ok());
        assert!(check_size(&fields(1), Some(1025), &limits).is_err());
        // "GET /v2/x HTTP/1.1" is 22 bytes with its CRLF and the final CRLF; a field of 1000
        // bytes of value makes 1011 with its name: 1033 in all.
        let long = "v".repeat(1000);
        assert!(check_size(
            &request("GET", "/v2/x", &[("x-a", &long[..990])]),
            None,
            &limits
        )
        .is_ok());
        let r = request("GET", "/v2/x", &[("x-a", &long)]);
        assert_eq!(
            check_size(&r, None, &limits).unwrap_err().code,
            Code::HeadersTooLarge
        );
    }

    #[test]
    fn upgrades_and_re_routing_fields_never_reach_the_upstream() {
        let mut r = request(
            "GET",
            "/v2/x",
            &[
                ("Upgrade", "websocket"),
                ("X-Original-URL", "/v2/settings/webhook/set"),
                ("X-HTTP-Method-Override", "DELETE"),
                ("Forwarded", "for=1.2.3.4"),
                ("X-Real-IP", "1.2.3.4"),
                ("X-Request-Id", "keep-me"),
            ],
        );
        strip_upgrade(&mut r);
        assert!(!r.headers.contains_key(UPGRADE));
        let mut gone: Vec<String> = dropped(&r.headers, &[])
            .iter()
            .map(|n| n.as_str().to_string())
            .collect();
        gone.sort();
        assert_eq!(
            gone,
            [
                "forwarded",
                "x-http-method-override",
                "x-original-url",
                "x-real-ip"
            ]
        );
        // What the operator lets through passes.
        let pass = ["x-real-ip".to_string()];
        assert!(!dropped(&r.headers, &pass).iter().any(|n| n == "x-real-ip"));
    }

    #[test]
    fn claims_of_address_host_scheme_url_and_method_are_dropped_by_one_rule() {
        let claims = [
            // Addresses.
            "forwarded",
            "x-forwarded-host",
            "x-forwarded-proto",
            "x-forwarded-port",
            "x-forwarded-scheme",
            "x-forwarded-ssl",
            "x-forwarded-server",
            "x-forwarded-prefix",
            "x-forwarded-uri",
            "x-forwarded-path",
            "x-forwarded-protocol",
            "x-forwarded",
            "x-forwarded-for-original",
            "x-real-ip",
            "x-client-ip",
            "x-cluster-client-ip",
            "x-remote-ip",
            "x-remote-addr",
            "x-originating-ip",
            "x-proxyuser-ip",
            "x-ip",
            "x-client-address",
            "true-client-ip",
            "cf-connecting-ip",
            "fastly-client-ip",
            "client-ip",
            "wl-proxy-client-ip",
            "proxy-client-ip",
            "remote-addr",
            "x-envoy-external-address",
            // Hosts, schemes, ports.
            "x-host",
            "x-original-host",
            "x-http-host-override",
            "x-host-override",
            "x-url-scheme",
            "x-scheme",
            "front-end-https",
            "x-https",
            "x-arr-ssl",
            "x-port",
            // Original URLs and methods.
            "x-original-url",
            "x-original-uri",
            "x-rewrite-url",
            "x-envoy-original-path",
            "x-original-method",
            "x-http-method-override",
            "x-http-method",
            "x-method-override",
            "x-envoy-internal",
        ];
        for name in claims {
            assert!(is_claim(name), "{name} is a claim");
        }
    }

    #[test]
    fn claims_are_read_as_the_servers_behind_read_them() {
        let claims = [
            // `_` is `-` to CGI, WSGI and Rack, and `HTTP_` is their prefix.
            "x_forwarded_host",
            "x-real_ip",
            "x_real_ip",
            "http_x_forwarded_host",
            "http-x-original-url",
            "http_client_ip",
            // The gateway's own fields, in another spelling.
            "x_forwarded_for",
            "http_x_forwarded_for",
            "http-x-forwarded-for",
            "x_request_id",
            "http_x_request_id",
            // `Forwarded-*`, and `ip` glued into the last word.
            "forwarded-for",
            "forwarded-host",
            "forwarded_proto",
            "x-clientip",
            "x-azure-clientip",
            "cf-connecting-ipv6",
            "x-client-ipv6",
            "clientip",
            // httpoxy, a script's name, the request's URI, WebDAV's target.
            "proxy",
            "http_proxy",
            "x-proxy",
            "script-name",
            "x-script-name",
            "script_name",
            "request-uri",
            "x-request-uri",
            "request_uri",
            "destination",
            "x-destination",
        ];
        for name in claims {
            assert!(is_claim(name), "{name} is a claim");
        }
        for name in [
            "x-forwarded-for",
            "x-request-id",
            "x_custom_header",
            "x_idempotency_key",
            "http-version-hint",
            "proxy-authorization",
            "forwardedness",
            "x-zip-code",
            "x-shipping",
        ] {
            assert!(!is_claim(name), "{name} passes");
        }
    }

    #[test]
    fn the_rule_passes_what_it_passed() {
        let passed = [
            "x-forwarded-for",
            "x-request-id",
            "authorization",
            "content-type",
            "content-length",
            "host",
            "user-agent",
            "accept",
            "x-api-version",
            "x-idempotency-key",
            "x-client-version",
            "x-zip-code",
            "x-trace-id",
            "x-correlation-id",
            "via",
            "origin",
            "referer",
            "ip-geo",
            "x-shipping",
        ];
        for name in passed {
            assert!(!is_claim(name), "{name} passes");
        }
    }
}
