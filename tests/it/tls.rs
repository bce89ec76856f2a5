//! TLS on both sides of the gateway: the edge listener (HTTP/1.1 and HTTP/2 via ALPN take the
//! same policy path as plain HTTP/1.1), and an https upstream signed by a private CA.
//!
//! Certificates are made with rcgen at test time; every server binds 127.0.0.1 on an
//! ephemeral port.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::{eventually, pki, write, Gateway, Mode, Pki, Upstream, EVENT};
use reqwest::{Client, StatusCode, Version};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

/// Bound on any single client call.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

// ---------------------------------------------------------------- client helpers

async fn send(req: reqwest::RequestBuilder) -> reqwest::Response {
    tokio::time::timeout(CALL_TIMEOUT, req.send())
        .await
        .expect("the call finishes in time")
        .expect("the call succeeds at the HTTP level")
}

/// Status, headers and body of one call, checking the negotiated protocol.
async fn call(
    req: reqwest::RequestBuilder,
    want: Version,
) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
    let r = send(req).await;
    assert_eq!(r.version(), want, "negotiated protocol");
    let status = r.status();
    let headers = r.headers().clone();
    let body = tokio::time::timeout(CALL_TIMEOUT, r.bytes())
        .await
        .expect("body in time")
        .expect("body")
        .to_vec();
    (status, headers, body)
}

fn header<'a>(h: &'a reqwest::header::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

/// The problem+json body of a refusal, checking its shape, status and code.
fn problem(
    status: StatusCode,
    h: &reqwest::header::HeaderMap,
    body: &[u8],
    want: u16,
    code: &str,
) -> Value {
    assert_eq!(status.as_u16(), want, "{}", String::from_utf8_lossy(body));
    assert_eq!(header(h, "content-type"), Some("application/problem+json"));
    let v: Value = serde_json::from_slice(body).expect("problem+json body");
    assert_eq!(v["status"], want, "{v}");
    assert_eq!(v["code"], code, "{v}");
    for f in ["type", "title", "detail"] {
        assert!(v[f].is_string(), "{f} missing in {v}");
    }
    v
}

/// `r=` of the `RateLimit` header.
fn remaining(h: &reqwest::header::HeaderMap) -> u32 {
    header(h, "ratelimit")
        .expect("RateLimit header")
        .split(';')
        .find_map(|p| p.strip_prefix("r="))
        .expect("r= in RateLimit")
        .parse()
        .unwrap()
}

const MESSAGE: &str = r#"{"chatId":"1234@c.us","message":"hi over tls"}"#;

fn bad_event() -> String {
    EVENT.replace("2026-11-21T10:00:00.000Z", "2026-11-21 10:00")
}

/// Refusal, body check, forward and limit, over `client` (which must speak `want`).
async fn policy_path(gw: &Gateway, client: &Client, base: &str, want: Version) {
    let json = ("Content-Type", "application/json");
    let auth = ("Authorization", "Bearer basic-key-1");

    // Refusal: no key.
    let (s, h, b) = call(
        client
            .post(format!("{base}/v2/sendMessage/"))
            .header(json.0, json.1)
            .body(MESSAGE),
        want,
    )
    .await;
    problem(s, &h, &b, 401, "unauthorized");
    assert_eq!(
        header(&h, "www-authenticate"),
        Some("Bearer realm=\"tollgate\"")
    );
    assert!(header(&h, "ratelimit").is_none());

    // Body check: an invalid group event is refused before it goes anywhere...
    let (s, h, b) = call(
        client
            .post(format!("{base}/v2/sendGroup"))
            .header(auth.0, auth.1)
            .header(json.0, json.1)
            .body(bad_event()),
        want,
    )
    .await;
    let v = problem(s, &h, &b, 400, "invalid_body");
    assert_eq!(v["errors"][0]["pointer"], "/startTime", "{v}");
    // (the limit is step 4, the body step 5: the refused call was counted)
    assert_eq!(remaining(&h), 39);

    // ...a valid one is forwarded.
    let (s, h, b) = call(
        client
            .post(format!("{base}/v2/sendGroup"))
            .header(auth.0, auth.1)
            .header(json.0, json.1)
            .body(EVENT),
        want,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(b, b"{}");
    assert_eq!(header(&h, "x-upstream"), Some("yes"));
    assert_eq!(remaining(&h), 38);

    // Forward: the upstream's answer with the rate-limit headers added.
    let (s, h, b) = call(
        client
            .post(format!("{base}/v2/sendMessage/"))
            .header(auth.0, auth.1)
            .header(json.0, json.1)
            .body(MESSAGE),
        want,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(b, b"{}");
    assert_eq!(header(&h, "x-upstream"), Some("yes"));
    assert_eq!(header(&h, "ratelimit-policy"), Some("\"basic\";q=40;w=10"));
    assert_eq!(remaining(&h), 37);
    assert!(header(&h, "x-request-id").is_some());

    // Limit: a full window (the injected clock refills it) is 40 calls, then 429.
    gw.clock.advance(Duration::from_secs(10));
    for i in 0..40u32 {
        let (s, h, _) = call(
            client
                .get(format!("{base}/v2/client/getState"))
                .header(auth.0, auth.1),
            want,
        )
        .await;
        assert_eq!(s, StatusCode::OK, "call {i}");
        assert_eq!(remaining(&h), 39 - i, "call {i}");
    }
    let (s, h, b) = call(
        client
            .get(format!("{base}/v2/client/getState"))
            .header(auth.0, auth.1),
        want,
    )
    .await;
    problem(s, &h, &b, 429, "rate_limited");
    let retry: u64 = header(&h, "retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=10).contains(&retry), "Retry-After {retry}");
    assert_eq!(remaining(&h), 0);
    // Leave the key with a full window for whoever comes next.
    gw.clock.advance(Duration::from_secs(10));
}

// ---------------------------------------------------------------- (a) TLS at the edge

fn tls_client(ca_pem: &str, tls_addr: SocketAddr, h1_only: bool) -> Client {
    let mut b = Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .tls_built_in_root_certs(false)
        .resolve("gateway.test", tls_addr)
        .no_proxy()
        .timeout(CALL_TIMEOUT);
    if h1_only {
        b = b.http1_only();
    }
    b.build().unwrap()
}

#[test]
fn tls_listener_h1_and_h2_take_the_same_policy_path() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let certs = pki("Tollgate Edge Test CA", &["gateway.test", "127.0.0.1"]);
    let cert = write(dir.path(), "edge.pem", &certs.leaf_pem);
    let key = write(dir.path(), "edge-key.pem", &certs.leaf_key_pem);
    let tls_port = crate::harness::closed_port();
    let gw = Gateway::start(&crate::harness::config_for(&up).tls(
        format!("127.0.0.1:{tls_port}"),
        &cert,
        &key,
    ));
    let tls_addr: SocketAddr = ([127, 0, 0, 1], tls_port).into();
    assert_eq!(
        gw.config.process.tls.as_ref().map(|t| t.listen),
        Some(tls_addr)
    );
    crate::harness::wait_listening(tls_addr);

    let base = format!("https://gateway.test:{tls_port}");
    let h1 = tls_client(&certs.ca_pem, tls_addr, true);
    let h2 = tls_client(&certs.ca_pem, tls_addr, false);
    let rt = runtime();
    rt.block_on(policy_path(&gw, &h1, &base, Version::HTTP_11));
    rt.block_on(policy_path(&gw, &h2, &base, Version::HTTP_2));

    // The upstream got exactly the checked bytes, per protocol, and never an invalid body.
    let seen = up.seen();
    let groups: Vec<_> = seen
        .iter()
        .filter(|s| s.path() == "/v2/sendGroup")
        .collect();
    assert_eq!(groups.len(), 2, "one valid group event per protocol");
    for g in &groups {
        assert_eq!(g.body, EVENT.as_bytes());
        assert_eq!(
            g.header("content-length"),
            Some(EVENT.len().to_string().as_str())
        );
    }
    let messages: Vec<_> = seen
        .iter()
        .filter(|s| s.path() == "/v2/sendMessage/")
        .collect();
    assert_eq!(messages.len(), 2, "the refused call never arrived");
    for m in &messages {
        assert_eq!(m.body, MESSAGE.as_bytes());
        assert_eq!(m.header("authorization"), Some("Bearer basic-key-1"));
    }
    let bad = bad_event();
    assert!(seen.iter().all(|s| s.body != bad.as_bytes()));
    assert!(seen
        .iter()
        .all(|s| !String::from_utf8_lossy(&s.body).contains("2026-11-21 10:00")));
    // Per protocol: 1 group event + 1 message + 40 getState; the 401, 400 and 429 stayed here.
    assert_eq!(seen.len(), 2 * 42);
    // The upstream leg is plain HTTP/1.1 whatever the client spoke.
    assert!(seen.iter().all(|s| s.request_line.ends_with(" HTTP/1.1")));
}

#[test]
fn plaintext_http2_prior_knowledge_is_not_served() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let rt = runtime();
    let url = format!("http://{}/v2/client/getState", gw.addr);
    rt.block_on(async {
        // Plain HTTP/1.1 on the same listener works...
        let h1 = Client::builder()
            .http1_only()
            .no_proxy()
            .timeout(CALL_TIMEOUT)
            .build()
            .unwrap();
        let (s, _, _) = call(
            h1.get(&url).header("Authorization", "Bearer pro-key-1"),
            Version::HTTP_11,
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        // ...h2c with prior knowledge does not.
        let h2c = Client::builder()
            .http2_prior_knowledge()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let r = tokio::time::timeout(
            CALL_TIMEOUT,
            h2c.get(&url)
                .header("Authorization", "Bearer pro-key-1")
                .send(),
        )
        .await
        .expect("h2c attempt ends in time");
        match r {
            Err(e) => {
                eprintln!("h2c prior knowledge on the plain listener: {e:?}");
                assert!(!e.is_timeout(), "refused, not timed out: {e}");
            }
            Ok(resp) => panic!("h2c was served: {:?} {}", resp.version(), resp.status()),
        }
    });
    assert_eq!(up.count(), 1, "only the HTTP/1.1 call reached the upstream");
}

// ---------------------------------------------------------------- (b) https upstream

/// One request as the TLS upstream received it.
#[derive(Clone, Debug)]
struct TlsSeen {
    /// The SNI the client sent (none for an IP literal, RFC 6066 section 3).
    sni: Option<String>,
    /// Request line and headers, as sent.
    head: String,
    body: Vec<u8>,
}

impl TlsSeen {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// An HTTP/1.1 upstream behind tokio-rustls that answers `200 {}` and records each request.
struct TlsUpstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<TlsSeen>>>,
    handshakes_ok: Arc<AtomicUsize>,
    handshakes_failed: Arc<AtomicUsize>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl TlsUpstream {
    fn start(certs: &Pki) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        use rustls_pki_types::pem::PemObject;
        let chain: Vec<_> =
            rustls_pki_types::CertificateDer::pem_slice_iter(certs.leaf_pem.as_bytes())
                .map(|c| c.unwrap())
                .collect();
        let key =
            rustls_pki_types::PrivateKeyDer::from_pem_slice(certs.leaf_key_pem.as_bytes()).unwrap();
        let cfg = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ok = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (s, o, f) = (Arc::clone(&seen), Arc::clone(&ok), Arc::clone(&failed));
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let deadline = tokio::time::sleep(Duration::from_secs(120));
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => break,
                        _ = &mut deadline => break,
                        a = listener.accept() => {
                            let Ok((tcp, _)) = a else { continue };
                            let (acc, s, o, f) = (acceptor.clone(), Arc::clone(&s), Arc::clone(&o), Arc::clone(&f));
                            tokio::spawn(async move {
                                let hs = tokio::time::timeout(Duration::from_secs(10), acc.accept(tcp)).await;
                                match hs {
                                    Ok(Ok(tls)) => {
                                        o.fetch_add(1, Ordering::SeqCst);
                                        serve_tls(tls, s).await;
                                    }
                                    _ => {
                                        f.fetch_add(1, Ordering::SeqCst);
                                    }
                                }
                            });
                        }
                    }
                }
            });
        });
        Self {
            addr,
            seen,
            handshakes_ok: ok,
            handshakes_failed: failed,
            _stop: stop_tx,
        }
    }

    fn seen(&self) -> Vec<TlsSeen> {
        self.seen.lock().unwrap().clone()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Keep-alive HTTP/1.1 with `Content-Length` bodies (what the gateway sends here).
async fn serve_tls(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    seen: Arc<Mutex<Vec<TlsSeen>>>,
) {
    let sni = tls.get_ref().1.server_name().map(str::to_string);
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    loop {
        let head_end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
            match tokio::time::timeout(Duration::from_secs(30), tls.read(&mut tmp)).await {
                Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&tmp[..n]),
                _ => return,
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end - 4]).into_owned();
        let len: usize = head
            .lines()
            .skip(1)
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        while buf.len() < head_end + len {
            match tokio::time::timeout(Duration::from_secs(30), tls.read(&mut tmp)).await {
                Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&tmp[..n]),
                _ => return,
            }
        }
        let body = buf[head_end..head_end + len].to_vec();
        buf.drain(..head_end + len);
        seen.lock().unwrap().push(TlsSeen {
            sni: sni.clone(),
            head,
            body,
        });
        let resp = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Upstream: tls\r\nContent-Length: 2\r\n\r\n{}";
        if tls.write_all(resp.as_bytes()).await.is_err() || tls.flush().await.is_err() {
            return;
        }
    }
}

/// The standard test config in front of `https://127.0.0.1:<port>`, trusting `ca_file`.
fn https_config(port: u16, ca_file: Option<&str>) -> crate::harness::TestConfig {
    let config = crate::harness::test_config(&format!("https://127.0.0.1:{port}"));
    match ca_file {
        None => config,
        Some(ca) => config.ca_file(ca),
    }
}

#[test]
fn https_upstream_with_a_private_ca_verifies_the_ip_san() {
    let dir = tempfile::tempdir().unwrap();
    let certs = pki("Tollgate Upstream Test CA", &["upstream.test", "127.0.0.1"]);
    let other = pki("Some Other CA", &["upstream.test", "127.0.0.1"]);
    let ca = write(dir.path(), "upstream-ca.pem", &certs.ca_pem);
    let other_ca = write(dir.path(), "other-ca.pem", &other.ca_pem);
    let up = TlsUpstream::start(&certs);
    let port = up.addr.port();

    // The right CA: forwarded over TLS, the certificate verified against the IP SAN.
    {
        let gw = Gateway::start(&https_config(port, Some(&ca)));
        let r = gw.call("basic-key-1", "POST", "/v2/sendMessage/", MESSAGE);
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.body, b"{}");
        assert_eq!(r.header("x-upstream"), Some("tls"));
        assert_eq!(r.header("ratelimit-policy"), Some("\"basic\";q=40;w=10"));
        let r = gw.call("basic-key-1", "POST", "/v2/sendGroup", EVENT);
        assert_eq!(r.status, 200);
        let r = gw.call("basic-key-1", "POST", "/v2/sendGroup", &bad_event());
        assert_eq!((r.status, r.code().as_str()), (400, "invalid_body"));

        let seen = up.seen();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(
            seen[0]
                .head
                .starts_with("POST /v2/sendMessage/ HTTP/1.1\r\n"),
            "{}",
            seen[0].head
        );
        assert_eq!(seen[0].body, MESSAGE.as_bytes());
        assert_eq!(
            seen[0].header("host"),
            Some(format!("127.0.0.1:{port}").as_str())
        );
        assert_eq!(seen[0].header("authorization"), Some("Bearer basic-key-1"));
        assert!(seen[0].header("x-request-id").is_some());
        assert!(
            seen[1].head.starts_with("POST /v2/sendGroup HTTP/1.1\r\n"),
            "{}",
            seen[1].head
        );
        assert_eq!(seen[1].body, EVENT.as_bytes());
        // An IP literal is verified against the IP SAN but never sent as SNI (RFC 6066).
        assert!(seen.iter().all(|s| s.sni.is_none()), "{seen:?}");
        assert!(up.handshakes_ok.load(Ordering::SeqCst) >= 1);
        assert_eq!(up.handshakes_failed.load(Ordering::SeqCst), 0);
    }

    // A different CA: the certificate does not verify, so nothing is sent upstream.
    {
        let gw = Gateway::start(&https_config(port, Some(&other_ca)));
        let r = gw.call("basic-key-1", "POST", "/v2/sendMessage/", MESSAGE);
        assert_eq!(
            (r.status, r.code().as_str()),
            (502, "upstream_unavailable"),
            "{:?}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(up.seen().len(), 2, "no request crossed a failed handshake");
        eventually("the upstream saw the handshake fail", || {
            up.handshakes_failed.load(Ordering::SeqCst) >= 1
        });
    }

    // The right CA but a leaf without the IP SAN: the name is checked, not just the chain.
    {
        let name_certs = pki("Tollgate Name Test CA", &["upstream.test"]);
        let name_only = TlsUpstream::start(&name_certs);
        let ca = write(dir.path(), "name-ca.pem", &name_certs.ca_pem);
        let gw = Gateway::start(&https_config(name_only.addr.port(), Some(&ca)));
        let r = gw.call("basic-key-1", "POST", "/v2/sendMessage/", MESSAGE);
        assert_eq!((r.status, r.code().as_str()), (502, "upstream_unavailable"));
        assert!(name_only.seen().is_empty());
        eventually("the name-only upstream saw the handshake fail", || {
            name_only.handshakes_failed.load(Ordering::SeqCst) >= 1
        });
    }

    // No ca_file: the private CA is not in the default roots either.
    {
        let gw = Gateway::start(&https_config(port, None));
        let r = gw.call("basic-key-1", "GET", "/v2/client/getState", "");
        assert_eq!((r.status, r.code().as_str()), (502, "upstream_unavailable"));
        assert_eq!(up.seen().len(), 2);
    }
}
