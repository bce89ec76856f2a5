//! The `tracing` block: OpenTelemetry traces, a span for every sampled request posted to a
//! collector over OTLP/HTTP (docs/operations.md, "Traces"). Bound to the process: the
//! exporter's thread and queue are set up at start, so a reload that changes the block reports
//! `tracing` as needing a restart.

use serde::Serialize;

use super::file::FileTracing;
pub use super::file::OtlpProtocol;
use super::Invalid;

/// The longest `service_name`.
const MAX_SERVICE_NAME: usize = 255;

/// The share of new traces that are recorded: a number from 0 to 1, never NaN (so it is
/// compared as a value).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct SampleRatio(f64);

// Checked finite when built: equality is a total order here.
impl Eq for SampleRatio {}

impl SampleRatio {
    /// The ratio, 0 to 1.
    pub fn get(self) -> f64 {
        self.0
    }

    /// A trace whose id's last eight bytes, read big-endian, are below this is recorded
    /// (`u64::MAX`: every trace; 0: none). The id is random, so that is the ratio's share of
    /// traces, decided from the id alone: every replica that sees the id decides alike.
    pub fn threshold(self) -> u64 {
        if self.0 >= 1.0 {
            u64::MAX
        } else {
            // 2^64 as f64 is exact; the product is below it, and `as` saturates anyway.
            (self.0 * 18_446_744_073_709_551_616.0) as u64
        }
    }
}

/// The `tracing` block, checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tracing {
    /// The collector's base URL as written, without a trailing `/` (`tracing.otlp_endpoint`).
    pub endpoint: String,
    /// Where spans are posted: `{endpoint}/v1/traces`.
    pub traces_url: String,
    /// `http/protobuf` or `http/json` (`tracing.protocol`).
    pub protocol: OtlpProtocol,
    /// The share of requests without a sampled parent that are recorded
    /// (`tracing.sample_ratio`).
    pub sample_ratio: SampleRatio,
    /// The resource attribute `service.name` (`tracing.service_name`).
    pub service_name: String,
}

/// The block as written, checked: an `http://` URL with a host and nothing after its path, a
/// ratio from 0 to 1, a printable service name.
pub(super) fn tracing(f: &FileTracing) -> Result<Tracing, Invalid> {
    let field = "tracing.otlp_endpoint";
    let bad = |why: &str| Invalid::new(field, format!("`{}` {why}", f.otlp_endpoint));
    let url = url::Url::parse(&f.otlp_endpoint)
        .map_err(|e| bad(&format!("is not a URL such as http://127.0.0.1:4318 ({e})")))?;
    match url.scheme() {
        "http" => {}
        "https" => {
            return Err(bad(
                "is https: the exporter speaks plain HTTP; send to a collector on the host or \
                 in the pod (http://127.0.0.1:4318), which may forward over TLS",
            ))
        }
        _ => return Err(bad("is not an http:// URL")),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("names no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("has a query or a fragment; give the base URL only"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("holds a user or password; give the base URL only"));
    }
    let ratio = f.sample_ratio;
    if !(0.0..=1.0).contains(&ratio) {
        return Err(Invalid::new(
            "tracing.sample_ratio",
            format!("{ratio} is not within 0..=1"),
        ));
    }
    let name = &f.service_name;
    if name.is_empty() || name.len() > MAX_SERVICE_NAME || name.chars().any(char::is_control) {
        return Err(Invalid::new(
            "tracing.service_name",
            format!("must be 1–{MAX_SERVICE_NAME} printable characters"),
        ));
    }
    let endpoint = f.otlp_endpoint.trim_end_matches('/').to_string();
    Ok(Tracing {
        traces_url: format!("{endpoint}/v1/traces"),
        endpoint,
        protocol: f.protocol,
        sample_ratio: SampleRatio(ratio),
        service_name: name.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(edit: impl FnOnce(&mut FileTracing)) -> Result<Tracing, Invalid> {
        let mut f = FileTracing::default();
        edit(&mut f);
        tracing(&f)
    }

    #[test]
    fn the_defaults_validate_and_name_the_traces_url() {
        let t = tracing(&FileTracing::default()).unwrap();
        assert_eq!(t.endpoint, "http://127.0.0.1:4318");
        assert_eq!(t.traces_url, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(t.protocol, OtlpProtocol::Protobuf);
        assert_eq!(t.sample_ratio.get(), 1.0);
        assert_eq!(t.service_name, "tollgate");
        let t = with(|f| f.otlp_endpoint = "http://collector:4318/otlp/".into()).unwrap();
        assert_eq!(t.traces_url, "http://collector:4318/otlp/v1/traces");
    }

    #[test]
    fn bad_values_name_their_field() {
        // An edit of the default block, the field refused, words of the message.
        type Case = (fn(&mut FileTracing), &'static str, &'static str);
        let cases: [Case; 9] = [
            (
                |f| f.otlp_endpoint = "localhost:4318".into(),
                "tracing.otlp_endpoint",
                "not an http:// URL",
            ),
            (
                |f| f.otlp_endpoint = "https://collector:4318".into(),
                "tracing.otlp_endpoint",
                "is https",
            ),
            (
                |f| f.otlp_endpoint = "not a url".into(),
                "tracing.otlp_endpoint",
                "is not a URL",
            ),
            (
                |f| f.otlp_endpoint = "http://c:4318/?x=1".into(),
                "tracing.otlp_endpoint",
                "query",
            ),
            (
                |f| f.otlp_endpoint = "http://u:p@c:4318".into(),
                "tracing.otlp_endpoint",
                "password",
            ),
            (
                |f| f.sample_ratio = 1.5,
                "tracing.sample_ratio",
                "1.5 is not within 0..=1",
            ),
            (
                |f| f.sample_ratio = -0.1,
                "tracing.sample_ratio",
                "not within",
            ),
            (
                |f| f.sample_ratio = f64::NAN,
                "tracing.sample_ratio",
                "not within",
            ),
            (
                |f| f.service_name = String::new(),
                "tracing.service_name",
                "printable",
            ),
        ];
        for (edit, field, words) in cases {
            let e = with(edit).unwrap_err();
            assert_eq!(e.field, field);
            assert!(e.message.contains(words), "{}", e.message);
        }
    }

    #[test]
    fn the_whole_file_names_the_line_and_field_and_is_off_without_the_block() {
        use crate::testing::TestConfig;
        assert!(TestConfig::new().parse().process.tracing.is_none());
        let on = TestConfig::new()
            .tracing("http://127.0.0.1:4318", OtlpProtocol::Json, 0.25)
            .parse();
        let t = on.process.tracing.expect("tracing on");
        assert_eq!(
            (t.protocol, t.sample_ratio.get()),
            (OtlpProtocol::Json, 0.25)
        );
        let bad = TestConfig::new().tracing("http://127.0.0.1:4318", OtlpProtocol::Protobuf, 2.0);
        let e = bad.try_parse().unwrap_err();
        assert_eq!(e.field, "tracing.sample_ratio");
        let yaml = bad.yaml();
        let line = yaml
            .lines()
            .position(|l| l.contains("sample_ratio"))
            .unwrap()
            + 1;
        assert_eq!(e.line, Some(line), "{e}");
        let want = format!("test.yaml:{line}: field `tracing.sample_ratio`: 2 is not within");
        assert!(e.to_string().starts_with(&want), "{e}");
    }

    #[test]
    fn the_protocol_is_one_of_two_words() {
        let p = |v: &str| serde_yaml::from_str::<FileTracing>(&format!("protocol: {v}"));
        assert_eq!(p("http/json").unwrap().protocol, OtlpProtocol::Json);
        assert_eq!(p("http/protobuf").unwrap().protocol, OtlpProtocol::Protobuf);
        let e = p("grpc").unwrap_err().to_string();
        assert!(
            e.contains("http/protobuf") && e.contains("http/json"),
            "{e}"
        );
    }

    #[test]
    fn the_threshold_is_the_ratio_of_the_id_space() {
        let t = |r: f64| SampleRatio(r).threshold();
        assert_eq!(t(0.0), 0);
        assert_eq!(t(1.0), u64::MAX);
        assert_eq!(t(0.5), 1 << 63);
        assert_eq!(t(0.25), 1 << 62);
    }
}
