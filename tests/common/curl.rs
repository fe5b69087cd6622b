//! curl, a client nobody here wrote, for the gateway's HTTP/2: h2c with prior knowledge on
//! the plaintext listener, h2 or HTTP/1.1 by ALPN on the TLS one.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::process::Command;

use super::pki::TestPki;

/// What curl reported of one exchange.
#[derive(Debug)]
pub struct CurlAnswer {
    /// `1.1` or `2`.
    pub version: String,
    /// 0 when curl got no answer.
    pub status: u16,
    pub body: String,
}

/// `curl -sS <args>`, with a 10 s cap (a guard against a hang) and a summary of the
/// protocol version and status written after the body.
pub fn curl<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> CurlAnswer {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .args(["-w", "\n%{http_version} %{http_code}"])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, summary) = text.rsplit_once('\n').unwrap_or(("", &text));
    let (version, status) = summary.split_once(' ').unwrap_or(("", "0"));
    let answer = CurlAnswer {
        version: version.to_owned(),
        status: status.parse().unwrap_or(0),
        body: body.to_owned(),
    };
    if !out.status.success() {
        eprintln!("curl: {}: {answer:?}", String::from_utf8_lossy(&out.stderr));
    }
    answer
}

/// `-H name: value` for each header.
pub fn header_args(headers: &[(&str, &str)]) -> Vec<String> {
    headers
        .iter()
        .flat_map(|(n, v)| ["-H".to_owned(), format!("{n}: {v}")])
        .collect()
}

/// The arguments that reach `path` on a TLS listener at `proxy` serving `pki`'s
/// certificate for "localhost", verified against its CA: the URL last.
pub fn https_args(proxy: SocketAddr, pki: &TestPki, path: &str) -> Vec<String> {
    let port = proxy.port();
    vec![
        "--cacert".into(),
        pki.ca.clone(),
        "--resolve".into(),
        format!("localhost:{port}:{}", proxy.ip()),
        format!("https://localhost:{port}{path}"),
    ]
}
