//! A stand-in for the v2 Agent REST Service, for the demo, tests and load tests.
//!
//! It serves the five v2 operations under a base path, checks the required fields of each
//! request body (spec section 2), answers 200 with a ServiceAgentResponse-shaped body that
//! carries a generated `transaction_id`, and answers GET status for the ids it issued
//! (404 otherwise). POSTs without both auth headers get the spec's 401 string body. Every
//! answer is made for its request (a transaction's status changes), so it says
//! `Cache-Control: no-store`, as a real backend's should: the gateway relays it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::{json, Value};

use crate::api::operation::Operation;
use crate::api::route::match_route;
use crate::config::BasePath;
use crate::config::Bases;
use crate::policy::auth::{AGENT_ID_HEADER, AUTH_TOKEN_HEADER};
use crate::policy::request_id;

/// Largest body the mock reads; it is a test double, not a limit anyone tunes.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// The body fields the mock insists on for `op`, standing in for the real service's checks.
fn required_fields(op: Operation) -> &'static [&'static str] {
    match op {
        Operation::VerifyRequest => &["business_code"],
        Operation::ConnectionInvitation => &["organization_name"],
        Operation::CredentialOffer => &["organization_name", "credential_def_id"],
        Operation::VerifyResponse | Operation::TransactionStatus => &[],
    }
}

pub struct MockBackend {
    bases: Bases,
    issued: Mutex<HashSet<String>>,
    next_id: AtomicU64,
}

impl MockBackend {
    /// A mock serving the v2 operations under `base` (e.g. `/api/v2`).
    pub fn new(base: BasePath) -> Self {
        // The route matcher needs a v1 base too; one that cannot collide with `base` keeps
        // the mock strictly v2.
        let v1 = BasePath::parse("/-mock-has-no-v1-").expect("static path is valid");
        Self {
            bases: Bases {
                v1,
                v2: base.clone(),
                upstream: base,
            },
            issued: Mutex::new(HashSet::new()),
            next_id: AtomicU64::new(1),
        }
    }

    fn issue(&self) -> String {
        let id = format!("tx-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        self.issued
            .lock()
            .expect("mock state lock")
            .insert(id.clone());
        id
    }

    /// The answer to one request, as status and JSON body.
    fn answer(&self, method: &str, path: &str, has_auth: bool, body: &[u8]) -> (u16, Value) {
        let route = match match_route(&self.bases, method, path) {
            Ok(r) => r,
            Err(crate::api::route::RouteError::MethodNotAllowed { .. }) => {
                return (405, sar(405, "method not allowed"))
            }
            Err(_) => return (404, sar(404, "not found")),
        };
        if route.operation == Operation::TransactionStatus {
            let id = route.transaction_id.unwrap_or_default();
            if self.issued.lock().expect("mock state lock").contains(id) {
                let mut v = sar(200, "OK");
                v["transaction_id"] = json!(id);
                v["state"] = json!("pending");
                return (200, v);
            }
            return (404, sar(404, "unknown transaction"));
        }
        if !has_auth {
            return (401, json!("not authorized"));
        }
        let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else {
            return (400, sar(400, "body must be a JSON object"));
        };
        if let Some(missing) = required_fields(route.operation)
            .iter()
            .find(|f| !fields.get(**f).is_some_and(Value::is_string))
        {
            return (
                400,
                sar(400, &format!("{missing} is required and must be a string")),
            );
        }
        let mut v = sar(200, "OK");
        v["transaction_id"] = json!(self.issue());
        if let Some(code) = route.service {
            v["service_business_code"] = json!(code);
        }
        (200, v)
    }
}

/// A ServiceAgentResponse body.
fn sar(status: u16, message: &str) -> Value {
    json!({"status_code": status, "message_code": if status == 200 { 0 } else { u32::from(status) * 100 }, "message": message})
}

#[async_trait]
impl ServeHttp for MockBackend {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let mut body = Vec::new();
        let mut too_large = false;
        while let Ok(Some(chunk)) = session.read_request_body().await {
            if body.len() + chunk.len() > MAX_BODY {
                too_large = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let req = session.req_header();
        let has_auth = req.headers.contains_key(AGENT_ID_HEADER)
            && req.headers.contains_key(AUTH_TOKEN_HEADER);
        let (status, value) = if too_large {
            (413, sar(413, "too large"))
        } else {
            self.answer(req.method.as_str(), req.uri.path(), has_auth, &body)
        };
        let out = value.to_string().into_bytes();
        let mut resp = Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::CONTENT_LENGTH, out.len())
            .header(http::header::CACHE_CONTROL, "no-store");
        if let Some(id) = req.headers.get(request_id::HEADER) {
            resp = resp.header(request_id::HEADER, id.clone());
        }
        resp.body(out).expect("static response parts are valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mock() -> MockBackend {
        MockBackend::new(BasePath::parse("/api/v2").unwrap())
    }

    #[test]
    fn issues_ids_and_answers_status_for_them() {
        let m = mock();
        let (s, v) = m.answer(
            "POST",
            "/api/v2/verify/S/request",
            true,
            br#"{"business_code":"B"}"#,
        );
        assert_eq!(s, 200);
        let id = v["transaction_id"].as_str().unwrap().to_string();
        let (s, v) = m.answer(
            "GET",
            &format!("/api/v2/transaction/{id}/status"),
            false,
            b"",
        );
        assert_eq!((s, v["transaction_id"].as_str()), (200, Some(id.as_str())));
        let (s, _) = m.answer("GET", "/api/v2/transaction/tx-999/status", false, b"");
        assert_eq!(s, 404);
    }

    #[test]
    fn checks_required_fields_and_auth() {
        let m = mock();
        let offer = "/api/v2/credential/S/offer";
        assert_eq!(
            m.answer("POST", offer, true, br#"{"organization_name":"o"}"#)
                .0,
            400
        );
        assert_eq!(m.answer("POST", offer, true, b"[]").0, 400);
        assert_eq!(m.answer("POST", offer, false, b"{}").0, 401);
        let ok = br#"{"organization_name":"o","credential_def_id":"d"}"#;
        assert_eq!(m.answer("POST", offer, true, ok).0, 200);
        assert_eq!(
            m.answer("POST", "/api/v2/verify/response", true, b"{}").0,
            200
        );
        assert_eq!(
            m.answer("POST", "/api/v1/verify/request", true, b"{}").0,
            404
        );
    }
}
