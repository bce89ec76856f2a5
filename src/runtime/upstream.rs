//! The upstream, resolved once per config (not per request): its address, TLS settings and the
//! certificates of a private CA. A reload resolves the new upstream before anything changes, so
//! an unresolvable host or an unreadable CA file refuses the reload.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pingora::utils::tls::{parse_x509, WrappedX509};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::config::{Scheme, Upstream};

/// Why the upstream of a config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot resolve upstream host `{host}`: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("upstream host `{0}` has no address")]
    NoAddress(String),
    #[error("cannot read CA file {}: {reason}", path.display())]
    Ca { path: PathBuf, reason: String },
    #[error("no certificate in CA file {}", .0.display())]
    NoCertificate(PathBuf),
}

/// Where and how to reach the upstream.
pub struct Target {
    pub addr: SocketAddr,
    pub tls: bool,
    pub sni: String,
    /// `Host` sent upstream: the base URL's authority.
    pub host: String,
    pub base_path: String,
    pub ca: Option<Arc<[WrappedX509]>>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
}

impl Target {
    /// Resolve the upstream host and load the CA file, if any.
    pub fn new(u: &Upstream) -> Result<Self, UpstreamError> {
        let addr = (u.host.as_str(), u.port)
            .to_socket_addrs()
            .map_err(|source| UpstreamError::Resolve {
                host: u.host.clone(),
                source,
            })?
            .next()
            .ok_or_else(|| UpstreamError::NoAddress(u.host.clone()))?;
        let ca = u.ca_file.as_deref().map(load_ca).transpose()?;
        let tls = u.scheme == Scheme::Https;
        Ok(Self {
            addr,
            tls,
            sni: if tls { u.host.clone() } else { String::new() },
            host: u.authority.clone(),
            base_path: u.base_path.clone(),
            ca,
            connect_timeout: u.connect_timeout,
            read_timeout: u.read_timeout,
        })
    }
}

/// The certificates of a PEM file, for Pingora's upstream connector.
fn load_ca(path: &Path) -> Result<Arc<[WrappedX509]>, UpstreamError> {
    let bad = |reason: String| UpstreamError::Ca {
        path: path.to_path_buf(),
        reason,
    };
    let mut certs = Vec::new();
    for c in CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))? {
        let c = c.map_err(|e| bad(format!("bad certificate: {e}")))?;
        certs.push(WrappedX509::new(c.to_vec(), parse_x509));
    }
    if certs.is_empty() {
        return Err(UpstreamError::NoCertificate(path.to_path_buf()));
    }
    Ok(Arc::from(certs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(base_url: &str, ca_file: Option<&Path>) -> Upstream {
        let mut c = tollgate_core::testing::TestConfig::new()
            .upstream(base_url)
            .parse();
        c.upstream.ca_file = ca_file.map(Path::to_path_buf);
        c.upstream
    }

    #[test]
    fn a_private_ca_is_read_from_pem_and_a_file_without_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["ca.test".into()]).unwrap();
        let pem = dir.path().join("ca.pem");
        std::fs::write(&pem, cert.cert.pem()).unwrap();
        let t = Target::new(&upstream("https://127.0.0.1:9443", Some(&pem))).unwrap();
        assert_eq!(t.ca.as_ref().map(|c| c.len()), Some(1));
        assert!(t.tls);
        assert_eq!(t.sni, "127.0.0.1");

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let e = Target::new(&upstream("https://127.0.0.1:9443", Some(&empty)))
            .err()
            .unwrap();
        assert!(matches!(e, UpstreamError::NoCertificate(_)), "{e}");
        let missing = dir.path().join("missing.pem");
        let e = Target::new(&upstream("https://127.0.0.1:9443", Some(&missing)))
            .err()
            .unwrap();
        assert!(e.to_string().starts_with("cannot read CA file"), "{e}");
    }

    #[test]
    fn an_unresolvable_host_is_an_error() {
        let e = Target::new(&upstream("http://no-such-host.invalid:9", None))
            .err()
            .unwrap();
        assert!(e.to_string().contains("no-such-host.invalid"), "{e}");
    }
}
