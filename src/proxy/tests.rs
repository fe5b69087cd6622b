//! In-process tests of the data plane's branches: a client and scripted backends on tokio's
//! in-memory streams (pingora implements its IO trait for `DuplexStream`), so each branch of
//! the pipeline, the HTTP/1.1 downstream, the backend side and the relay is driven without a
//! socket or a process. The black-box tests in `tests/` run the same paths over the wire.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::BytesMut;
use pingora::protocols::Stream;
use pingora::upstreams::peer::HttpPeer;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::backends::Backends;
use super::connect::{Connect, ConnectFuture};
use super::health::UpstreamHealth;
use super::pool::UpstreamPool;
use super::upstream::Upstream;
use super::{Drain, ProxyApp};
use crate::config::file::AgentFile;
use crate::config::{testing, FileConfig};
use crate::http1::client::ResponseReader;
use crate::http1::RequestHead;
use crate::observe::telemetry::Telemetry;
use crate::observe::trace::{Pipeline, Tracer};
use crate::policy::rate_limit::RateLimits;
use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::Value;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// Bytes an in-memory stream buffers each way.
const PIPE: usize = 256 * 1024;

/// A request as the scripted backend read it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    head: String,
    body: Vec<u8>,
    /// Which backend connection it came on (0, 1, ...) and its place there.
    connection: usize,
    on_connection: usize,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// What the scripted backend does with a request it read.
enum Act {
    /// Write these bytes; keep the connection.
    Answer(Vec<u8>),
    /// Write these bytes, then close.
    AnswerThenClose(Vec<u8>),
    /// Close without answering.
    Close,
}

type Script = Arc<dyn Fn(&Seen) -> Act + Send + Sync>;

/// A connector to an in-memory backend that records what it reads and answers per `script`.
struct ScriptedBackend {
    script: Script,
    connects: AtomicUsize,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Connect for ScriptedBackend {
    fn connect<'a>(&'a self, _peer: &'a HttpPeer, _limit: Duration) -> ConnectFuture<'a> {
        let connection = self.connects.fetch_add(1, Ordering::SeqCst);
        let (gateway_end, backend_end) = tokio::io::duplex(PIPE);
        tokio::spawn(serve_backend(
            backend_end,
            connection,
            self.script.clone(),
            self.seen.clone(),
        ));
        Box::pin(async move { Ok(Box::new(gateway_end) as Stream) })
    }
}

async fn serve_backend(
    mut io: DuplexStream,
    connection: usize,
    script: Script,
    seen: Arc<Mutex<Vec<Seen>>>,
) {
    let mut buf = BytesMut::new();
    let mut head = RequestHead::default();
    for on_connection in 0.. {
        let request = loop {
            if let Ok(true) = head.parse(&buf) {
                let view = head.view(&buf);
                let length = view
                    .headers_named("content-length")
                    .next()
                    .map_or(0, |v| std::str::from_utf8(v).unwrap().parse().unwrap());
                if buf.len() >= head.len + length {
                    let text = String::from_utf8_lossy(&buf[..head.len]).into_owned();
                    let seen = Seen {
                        method: view.method().to_owned(),
                        target: view.target().to_owned(),
                        head: text,
                        body: buf[head.len..head.len + length].to_vec(),
                        connection,
                        on_connection,
                    };
                    let _ = buf.split_to(head.len + length);
                    break seen;
                }
            }
            if !matches!(io.read_buf(&mut buf).await, Ok(n) if n > 0) {
                return;
            }
        };
        seen.lock().unwrap().push(request.clone());
        match script(&request) {
            Act::Answer(bytes) => {
                if io.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Act::AnswerThenClose(bytes) => {
                let _ = io.write_all(&bytes).await;
                return;
            }
            Act::Close => return,
        }
    }
}

/// A 200 with a JSON body naming the path the backend saw.
fn ok(seen: &Seen) -> Vec<u8> {
    let body = format!(r#"{{"seen":"{}"}}"#, seen.target);
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A gateway on in-memory streams in front of one scripted backend.
struct Harness {
    app: Arc<ProxyApp>,
    backend: Arc<ScriptedBackend>,
    tracer: Arc<Tracer>,
    /// What the tracer exported, when [`Harness::traced`] made it.
    spans: Collected,
}

impl Harness {
    fn new(cfg: FileConfig, script: impl Fn(&Seen) -> Act + Send + Sync + 'static) -> Self {
        let backend = Arc::new(ScriptedBackend {
            script: Arc::new(script),
            connects: AtomicUsize::new(0),
            seen: Arc::default(),
        });
        let telemetry = Telemetry::register(&prometheus::Registry::new()).unwrap();
        let snapshot = cfg.snapshot();
        let backends = Arc::new(Backends::new(telemetry.backends.clone()));
        backends.follow(&snapshot.upstream, &snapshot.bases.upstream);
        let upstream = Upstream::new(
            backend.clone(),
            Arc::new(UpstreamPool::new(8)),
            Arc::new(UpstreamHealth::default()),
            backends,
        );
        let rate_limits = Arc::new(RateLimits::new(&snapshot.rate_limit));
        let tracer = Arc::new(Tracer::register(&prometheus::Registry::new()).unwrap());
        let spans = Collected::default();
        if let Some(settings) = &snapshot.tracing {
            let pipeline =
                Pipeline::with_exporter(spans.clone(), settings, tracer.metrics()).unwrap();
            tracer.install(Some(pipeline));
        }
        let app = ProxyApp::new(
            Arc::new(ArcSwap::from_pointee(snapshot)),
            Arc::new(telemetry),
            tracer.clone(),
            upstream,
            rate_limits,
            Drain::default(),
        );
        Harness {
            app: Arc::new(app),
            backend,
            tracer,
            spans,
        }
    }

    /// A gateway that traces at `sample_ratio`, its spans collected in memory.
    fn traced(
        mut cfg: FileConfig,
        sample_ratio: f64,
        script: impl Fn(&Seen) -> Act + Send + Sync + 'static,
    ) -> Self {
        // The endpoint only turns tracing on: the spans go to the harness's own exporter.
        cfg.tracing.otlp_endpoint = Some("http://127.0.0.1:9".into());
        cfg.tracing.sample_ratio = sample_ratio;
        Self::new(cfg, script)
    }

    /// Every span exported, once the pipeline has sent what it holds (spans still open are
    /// waited for, up to 5 s).
    fn spans(&self) -> Vec<SpanData> {
        self.tracer.shutdown(Duration::from_secs(5));
        self.spans.0.lock().unwrap().clone()
    }

    /// A client connection to the gateway.
    fn connect(&self) -> Client {
        let (client_end, gateway_end) = tokio::io::duplex(PIPE);
        let app = self.app.clone();
        let (_shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
        let served = tokio::spawn(async move {
            let _keep_the_sender = _shutdown_tx;
            app.serve_h1(Box::new(gateway_end), None, None, &shutdown)
                .await;
        });
        Client {
            io: client_end,
            responses: ResponseReader::default(),
            served,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.backend.seen.lock().unwrap().clone()
    }

    fn connects(&self) -> usize {
        self.backend.connects.load(Ordering::SeqCst)
    }
}

/// The client side of one connection to the gateway.
struct Client {
    io: DuplexStream,
    responses: ResponseReader,
    served: tokio::task::JoinHandle<()>,
}

/// One answer as the client read it.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: String,
    keep_alive: bool,
    headers: Vec<(String, String)>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Client {
    async fn send(&mut self, raw: &[u8]) {
        self.io.write_all(raw).await.unwrap();
    }

    /// The next answer, or `None` when the gateway closed the connection first.
    async fn answer(&mut self) -> Option<Answer> {
        self.responses.read(&mut self.io, 1 << 20).await.ok()?;
        let headers = [
            "content-type",
            "x-request-id",
            "deprecation",
            "retry-after",
            "allow",
            "connection",
            "transfer-encoding",
            "content-length",
        ]
        .iter()
        .filter_map(|n| {
            let v = self.responses.header(n)?;
            Some((n.to_string(), String::from_utf8_lossy(v).into_owned()))
        })
        .collect();
        Some(Answer {
            status: self.responses.status(),
            body: String::from_utf8_lossy(self.responses.body()).into_owned(),
            keep_alive: self.responses.keep_alive(),
            headers,
        })
    }

    async fn exchange(&mut self, raw: &[u8]) -> Answer {
        self.send(raw).await;
        self.answer().await.expect("an answer")
    }

    /// Whether the gateway has closed its side (after what was read).
    async fn closed(mut self) -> bool {
        // Done sending: a gateway lingering to drain a refused body sees the end at once.
        let _ = self.io.shutdown().await;
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), self.io.read_to_end(&mut rest));
        let closed = matches!(read.await, Ok(Ok(_)));
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.served).await;
        closed
    }
}

/// An authenticated JSON POST with `body`.
fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\nX-Service-Agent-Id: {}\r\nX-Auth-Token: {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        testing::AGENT_ID,
        testing::TOKEN,
        body.len()
    )
    .into_bytes()
}

/// An authenticated GET.
fn get(path: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: gw\r\nX-Service-Agent-Id: {}\r\nX-Auth-Token: {}\r\n\r\n",
        testing::AGENT_ID,
        testing::TOKEN
    )
    .into_bytes()
}

const VERIFY: &str = r#"{"business_code":"KYC"}"#;

#[tokio::test]
async fn an_admitted_v1_call_is_rewritten_forwarded_once_and_relayed_with_its_signals() {
    let mut cfg = testing::config();
    cfg.retirement.deprecated_at = Some("2026-06-01T00:00:00Z".into());
    let h = Harness::new(cfg, |s| Act::Answer(ok(s)));
    let mut c = h.connect();
    let v1 = c
        .exchange(&post("/api/v1/verify/request?x=1", VERIFY))
        .await;
    assert_eq!(v1.status, 200, "{v1:?}");
    assert_eq!(
        v1.body,
        r#"{"seen":"/api/v2/verify/ORG_DEFAULT/request?x=1"}"#
    );
    assert_eq!(v1.header("deprecation"), Some("@1780272000"));
    let seen = h.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, VERIFY.as_bytes());
    assert_eq!(seen[0].header("content-length"), Some("23"));
    assert_eq!(seen[0].header("x-request-id"), v1.header("x-request-id"));
    let v2 = c
        .exchange(&post("/api/v2/verify/SVC/request", VERIFY))
        .await;
    assert_eq!((v2.status, v2.header("deprecation")), (200, None));
}

#[tokio::test]
async fn every_refusal_is_answered_by_the_gateway_and_none_reaches_the_backend() {
    let mut cfg = testing::config();
    cfg.limits.max_body_bytes = 64;
    let h = Harness::new(cfg, |s| Act::Answer(ok(s)));
    let no_json = b"POST /api/v1/verify/request HTTP/1.1\r\nHost: gw\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: secret\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}";
    let bad_token = b"POST /api/v1/verify/request HTTP/1.1\r\nHost: gw\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: wrong\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
    let big = post(
        "/api/v1/verify/request",
        &format!(r#"{{"business_code":"{}"}}"#, "x".repeat(64)),
    );
    let cases: [(&[u8], u16, &str); 5] = [
        (bad_token, 401, "\"not authorized\""),
        (&get("/nope"), 404, "40400"),
        (&get("/api/v1/verify/request"), 405, "40500"),
        (no_json, 415, "41500"),
        (&post("/api/v1/verify/request", "{}"), 400, "business_code"),
    ];
    let mut c = h.connect();
    for (raw, status, body) in cases {
        let a = c.exchange(raw).await;
        assert_eq!(a.status, status, "{a:?}");
        assert!(a.body.contains(body), "{a:?}");
        assert!(
            a.keep_alive,
            "a refusal with a skippable body keeps the connection"
        );
    }
    // A body over the limit is not read past it: the connection cannot go on.
    let mut c = h.connect();
    let a = c.exchange(&big).await;
    assert_eq!((a.status, a.keep_alive), (413, false), "{a:?}");
    assert_eq!(a_405_allows(&h).await, Some("POST".into()));
    assert!(h.seen().is_empty(), "{:?}", h.seen());
}

async fn a_405_allows(h: &Harness) -> Option<String> {
    let a = h.connect().exchange(&get("/api/v2/verify/response")).await;
    a.header("allow").map(str::to_owned)
}

#[tokio::test]
async fn framing_that_could_be_read_two_ways_is_refused_and_the_connection_closed() {
    let h = Harness::new(testing::config(), |s| Act::Answer(ok(s)));
    let mut c = h.connect();
    let a = c
        .exchange(b"POST /api/v1/verify/request HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}")
        .await;
    assert_eq!((a.status, a.keep_alive), (400, false));
    assert!(c.closed().await);
    assert!(h.seen().is_empty());
}

#[tokio::test]
async fn an_agent_over_its_rate_limit_gets_429_after_its_burst() {
    let mut cfg = testing::config();
    let agent = cfg.agent_mut(testing::AGENT_ID);
    agent.rate_limit_per_second = Some(0.001);
    agent.burst = Some(2);
    let h = Harness::new(cfg, |s| Act::Answer(ok(s)));
    let mut c = h.connect();
    for _ in 0..2 {
        assert_eq!(
            c.exchange(&post("/api/v1/verify/request", VERIFY))
                .await
                .status,
            200
        );
    }
    let a = c.exchange(&post("/api/v1/verify/request", VERIFY)).await;
    assert_eq!(a.status, 429);
    assert!(a.header("retry-after").is_some());
    assert_eq!(h.seen().len(), 2);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_backend_connection() {
    let h = Harness::new(testing::config(), |s| Act::Answer(ok(s)));
    let mut c = h.connect();
    let mut both = post("/api/v2/verify/A/request", VERIFY);
    both.extend(post("/api/v2/verify/B/request", VERIFY));
    c.send(&both).await;
    let (first, second) = (c.answer().await.unwrap(), c.answer().await.unwrap());
    assert!(first.body.contains("/verify/A/"), "{first:?}");
    assert!(second.body.contains("/verify/B/"), "{second:?}");
    assert_eq!(
        h.connects(),
        1,
        "the backend connection is pooled and reused"
    );
    assert_eq!(h.seen()[1].on_connection, 1);
}

#[tokio::test]
async fn a_read_whose_pooled_connection_died_goes_again_on_a_new_one_and_a_post_never_does() {
    // Each backend connection answers its first request and closes on reading the second:
    // a kept-alive connection that looks alive when taken, and dies under the request.
    let h = Harness::new(testing::config(), |s| match s.on_connection {
        0 => Act::Answer(ok(s)),
        _ => Act::Close,
    });
    let mut c = h.connect();
    assert_eq!(
        c.exchange(&get("/api/v1/transaction/t1/status"))
            .await
            .status,
        200
    );
    let a = c.exchange(&get("/api/v1/transaction/t2/status")).await;
    assert_eq!(a.status, 200, "{a:?}");
    let resent: Vec<_> = h
        .seen()
        .iter()
        .map(|s| (s.connection, s.on_connection))
        .collect();
    assert_eq!(
        resent,
        [(0, 0), (0, 1), (1, 0)],
        "the resend went on a new connection"
    );
    assert_eq!(
        c.exchange(&post("/api/v1/verify/request", VERIFY))
            .await
            .status,
        502
    );
    let posts = h.seen().iter().filter(|s| s.method == "POST").count();
    assert_eq!(posts, 1, "a POST is sent once, whatever happens to it");
}

#[tokio::test]
async fn a_chunked_answer_passes_through_to_http11_and_is_decoded_for_http10() {
    let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
    let h = Harness::new(testing::config(), move |_| Act::Answer(chunked.to_vec()));
    let mut c = h.connect();
    let a = c.exchange(&get("/api/v1/transaction/t/status")).await;
    assert_eq!((a.status, a.body.as_str()), (200, "abcde"));
    assert_eq!(a.header("transfer-encoding"), Some("chunked"));
    assert_eq!(a.header("content-length"), None, "chunked framing wins");
    assert!(a.keep_alive);

    let mut old = h.connect();
    let a = old
        .exchange(b"GET /api/v1/transaction/t/status HTTP/1.0\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: secret\r\n\r\n")
        .await;
    assert_eq!((a.status, a.body.as_str()), (200, "abcde"));
    assert_eq!(a.header("transfer-encoding"), None);
    assert!(
        !a.keep_alive,
        "the end of a decoded body is the end of the connection"
    );
}

#[tokio::test]
async fn a_backend_that_breaks_mid_answer_closes_the_client_connection() {
    let h = Harness::new(testing::config(), |_| {
        Act::AnswerThenClose(
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial\":".to_vec(),
        )
    });
    let mut c = h.connect();
    c.send(&post("/api/v1/verify/request", VERIFY)).await;
    assert!(
        c.answer().await.is_none(),
        "a cut answer is never a whole one"
    );
    assert!(c.closed().await);
}

#[tokio::test]
async fn a_backend_connection_whose_answer_says_close_on_any_line_is_not_reused() {
    let h = Harness::new(testing::config(), |_| {
        Act::Answer(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}"
                .to_vec(),
        )
    });
    let mut c = h.connect();
    for _ in 0..2 {
        let a = c.exchange(&get("/api/v1/transaction/t/status")).await;
        assert_eq!((a.status, a.body.as_str()), (200, "{}"));
    }
    assert_eq!(
        h.connects(),
        2,
        "a later keep-alive line does not undo close"
    );
}

#[tokio::test]
async fn an_answer_that_breaks_before_its_body_is_the_gateways_to_answer() {
    let h = Harness::new(testing::config(), |_| {
        Act::AnswerThenClose(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n".to_vec())
    });
    let mut c = h.connect();
    let a = c.exchange(&post("/api/v1/verify/request", VERIFY)).await;
    assert_eq!(a.status, 502);
    assert!(a.body.contains("50201"), "{}", a.body);
    assert!(a.keep_alive, "the client's connection serves on");
    assert_eq!(h.seen().len(), 1, "the POST is not sent again");
}

#[tokio::test]
async fn an_http10_client_keeps_its_connection_when_a_broken_answer_is_replaced() {
    // Chunked framing broken at once: an HTTP/1.0 client would have had it decoded, ended by
    // the close; the 502 in its place keeps the connection the client asked to keep.
    let h = Harness::new(testing::config(), |_| {
        Act::Answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{}".to_vec())
    });
    let mut c = h.connect();
    let request = format!(
        "GET /api/v1/transaction/t/status HTTP/1.0\r\nConnection: keep-alive\r\n\
         X-Service-Agent-Id: {}\r\nX-Auth-Token: {}\r\n\r\n",
        testing::AGENT_ID,
        testing::TOKEN
    );
    let a = c.exchange(request.as_bytes()).await;
    assert_eq!(a.status, 502);
    assert_eq!(a.header("connection"), Some("keep-alive"));
    let again = c.exchange(request.as_bytes()).await;
    assert_eq!(again.status, 502, "the connection served a second request");
}

#[tokio::test]
async fn a_chunked_request_body_is_decoded_checked_and_sent_with_its_length() {
    let h = Harness::new(testing::config(), |s| Act::Answer(ok(s)));
    let mut c = h.connect();
    let a = c
        .exchange(b"POST /api/v1/verify/request HTTP/1.1\r\nHost: gw\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: secret\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"bus\r\n12\r\niness_code\":\"KYC\"}\r\n0\r\n\r\n")
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    let seen = &h.seen()[0];
    assert_eq!(seen.body, VERIFY.as_bytes());
    assert_eq!(seen.header("transfer-encoding"), None);
    assert_eq!(seen.header("content-length"), Some("23"));
}

#[tokio::test]
async fn a_refused_agent_never_costs_a_backend_connection() {
    let mut cfg = testing::config();
    let mut blocked = AgentFile::new("blocked", testing::TOKEN);
    blocked.v1_policy = crate::config::V1Policy::Block;
    cfg.auth.agents.push(blocked);
    let h = Harness::new(cfg, |s| Act::Answer(ok(s)));
    let a = h
        .connect()
        .exchange(b"POST /api/v1/verify/request HTTP/1.1\r\nHost: gw\r\nX-Service-Agent-Id: blocked\r\nX-Auth-Token: secret\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        .await;
    assert_eq!(a.status, 410);
    assert!(a.body.contains("41001"), "{a:?}");
    assert_eq!(h.connects(), 0);
}

/// An exporter that keeps what it is given.
#[derive(Debug, Clone, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collected {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

/// The value of a span's attribute `key`.
fn attribute(span: &SpanData, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

const CLIENT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN: &str = "b7ad6b7169203331";

/// An authenticated POST of `path` with a sampled client `traceparent` and a `tracestate`.
fn traced_post(path: &str) -> Vec<u8> {
    let mut raw = post(path, VERIFY);
    let at = raw.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    let trace = format!(
        "traceparent: 00-{CLIENT_TRACE}-{CLIENT_SPAN}-01\r\ntracestate: vendor=a:b , other=1\r\n"
    );
    raw.splice(at..at, trace.into_bytes());
    raw
}

#[tokio::test]
async fn a_client_trace_is_continued_with_the_gateways_span_as_the_backends_parent() {
    // Ratio 0: the client's sampled flag alone decides.
    let h = Harness::traced(testing::config(), 0.0, |s| Act::Answer(ok(s)));
    let a = h
        .connect()
        .exchange(&traced_post("/api/v1/verify/request"))
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    let seen = h.seen().remove(0);
    let spans = h.spans();
    assert_eq!(spans.len(), 1, "{spans:?}");
    let span = &spans[0];
    let ours = span.span_context.span_id().to_string();
    assert_eq!(
        seen.header("traceparent"),
        Some(format!("00-{CLIENT_TRACE}-{ours}-01").as_str()),
        "{}",
        seen.head
    );
    // Unchanged, spaces and all; and the client's traceparent is not sent as well.
    assert_eq!(seen.header("tracestate"), Some("vendor=a:b , other=1"));
    assert_eq!(seen.head.matches("traceparent").count(), 1, "{}", seen.head);

    assert_eq!(span.span_context.trace_id().to_string(), CLIENT_TRACE);
    assert_eq!(span.parent_span_id.to_string(), CLIENT_SPAN);
    assert!(span.parent_span_is_remote);
    assert_eq!(span.span_kind, SpanKind::Server);
    assert_eq!(span.name, "POST /api/v1/verify/request");
    assert_eq!(span.status, Status::Unset);
    for (key, value) in [
        ("http.request.method", Value::from("POST")),
        ("http.route", "/api/v1/verify/request".into()),
        ("url.path", "/api/v1/verify/request".into()),
        ("http.response.status_code", 200.into()),
        ("server.address", "gw".into()),
        ("agent_gateway.operation", "verify_request".into()),
        ("agent_gateway.api_version", "v1".into()),
        ("agent_gateway.agent_id", testing::AGENT_ID.into()),
        (
            "agent_gateway.upstream.path",
            "/api/v2/verify/ORG_DEFAULT/request".into(),
        ),
        ("agent_gateway.upstream.address", "127.0.0.1:9000".into()),
        ("agent_gateway.upstream.reused", false.into()),
    ] {
        assert_eq!(attribute(span, key), Some(value), "{key}");
    }
    assert_eq!(attribute(span, "error.type"), None);
    let events: Vec<&str> = span.events.iter().map(|e| e.name.as_ref()).collect();
    assert_eq!(
        events,
        [
            "gateway.admitted",
            "gateway.body_received",
            "gateway.body_validated",
            "upstream.connected",
            "upstream.response_head",
            "upstream.response_end"
        ]
    );
    let times: Vec<_> = span.events.iter().map(|e| e.timestamp).collect();
    assert!(times.is_sorted(), "{times:?}");
    assert!(span.start_time <= times[0] && times[5] <= span.end_time);
    assert!(
        !format!("{span:?}").contains(testing::TOKEN),
        "the token is in the span: {span:?}"
    );
}

#[tokio::test]
async fn an_unsampled_request_exports_nothing_but_its_trace_still_reaches_the_backend() {
    let h = Harness::traced(testing::config(), 0.0, |s| Act::Answer(ok(s)));
    let mut c = h.connect();
    assert_eq!(
        c.exchange(&post("/api/v1/verify/request", VERIFY))
            .await
            .status,
        200
    );
    // An unsampled parent: the flag stays 00 and the trace goes on, unrecorded.
    let unsampled = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-00");
    let mut raw = get("/api/v1/transaction/tx-1/status");
    raw.splice(
        raw.len() - 2..raw.len() - 2,
        format!("traceparent: {unsampled}\r\n").into_bytes(),
    );
    assert_eq!(c.exchange(&raw).await.status, 200);
    let seen = h.seen();
    let fresh = seen[0].header("traceparent").unwrap();
    assert_eq!(fresh.len(), 55, "{fresh}");
    assert!(
        fresh.starts_with("00-") && fresh.ends_with("-00"),
        "{fresh}"
    );
    assert!(!fresh.contains(CLIENT_TRACE));
    assert_eq!(seen[0].header("tracestate"), None);
    let continued = seen[1].header("traceparent").unwrap();
    assert!(
        continued.starts_with(&format!("00-{CLIENT_TRACE}-")),
        "{continued}"
    );
    assert!(continued.ends_with("-00") && !continued.contains(CLIENT_SPAN));
    assert!(h.spans().is_empty());
}

#[tokio::test]
async fn refusals_and_backend_failures_are_spans_with_their_status() {
    let h = Harness::traced(testing::config(), 1.0, |s| {
        if s.target.contains("tx-broken") {
            Act::Close
        } else {
            Act::Answer(ok(s))
        }
    });
    let bad_token = b"POST /api/v1/verify/request HTTP/1.1\r\nHost: gw\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: wrong\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
    let mut c = h.connect();
    assert_eq!(c.exchange(bad_token).await.status, 401);
    assert_eq!(c.exchange(&get("/nope")).await.status, 404);
    assert_eq!(
        c.exchange(&post("/api/v1/verify/request", "{}"))
            .await
            .status,
        400
    );
    let broken = h
        .connect()
        .exchange(&get("/api/v2/transaction/tx-broken/status"))
        .await;
    assert_eq!(broken.status, 502);
    let spans = h.spans();
    let by_status = |status: i64| {
        spans
            .iter()
            .find(|s| attribute(s, "http.response.status_code") == Some(status.into()))
            .unwrap_or_else(|| panic!("no span with status {status}: {spans:?}"))
    };
    let unauthorized = by_status(401);
    assert_eq!(unauthorized.status, Status::Unset);
    assert_eq!(
        attribute(unauthorized, "agent_gateway.message_code"),
        Some(40100.into())
    );
    assert_eq!(
        attribute(unauthorized, "agent_gateway.auth"),
        Some("bad_token".into())
    );
    assert_eq!(attribute(unauthorized, "agent_gateway.agent_id"), None);
    assert!(unauthorized.events.is_empty());
    assert_eq!(by_status(404).name, "GET");
    let invalid = by_status(400);
    assert_eq!(
        attribute(invalid, "agent_gateway.validation_failure"),
        Some("required".into())
    );
    let failed = by_status(502);
    assert_eq!(
        failed.status,
        Status::error("the backend closed the connection or sent an invalid response")
    );
    assert_eq!(attribute(failed, "error.type"), Some("reset".into()));
    assert_eq!(
        failed.events.last().map(|e| e.name.as_ref()),
        Some("upstream.failed")
    );
    assert!(!format!("{spans:?}").contains(testing::TOKEN));
}

/// A POST of `/api/v1/verify/request` with `extra` header lines, that declares a `VERIFY` body
/// and sends none of it.
fn post_head(extra: &str) -> Vec<u8> {
    let full = String::from_utf8(post("/api/v1/verify/request", VERIFY)).unwrap();
    let head = full.strip_suffix(VERIFY).unwrap();
    let at = head.len() - 2;
    format!("{}{extra}{}", &head[..at], &head[at..]).into_bytes()
}

/// The span whose request was answered `status`.
fn span_with_status(spans: &[SpanData], status: i64) -> &SpanData {
    spans
        .iter()
        .find(|s| attribute(s, "http.response.status_code") == Some(status.into()))
        .unwrap_or_else(|| panic!("no span with status {status}: {spans:?}"))
}

#[tokio::test]
async fn a_client_gone_before_its_100_continue_is_recorded_as_gone_not_as_bad_framing() {
    let h = Harness::traced(testing::config(), 1.0, |s| Act::Answer(ok(s)));
    let Client { mut io, served, .. } = h.connect();
    io.write_all(&post_head("Expect: 100-continue\r\n"))
        .await
        .unwrap();
    // Gone: the gateway reads the head, and its `100 Continue` finds no one to write to.
    drop(io);
    served.await.unwrap();

    // A body cut short is the framing's failure; the client stays to read the answer.
    let mut c = h.connect();
    let mut short = post_head("");
    short.extend_from_slice(&VERIFY.as_bytes()[..5]);
    c.send(&short).await;
    c.io.shutdown().await.unwrap();
    let a = c.answer().await.expect("an answer");
    assert_eq!(a.status, 400);
    assert!(a.body.contains("40001"), "{a:?}");

    let spans = h.spans();
    assert_eq!(spans.len(), 2, "{spans:?}");
    let cause = |span: &SpanData| match attribute(span, "agent_gateway.cause") {
        Some(Value::String(s)) => s.as_str().to_owned(),
        other => panic!("no cause: {other:?}"),
    };
    let (gone, cut): (Vec<_>, Vec<_>) = spans
        .iter()
        .partition(|s| attribute(s, "agent_gateway.client_aborted") == Some(true.into()));
    let (gone, cut) = (gone[0], cut[0]);
    // The answer is the one it always was; the cause is what happened.
    assert_eq!(
        attribute(gone, "agent_gateway.message_code"),
        Some(40001.into())
    );
    assert!(
        cause(gone).starts_with("the client went away: "),
        "{}",
        cause(gone)
    );
    assert_eq!(gone.status, Status::Unset, "the client's failure");
    assert_eq!(
        cause(cut),
        "the connection ended before the request body did"
    );
}

/// `tracing`'s JSON lines, at debug and above, written while the guard lives on this thread
/// (a `#[tokio::test]` runs the gateway's tasks on it too).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        crate::observe::register_a_second_dispatcher();
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// The lines whose `message` is `message`.
    fn with_message(&self, message: &str) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["message"] == message)
            .collect()
    }
}

#[tokio::test]
async fn an_unreadable_request_is_recorded_with_no_method_and_its_cause() {
    let logs = Logs::default();
    let _logging = logs.capture();
    let h = Harness::traced(testing::config(), 1.0, |s| Act::Answer(ok(s)));
    let a = h.connect().exchange(b"NOT HTTP AT ALL\r\n\r\n").await;
    assert_eq!(a.status, 400);
    assert!(a.body.contains("40003"), "{a:?}");

    let access = logs.with_message("request");
    assert_eq!(access.len(), 1, "{access:?}");
    assert_eq!(access[0]["method"], "", "not a GET: {}", access[0]);
    assert_eq!(access[0]["status"], 400);
    let noted = logs.with_message("unreadable request");
    assert_eq!(
        noted[0]["error"], "the request head does not parse: not a valid HTTP/1.x head",
        "{noted:?}"
    );
    let spans = h.spans();
    let span = span_with_status(&spans, 400);
    assert_eq!(span.name, "HTTP");
    assert_eq!(
        attribute(span, "agent_gateway.cause"),
        Some("the request head does not parse: not a valid HTTP/1.x head".into())
    );
}

#[tokio::test]
async fn a_failed_backend_is_logged_and_traced_with_its_cause() {
    let logs = Logs::default();
    let _logging = logs.capture();
    let h = Harness::traced(testing::config(), 1.0, |_| Act::Close);
    let a = h
        .connect()
        .exchange(&get("/api/v2/transaction/tx-1/status"))
        .await;
    assert_eq!(a.status, 502);
    let cause = "the backend closed the connection before answering";
    let warned = logs.with_message("upstream exchange failed");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0]["error"], cause);
    let spans = h.spans();
    let span = span_with_status(&spans, 502);
    assert_eq!(attribute(span, "agent_gateway.cause"), Some(cause.into()));
    // The attributes that were there before keep their values.
    assert_eq!(attribute(span, "error.type"), Some("reset".into()));
    assert_eq!(
        span.status,
        Status::error("the backend closed the connection or sent an invalid response")
    );
}

/// An idle kept-alive connection is mostly its task: the connection's future is allocated for
/// as long as the connection lives, so what it holds across an await (a pipeline's state, a
/// TLS handshake, HTTP/2's loop) is boxed while it runs instead. 792 bytes when this was
/// written, 608 since the head's timer holds no copy of its work; the bound leaves room for a
/// field or two, not for a pipeline inline.
#[tokio::test]
async fn a_connections_future_stays_small() {
    let h = Harness::new(testing::config(), |_| Act::Close);
    let (_client, gateway) = tokio::io::duplex(PIPE);
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let connection = h
        .app
        .serve_connection(Box::new(gateway), None, None, &shutdown);
    let size = std::mem::size_of_val(&connection);
    assert!(size <= 768, "a connection's future is {size} bytes");
}
