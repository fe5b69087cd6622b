//! A raw HTTP/1.1 client that sends bytes exactly as written, so tests control framing,
//! encodings and bad input, and the requests and credentials most tests send.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use agent_gateway::config::testing::{AGENT_ID, TOKEN};

/// How long a client waits for an answer before the test fails: a guard against a hang.
const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// The v1 operation most tests call, and a status read.
pub const VERIFY_V1: &str = "/api/v1/verify/request";
pub const STATUS_V1: &str = "/api/v1/transaction/t/status";

/// A body valid for every POST operation: it has the required fields of all four schemas.
pub const BODY: &str = r#"{"business_code":"B","organization_name":"O","credential_def_id":"D"}"#;

/// Request bodies that satisfy the spec's schema for one POST operation each.
pub const VERIFY_BODY: &str = r#"{"business_code":"KYC"}"#;
pub const INVITATION_BODY: &str = r#"{"organization_name":"Org"}"#;
pub const OFFER_BODY: &str = r#"{"organization_name":"Org","credential_def_id":"cred-def-1"}"#;

/// The headers of an authenticated JSON request by [`AGENT_ID`].
pub const AUTH: [(&str, &str); 3] = [
    ("X-Service-Agent-Id", AGENT_ID),
    ("X-Auth-Token", TOKEN),
    ("Content-Type", "application/json"),
];

/// Headers of an authenticated JSON request by `agent` (token [`TOKEN`]).
pub fn agent_headers(agent: &str) -> [(&str, &str); 3] {
    [
        ("X-Service-Agent-Id", agent),
        ("X-Auth-Token", TOKEN),
        ("Content-Type", "application/json"),
    ]
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// Every header `name` (any case) of `headers`, in order.
pub fn headers_named<'h>(headers: &'h [(String, String)], name: &str) -> Vec<&'h str> {
    headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The first header `name` (any case) of `headers`.
pub fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A request with `Connection: close` and the given extra header lines and body, naming `addr`
/// as its `Host` (as curl does) unless `headers` name another.
pub fn request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut req = format!("{method} {target} HTTP/1.1\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" || !body.is_empty() {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    raw(addr, &bytes).unwrap_or_else(|| panic!("no response to {method} {target}"))
}

/// An authenticated JSON POST by [`AGENT_ID`].
pub fn post(addr: SocketAddr, target: &str, body: &str) -> Response {
    request(addr, "POST", target, &AUTH, body.as_bytes())
}

/// An authenticated GET by [`AGENT_ID`].
pub fn get(addr: SocketAddr, target: &str) -> Response {
    request(addr, "GET", target, &AUTH[..2], b"")
}

/// A call by `agent` (token [`TOKEN`]) with `extra` headers: a POST carries [`BODY`] as
/// JSON, any other method nothing.
pub fn as_agent(
    addr: SocketAddr,
    agent: &str,
    method: &str,
    target: &str,
    extra: &[(&str, &str)],
) -> Response {
    let credentials = agent_headers(agent);
    let (own, body): (&[_], &[u8]) = if method == "POST" {
        (&credentials, BODY.as_bytes())
    } else {
        (&credentials[..2], b"")
    };
    let headers: Vec<(&str, &str)> = own.iter().chain(extra).copied().collect();
    request(addr, method, target, &headers, body)
}

/// `GET path` on an admin listener, without credentials.
pub fn admin_get(admin: SocketAddr, path: &str) -> Response {
    request(admin, "GET", path, &[], b"")
}

/// The head of an authenticated request by [`AGENT_ID`], up to and including its last header
/// line: the caller adds more headers, the empty line and a body.
pub fn auth_head(method: &str, target: &str) -> String {
    format!("{method} {target} HTTP/1.1\r\nHost: gw\r\nX-Service-Agent-Id: {AGENT_ID}\r\nX-Auth-Token: {TOKEN}\r\n")
}

/// An authenticated JSON POST of the v1 verify request with `headers` (each ending in CRLF)
/// and a raw `body` as framed by them.
pub fn verify_with(headers: &str, body: &[u8]) -> Vec<u8> {
    let mut raw = auth_head("POST", VERIFY_V1).into_bytes();
    raw.extend_from_slice(b"Content-Type: application/json\r\n");
    raw.extend_from_slice(headers.as_bytes());
    raw.extend_from_slice(b"\r\n");
    raw.extend_from_slice(body);
    raw
}

/// An authenticated v1 verify POST of `body` with its Content-Length.
pub fn verify_post(body: &str) -> Vec<u8> {
    verify_with(
        &format!("Content-Length: {}\r\n", body.len()),
        body.as_bytes(),
    )
}

/// [`verify_post`] of [`VERIFY_BODY`] with the request id `id`, for a test to tell its
/// requests apart at the backend.
pub fn verify_post_with_id(id: &str) -> Vec<u8> {
    let headers = format!(
        "X-Request-Id: {id}\r\nContent-Length: {}\r\n",
        VERIFY_BODY.len()
    );
    verify_with(&headers, VERIFY_BODY.as_bytes())
}

/// Sends `raw` bytes on a new connection and reads one response; `None` if the connection
/// closed before a status line.
pub fn raw(addr: SocketAddr, raw: &[u8]) -> Option<Response> {
    let mut c = Connection::open(addr);
    c.writer.write_all(raw).ok()?;
    read_response(&mut c.reader)
}

/// A connection kept open, for pipelining, keep-alive and framing tests.
pub struct Connection {
    pub writer: TcpStream,
    pub reader: BufReader<TcpStream>,
}

impl Connection {
    pub fn open(addr: SocketAddr) -> Connection {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        Connection {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    pub fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.writer.write_all(bytes.as_ref()).unwrap();
    }

    /// The next response; fails the test if the connection closes first.
    pub fn response(&mut self) -> Response {
        read_response(&mut self.reader).expect("a response before the connection closed")
    }

    /// The head of the next response (through its empty line), without reading any body.
    pub fn head(&mut self) -> String {
        let head = read_head(&mut self.reader).expect("a response head");
        String::from_utf8(head).unwrap()
    }

    /// Everything up to the end of the connection (the gateway closes it).
    pub fn rest(&mut self) -> Vec<u8> {
        let mut rest = Vec::new();
        self.reader
            .read_to_end(&mut rest)
            .expect("the connection to close");
        rest
    }
}

/// The value of header `name` in a response head as text.
pub fn head_header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Reads one response from `reader`; `None` if the connection closed before a status line.
pub fn read_response(reader: &mut impl BufRead) -> Option<Response> {
    let head = read_head(reader)?;
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut hs);
    parsed.parse(&head).ok()?;
    let status = parsed.code?;
    if status == 100 {
        return read_response(reader);
    }
    let headers = owned_headers(parsed.headers);
    // 204 and 304 have no body whatever their headers say; any other response without a
    // length runs to the end of the connection.
    let (body, _) = if status == 204 || status == 304 {
        (Vec::new(), false)
    } else {
        read_body(reader, &headers, true)?
    };
    Some(Response {
        status,
        headers,
        body,
    })
}

/// The header section of a message, up to and including its empty line.
pub(super) fn read_head(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" || line == b"\n" {
            return Some(head);
        }
    }
}

pub(super) fn owned_headers(headers: &[httparse::Header<'_>]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect()
}

/// A message body framed by `headers`: chunked, Content-Length, or (when `to_close`) the
/// rest of the connection. Also says whether it was chunked.
pub(super) fn read_body(
    reader: &mut impl BufRead,
    headers: &[(String, String)],
    to_close: bool,
) -> Option<(Vec<u8>, bool)> {
    if header(headers, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        return Some((read_chunked(reader)?, true));
    }
    let mut body = Vec::new();
    if let Some(len) = header(headers, "content-length") {
        body.resize(len.trim().parse().ok()?, 0);
        reader.read_exact(&mut body).ok()?;
    } else if to_close {
        let _ = reader.read_to_end(&mut body);
    }
    Some((body, false))
}

fn read_chunked(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
        if size == 0 {
            let mut end = String::new();
            reader.read_line(&mut end).ok()?;
            return Some(body);
        }
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).ok()?;
        body.extend_from_slice(&chunk[..size]);
    }
}
