//! The `upstream` section: the provider's base URL, the timeouts, a private CA, and the
//! client-claim fields the operator forwards anyway.

use std::path::Path;
use std::time::Duration;

use super::file::FileUpstream;
use super::{existing_file, nonzero_u64, Invalid, Scheme, Upstream};

pub(super) fn upstream(u: &FileUpstream, base_dir: &Path) -> Result<Upstream, Invalid> {
    let field = "upstream.base_url";
    if u.base_url.is_empty() {
        return Err(Invalid::new(field, "is required: the provider's base URL"));
    }
    let bad = |why: &str| Invalid::new(field, format!("`{}` {why}", u.base_url));
    let uri: http::Uri = u
        .base_url
        .parse()
        .map_err(|_| bad("is not an http:// or https:// URL"))?;
    let scheme = match uri.scheme_str() {
        Some("http") => Scheme::Http,
        Some("https") => Scheme::Https,
        _ => return Err(bad("must be an http:// or https:// URL")),
    };
    let authority = uri.authority().ok_or_else(|| bad("has no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad("must not carry credentials"));
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    if uri.query().is_some() {
        return Err(bad("must not have a query"));
    }
    let port = authority.port_u16().unwrap_or(match scheme {
        Scheme::Http => 80,
        Scheme::Https => 443,
    });
    let base_path = uri.path().trim_end_matches('/').to_string();
    let connect_timeout = Duration::from_millis(
        nonzero_u64(u.connect_timeout_ms, "upstream.connect_timeout_ms")?.get(),
    );
    let read_timeout =
        Duration::from_millis(nonzero_u64(u.read_timeout_ms, "upstream.read_timeout_ms")?.get());
    let ca_file = match &u.ca_file {
        None => None,
        Some(f) => {
            if scheme == Scheme::Http {
                return Err(Invalid::new(
                    "upstream.ca_file",
                    "applies only to an https base_url",
                ));
            }
            Some(existing_file(base_dir, f, "upstream.ca_file")?)
        }
    };
    let mut pass_headers = Vec::with_capacity(u.pass_headers.len());
    for (i, name) in u.pass_headers.iter().enumerate() {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(Invalid::new(
                format!("upstream.pass_headers[{i}]"),
                format!("`{name}` is not a header field name"),
            ));
        }
        pass_headers.push(name.to_ascii_lowercase());
    }
    Ok(Upstream {
        pass_headers,
        scheme,
        host: host.to_string(),
        port,
        authority: authority.as_str().to_string(),
        base_path,
        connect_timeout,
        read_timeout,
        ca_file,
    })
}
