//! A recording OTLP/HTTP collector: a real listener on a free loopback port that decodes each
//! `ExportTraceServiceRequest` the gateway posts (protobuf, with opentelemetry-proto) and keeps
//! it, raw bytes included, for the test to read.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use super::wait_until;

/// One export request as the collector received it.
#[derive(Debug, Clone)]
pub struct Export {
    pub method: String,
    pub path: String,
    pub content_type: String,
    /// The body as sent: what a search for a secret must look through.
    pub body: Vec<u8>,
    pub request: ExportTraceServiceRequest,
}

/// A span with the `service.name` of the resource it was exported under.
#[derive(Debug, Clone)]
pub struct Received {
    pub service_name: String,
    pub span: Span,
}

impl Received {
    /// The span's attribute `key`, when it has one.
    pub fn attribute(&self, key: &str) -> Option<Value> {
        attribute(&self.span.attributes, key)
    }

    pub fn string(&self, key: &str) -> Option<String> {
        match self.attribute(key)? {
            Value::StringValue(s) => Some(s),
            other => panic!("{key} is not a string: {other:?}"),
        }
    }

    pub fn int(&self, key: &str) -> Option<i64> {
        match self.attribute(key)? {
            Value::IntValue(i) => Some(i),
            other => panic!("{key} is not an integer: {other:?}"),
        }
    }

    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    pub fn parent_span_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    pub fn event_names(&self) -> Vec<&str> {
        self.span.events.iter().map(|e| e.name.as_str()).collect()
    }
}

pub fn attribute(attributes: &[KeyValue], key: &str) -> Option<Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone()?.value)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How the collector answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 200 with an empty `ExportTraceServiceResponse`.
    Accept,
    /// Reads the request and never answers (a collector that hangs).
    Stall,
}

/// The collector. Stops accepting on drop.
pub struct Collector {
    pub addr: SocketAddr,
    exports: Arc<Mutex<Vec<Export>>>,
    stop: Arc<AtomicBool>,
}

impl Collector {
    pub fn start() -> Collector {
        Self::answering(Answer::Accept)
    }

    pub fn answering(answer: Answer) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let exports = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (kept, stopped) = (exports.clone(), stop.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let kept = kept.clone();
                thread::spawn(move || serve(conn, kept, answer));
            }
        });
        Collector {
            addr,
            exports,
            stop,
        }
    }

    /// The `tracing.otlp_endpoint` that reaches it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn exports(&self) -> Vec<Export> {
        self.exports.lock().unwrap().clone()
    }

    /// Every span received so far, in order.
    pub fn spans(&self) -> Vec<Received> {
        let mut out = Vec::new();
        for export in self.exports() {
            for resource_spans in export.request.resource_spans {
                let service_name = resource_spans
                    .resource
                    .as_ref()
                    .and_then(|r| attribute(&r.attributes, "service.name"))
                    .map(|v| match v {
                        Value::StringValue(s) => s,
                        other => panic!("service.name is not a string: {other:?}"),
                    })
                    .unwrap_or_default();
                for scope in resource_spans.scope_spans {
                    for span in scope.spans {
                        out.push(Received {
                            service_name: service_name.clone(),
                            span,
                        });
                    }
                }
            }
        }
        out
    }

    /// The spans received, once `cond` holds for them.
    pub fn spans_when(&self, what: &str, cond: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        wait_until(what, || cond(&self.spans()));
        self.spans()
    }

    /// The first span of trace `trace_id` (hex), once it arrives.
    pub fn span_of_trace(&self, trace_id: &str) -> Received {
        let spans = self.spans_when(&format!("a span of trace {trace_id}"), |spans| {
            spans.iter().any(|s| s.trace_id() == trace_id)
        });
        spans
            .into_iter()
            .find(|s| s.trace_id() == trace_id)
            .unwrap()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Serves one connection: reads each request (Content-Length bodies), records it, answers.
fn serve(conn: TcpStream, exports: Arc<Mutex<Vec<Export>>>, answer: Answer) {
    let mut writer = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = Vec::new();
            if reader.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
                return;
            }
            head.extend_from_slice(&line);
            if line == b"\r\n" {
                break;
            }
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        req.parse(&head).expect("an HTTP/1.1 request head");
        let header = |name: &str| {
            req.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).into_owned())
        };
        let length: usize = header("content-length")
            .expect("the exporter sends a Content-Length")
            .parse()
            .unwrap();
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let request = ExportTraceServiceRequest::decode(body.as_slice())
            .expect("the body is an ExportTraceServiceRequest");
        exports.lock().unwrap().push(Export {
            method: req.method.unwrap().to_owned(),
            path: req.path.unwrap().to_owned(),
            content_type: header("content-type").unwrap_or_default(),
            body,
            request,
        });
        if answer == Answer::Stall {
            // Holds the connection open, never answering, until the gateway gives up on it.
            let _ = reader.read_to_end(&mut Vec::new());
            return;
        }
        let reply = ExportTraceServiceResponse::default().encode_to_vec();
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
            reply.len()
        );
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(&reply).is_err() {
            return;
        }
    }
}
