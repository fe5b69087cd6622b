//! An HTTP(S) client for the APIs the gateway and its commands read: a Prometheus
//! (`v1-usage --prometheus`, through [`crate::observe::prometheus`]) and an admin listener
//! (the CLI's `v1-usage --admin`).
//!
//! hyper's client (hyper-util) over rustls (hyper-rustls): `https://` with the platform's
//! roots or the CAs of a file, `http://` as well; credentials as a bearer token read from a
//! file, or basic auth from the URL (`https://user:password@host/`) or a file
//! (`user:password`); each GET bounded in time and in the size of its answer. A URL's password
//! and a token never appear in an error or a log line ([`redact`], which the config's dump and
//! problems use too). Whom a client trusts is [`tls`]'s, for the load generator too.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::prelude::{Engine as _, BASE64_STANDARD};
use bytes::Bytes;
use http::{HeaderValue, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;

use redact::{redact_url, REDACTED};
use tls::{TlsError, Trust};

pub mod redact;
pub mod tls;

/// How long one GET may take, answer included.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The most of an answer that is read.
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// Why a client could not be made, or a GET failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Url(String),
    #[error("cannot read {path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Credentials(String),
    /// Its message names the CA file, or the certificate, it is about.
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("GET {url}: {source}")]
    Request {
        url: String,
        source: hyper_util::client::legacy::Error,
    },
    #[error("GET {url}: reading the answer: {message}")]
    Answer { url: String, message: String },
    #[error("GET {url}: no answer within {}s", TIMEOUT.as_secs())]
    Timeout { url: String },
}

/// How to reach a server beyond its URL: whom to trust, and who to be.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// PEM CA certificates the server's certificate must chain to, instead of the platform's.
    pub ca_file: Option<PathBuf>,
    /// A file holding a bearer token (a trailing newline is not part of it).
    pub token_file: Option<PathBuf>,
    /// A file holding `user:password` for basic auth (a trailing newline is not part of it).
    pub basic_auth_file: Option<PathBuf>,
}

/// Whether a CA file can apply to the server at `url`, as [`Client::new`] decides it: only an
/// `https://` server has a certificate to verify. A URL that does not parse is another
/// problem, its own ([`check_url_without_credentials`]), and is not one here.
pub fn ca_file_applies(url: &str) -> bool {
    Base::parse(url).map_or(true, |base| base.verifies_a_certificate())
}

/// Whether `authority`'s port, if it names one, is a number from 0 to 65535. `http` takes any
/// text after the last `:` for a port, and a password's unencoded `/` ends an authority early,
/// so that the user name would be read as the host and the start of the password as its port.
/// The one check of a port for every URL the gateway reads (config, CLI).
pub fn port_is_a_number(authority: &http::uri::Authority) -> bool {
    let text = authority.as_str();
    let host_and_port = text.rsplit_once('@').map_or(text, |(_, after)| after);
    authority.port_u16().is_some() || host_and_port == authority.host()
}

/// Whether `url` is one a [`Client`] takes, with no user or password in it: for a URL kept in
/// a config file, which `config dump` and the admin listener's `/config` show as written.
pub fn check_url_without_credentials(url: &str) -> Result<(), ClientError> {
    let base = Base::parse(url)?;
    match base.basic {
        Some(_) => Err(ClientError::Url(format!(
            "{}: must not carry a user or password (the config is shown by config dump and /config)",
            redact_url(url)
        ))),
        None => Ok(()),
    }
}

/// A server's base URL, without its credentials.
#[derive(Clone, PartialEq, Eq)]
struct Base {
    /// `http` or `https`.
    scheme: &'static str,
    /// `host:port`, without user information.
    authority: String,
    /// The path every request's path goes under (a Prometheus' `--web.route-prefix`), without
    /// a trailing slash.
    prefix: String,
    /// `user:password` from the URL, percent-decoded.
    basic: Option<(String, String)>,
}

impl Base {
    /// Whether the server presents a certificate to verify (`https://`).
    fn verifies_a_certificate(&self) -> bool {
        self.scheme == "https"
    }

    fn parse(url: &str) -> Result<Base, ClientError> {
        let bad = |why: &str| ClientError::Url(format!("{}: {why}", redact_url(url)));
        let (scheme, rest) = match url.split_once("://") {
            Some(("http", rest)) => ("http", rest),
            Some(("https", rest)) => ("https", rest),
            _ => return Err(bad("must start with http:// or https://")),
        };
        if rest.contains(['?', '#']) {
            return Err(bad("must have no query or fragment"));
        }
        let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, authority),
        };
        if host.is_empty() {
            return Err(bad("has no host"));
        }
        let basic = userinfo
            .map(|u| {
                let (user, password) = u.split_once(':').unwrap_or((u, ""));
                Some((percent_decode(user)?, percent_decode(password)?))
            })
            .map(|pair| {
                pair.ok_or_else(|| bad("its user or password is not valid percent-encoding"))
            })
            .transpose()?;
        let base = Base {
            scheme,
            authority: host.to_owned(),
            prefix: prefix.trim_end_matches('/').to_owned(),
            basic,
        };
        let uri = base.uri("/").map_err(|_| bad("is not a URL"))?;
        if !uri.authority().is_some_and(port_is_a_number) {
            return Err(bad("its port is not a number from 0 to 65535"));
        }
        Ok(base)
    }

    /// The URI of `path` (with its query) under this base.
    fn uri(&self, path: &str) -> Result<Uri, http::uri::InvalidUri> {
        format!("{}://{}{}{path}", self.scheme, self.authority, self.prefix).parse()
    }
}

/// By hand, so that the password is never printed; each field named, so that one added later
/// is placed here too.
impl std::fmt::Debug for Base {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            scheme,
            authority,
            prefix,
            basic,
        } = self;
        f.debug_struct("Base")
            .field("scheme", scheme)
            .field("authority", authority)
            .field("prefix", prefix)
            .field("basic", &basic.as_ref().map(|(user, _)| (user, REDACTED)))
            .finish()
    }
}

impl std::fmt::Display for Base {
    /// The URL without its credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.prefix)
    }
}

/// A URL's user or password, percent-decoded; `None` when it is not valid UTF-8 once decoded
/// or a `%` is not followed by two hex digits.
fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

fn read_secret(path: &Path) -> Result<String, ClientError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClientError::File {
        path: path.display().to_string(),
        source,
    })?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.is_empty() {
        // Sent, it would be `Bearer ` with nothing: say so here rather than as the server's 401.
        return Err(ClientError::Credentials(format!(
            "{} is empty",
            path.display()
        )));
    }
    Ok(text.to_owned())
}

/// The `Authorization` header the options and the URL ask for, if any.
fn authorization(base: &Base, options: &ClientOptions) -> Result<Option<HeaderValue>, ClientError> {
    let file_basic = match &options.basic_auth_file {
        Some(path) => {
            let text = read_secret(path)?;
            let (user, password) = text.split_once(':').ok_or_else(|| {
                ClientError::Credentials(format!("{} must hold user:password", path.display()))
            })?;
            Some((user.to_owned(), password.to_owned()))
        }
        None => None,
    };
    let token = options.token_file.as_deref().map(read_secret).transpose()?;
    let value = match (token, file_basic.or_else(|| base.basic.clone())) {
        (Some(_), Some(_)) => {
            return Err(ClientError::Credentials(
                "a bearer token and basic auth: give one of the two".into(),
            ))
        }
        (Some(token), None) => format!("Bearer {token}"),
        (None, Some((user, password))) => {
            let pair = format!("{user}:{password}");
            format!("Basic {}", BASE64_STANDARD.encode(pair))
        }
        (None, None) => return Ok(None),
    };
    let mut value = HeaderValue::from_str(&value).map_err(|_| {
        ClientError::Credentials("the credentials hold a character a header cannot".into())
    })?;
    value.set_sensitive(true);
    Ok(Some(value))
}

/// A server's status and answer body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// A client of one server, at its base URL.
pub struct Client {
    http: HyperClient<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    base: Base,
    authorization: Option<HeaderValue>,
}

impl Client {
    /// A client of the server at `url` (`http://` or `https://`, with a path prefix and
    /// `user:password@` if it needs them), as `options` say.
    pub fn new(url: &str, options: &ClientOptions) -> Result<Client, ClientError> {
        let base = Base::parse(url)?;
        let authorization = authorization(&base, options)?;
        if options.ca_file.is_some() && !base.verifies_a_certificate() {
            return Err(ClientError::Url(format!(
                "{base}: a CA file is for https:// only"
            )));
        }
        let trust = match &options.ca_file {
            Some(path) => Trust::CaFile(path.clone()),
            None => Trust::Platform,
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(Arc::unwrap_or_clone(tls::client_config(&trust, &[])?))
            .https_or_http()
            .enable_http1()
            .build();
        let http = HyperClient::builder(TokioExecutor::new()).build(connector);
        Ok(Client {
            http,
            base,
            authorization,
        })
    }

    /// The server's base URL, without credentials.
    pub fn base(&self) -> String {
        self.base.to_string()
    }

    /// `GET` of `path` (with its query, already encoded) under the base URL: the status and
    /// the whole answer, within 10 s.
    pub async fn get(&self, path: &str) -> Result<Answer, ClientError> {
        let url = format!("{}{path}", self.base);
        let uri = self
            .base
            .uri(path)
            .map_err(|e| ClientError::Url(format!("{url}: {e}")))?;
        let mut request = http::Request::get(uri);
        if let Some(value) = &self.authorization {
            request = request.header(http::header::AUTHORIZATION, value.clone());
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| ClientError::Url(format!("{url}: {e}")))?;
        let fetch = async {
            let response =
                self.http
                    .request(request)
                    .await
                    .map_err(|source| ClientError::Request {
                        url: url.clone(),
                        source,
                    })?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| ClientError::Answer {
                    url: url.clone(),
                    message: e.to_string(),
                })?
                .to_bytes();
            Ok(Answer { status, body })
        };
        tokio::time::timeout(TIMEOUT, fetch)
            .await
            .map_err(|_| ClientError::Timeout { url: url.clone() })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_keeps_its_prefix_and_loses_its_credentials() {
        let b = Base::parse("https://reader:p%40ss@prom.example:9443/prometheus/").unwrap();
        assert_eq!(b.to_string(), "https://prom.example:9443/prometheus");
        assert_eq!(b.basic, Some(("reader".into(), "p@ss".into())));
        assert_eq!(
            b.uri("/api/v1/query?query=up").unwrap().to_string(),
            "https://prom.example:9443/prometheus/api/v1/query?query=up"
        );
        for bad in ["prom:9090", "ftp://x", "http://", "http://h/?q=1"] {
            assert!(Base::parse(bad).is_err(), "{bad} accepted");
        }
        let e = Base::parse("gopher://u:secret@h").unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
        for bad in [
            "http://ops:prom/pw@prometheus:9090",
            "http://h:99999",
            "http://h:",
        ] {
            let e = Base::parse(bad).unwrap_err().to_string();
            assert!(
                e.ends_with("its port is not a number from 0 to 65535"),
                "{e}"
            );
            assert!(!e.contains("prom/pw"), "{e}");
        }
        assert!(Base::parse("http://[::1]/prom").is_ok());
    }

    #[test]
    fn a_base_s_debug_print_shows_no_password() {
        let b = Base::parse("https://reader:p%40ss@prom.example:9443/prometheus/").unwrap();
        let shown = format!("{b:?}");
        assert!(
            !shown.contains("p@ss") && !shown.contains("p%40ss"),
            "{shown}"
        );
        assert!(
            shown.contains("reader") && shown.contains(REDACTED),
            "{shown}"
        );
    }

    #[test]
    fn credentials_come_from_the_url_or_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t0ken\n").unwrap();
        let pair = dir.path().join("basic");
        std::fs::write(&pair, "reader:s3cret\n").unwrap();
        let base = Base::parse("https://prom:9090").unwrap();
        let with = |token_file: Option<&PathBuf>, basic_auth_file: Option<&PathBuf>| {
            let options = ClientOptions {
                ca_file: None,
                token_file: token_file.cloned(),
                basic_auth_file: basic_auth_file.cloned(),
            };
            authorization(&base, &options)
        };
        assert_eq!(with(Some(&token), None).unwrap().unwrap(), "Bearer t0ken");
        assert_eq!(
            with(None, Some(&pair)).unwrap().unwrap(),
            "Basic cmVhZGVyOnMzY3JldA=="
        );
        assert!(with(Some(&token), Some(&pair)).is_err());
        assert!(with(None, None).unwrap().is_none());
        // An empty file is no token: said, rather than sent as `Bearer ` and refused.
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let e = with(Some(&empty), None).unwrap_err().to_string();
        assert!(e.ends_with("empty is empty"), "{e}");
        let from_url = Base::parse("https://a:b@prom:9090").unwrap();
        let value = authorization(&from_url, &ClientOptions::default()).unwrap();
        assert_eq!(value.unwrap(), "Basic YTpi");
    }
}
