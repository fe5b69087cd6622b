//! The request pipeline, the same for every client protocol.
//!
//! Per request: keep or mint the request id → [`admit`] (the whole header-stage policy) →
//! the rate limiter's verdict → read and check the body → send it upstream ([`super::upstream`])
//! → relay the answer ([`super::relay`]) → record what happened. Each refusal on the way is
//! the gateway's own [`Answer`]. The pipeline speaks to the client only through
//! [`Downstream`]: a protocol (HTTP/1.1 in [`super::h1`]) supplies the request's head and
//! body and renders answers, and keeps its own connection state.

use std::future::Future;
use std::time::Duration;

use bytes::BytesMut;
use http::HeaderValue;

use super::forwarding::UpstreamRequest;
use super::relay;
use super::ProxyApp;
use crate::api::reply::Reply;
use crate::api::schema;
use crate::config::{Snapshot, ValidationMode};
use crate::http1::Framing;
use crate::observe::exchange::Exchange;
use crate::policy::admit::{self, admit, Forward, Refusal, RequestFacts, RequestView};
use crate::policy::request_id;

/// A client connection as the pipeline sees it: the current request, its body, and a way
/// to answer. Connection state (keep-alive, unread bytes) is the implementor's own.
pub trait Downstream: Send {
    type Request<'a>: RequestView
    where
        Self: 'a;

    /// The current request's head.
    fn request(&self) -> Self::Request<'_>;

    /// The client's IP address, as written into `X-Forwarded-For`.
    fn client_ip(&self) -> Option<&str>;

    /// Reads the whole request body, refusing it as soon as it is known to exceed
    /// `max_bytes` (the excess is never buffered) or when it is not in within `timeout`.
    fn read_body(
        &mut self,
        max_bytes: usize,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), Reply>> + Send;

    /// The body read by [`Self::read_body`].
    fn body(&self) -> &[u8];

    /// Sends one of the gateway's own answers, whole: `headers` then `body`. An error means
    /// the client went away.
    fn send_answer(
        &mut self,
        status: u16,
        headers: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> impl Future<Output = std::io::Result<()>> + Send;

    /// Whether a chunked answer from the backend must reach this client decoded.
    fn wants_decoded(&self) -> bool;

    /// Starts relaying the backend's answer: its status and the headers to pass on. `body`
    /// says how the body that follows in [`Self::out`] ends.
    fn start_response<'h>(
        &mut self,
        status: u16,
        reason: &[u8],
        headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
        body: Framing,
    );

    /// Where the answer's body bytes go before [`Self::send`].
    fn out(&mut self) -> &mut BytesMut;

    /// Sends what [`Self::start_response`] and [`Self::out`] hold; `end` with the last of it.
    /// An error means the client went away.
    fn send(&mut self, end: bool) -> impl Future<Output = std::io::Result<()>> + Send;

    /// The answer under way cannot be completed (the backend broke mid-body): the client
    /// must not take what it got for a whole answer.
    fn abort(&mut self);
}

/// A header of the gateway's own, as the bytes a protocol writes.
pub(super) fn header_bytes<'a>(
    (name, value): &'a (&'static str, HeaderValue),
) -> (&'a [u8], &'a [u8]) {
    (name.as_bytes(), value.as_bytes())
}

impl ProxyApp {
    /// Serves the request whose head `d` holds, under one snapshot from start to end.
    pub(super) async fn serve<D: Downstream>(&self, d: &mut D, snap: &Snapshot) {
        let _in_flight = (self.in_flight.enter(), self.telemetry.in_flight());
        let mut ex = {
            let req = d.request();
            let method =
                http::Method::from_bytes(req.method().as_bytes()).unwrap_or(http::Method::GET);
            let mut ex = Exchange::start(&method, req.path());
            ex.request_id = request_id::client_value(&req).unwrap_or_else(|| self.ids.next_id());
            ex
        };
        self.serve_admitted(d, snap, &mut ex).await;
        self.telemetry.record(&ex);
    }

    /// Answers a request whose head could not be read at all.
    pub(super) async fn refuse_unreadable<D: Downstream>(&self, d: &mut D, reply: Reply) {
        let _in_flight = (self.in_flight.enter(), self.telemetry.in_flight());
        tracing::debug!(status = reply.status(), "unreadable request");
        let mut ex = Exchange::start(&http::Method::GET, "");
        ex.request_id = self.ids.next_id();
        ex.refused = Some(reply);
        self.answer(d, &mut ex, reply, None, &[]).await;
        self.telemetry.record(&ex);
    }

    async fn serve_admitted<D: Downstream>(&self, d: &mut D, snap: &Snapshot, ex: &mut Exchange) {
        let admitted = admit(
            snap,
            &RequestFacts::of(&d.request(), &ex.request_id, ex.started_at),
        );
        let forward = match admitted {
            Ok(forward) => forward,
            Err(refusal) => return self.refuse(d, snap, ex, &refusal).await,
        };
        ex.identified(&forward.who);
        // Only authenticated requests reach the bucket, so strangers cannot spend an agent's
        // budget; and only ones admitted otherwise, so a refused request spends none.
        if let Some((agent, limit)) = forward.rate_limit {
            if let Err(wait) = self.rate_limits.check(&agent.id, limit, ex.started) {
                return self
                    .refuse(d, snap, ex, &admit::rate_limited(&forward, wait))
                    .await;
            }
        }
        let signals = admit::retirement_signals(snap, &forward.who);
        let body = forward.body;
        if let Err(reply) = d
            .read_body(body.max_bytes, snap.limits.client_body_timeout)
            .await
        {
            ex.refused = Some(reply);
            return self.answer(d, ex, reply, None, signals).await;
        }
        ex.bytes_in = d.body().len();
        if let Some(schema) = body.schema {
            if let Err(violation) = schema::validate(schema, d.body()) {
                let message = violation.message();
                tracing::info!(request_id = %ex.request_id, %message, "request body breaks the schema");
                ex.validation_failure = Some(violation.rule);
                if body.mode == ValidationMode::Enforce {
                    ex.refused = Some(Reply::InvalidBody);
                    return self
                        .answer(d, ex, Reply::InvalidBody, Some(&message), signals)
                        .await;
                }
            }
        }
        self.forward(d, snap, ex, &forward, signals).await;
    }

    /// Sends the admitted request upstream and relays the answer, or answers the failure.
    async fn forward<D: Downstream>(
        &self,
        d: &mut D,
        snap: &Snapshot,
        ex: &mut Exchange,
        forward: &Forward<'_>,
        signals: &[(&'static str, HeaderValue)],
    ) {
        let exchanged = {
            let req = d.request();
            let request = UpstreamRequest {
                view: &req,
                body: d.body(),
                path: &forward.upstream_path,
                request_id: &ex.request_id,
                client_ip: d.client_ip(),
            };
            self.upstream
                .exchange(snap, &request, forward.idempotent(), &mut ex.upstream)
                .await
        };
        ex.upstream.path = Some(forward.upstream_path.clone());
        match exchanged {
            Ok(up) => relay::relay(self, d, up, snap, ex, signals).await,
            Err(reply) => {
                ex.refused = Some(reply);
                self.answer(d, ex, reply, None, signals).await;
            }
        }
    }

    /// Answers an admission refusal.
    async fn refuse<D: Downstream>(
        &self,
        d: &mut D,
        snap: &Snapshot,
        ex: &mut Exchange,
        refusal: &Refusal<'_>,
    ) {
        ex.refused(refusal);
        let signals = admit::retirement_signals(snap, &refusal.who);
        self.answer(d, ex, refusal.reply, refusal.hint.as_deref(), signals)
            .await;
    }

    /// Sends one of the gateway's own answers, with the request id and `signals`.
    async fn answer<D: Downstream>(
        &self,
        d: &mut D,
        ex: &mut Exchange,
        reply: Reply,
        hint: Option<&str>,
        signals: &[(&'static str, HeaderValue)],
    ) {
        let answer = reply.answer(hint);
        ex.status = answer.status;
        ex.bytes_out = answer.body.len();
        let headers: Vec<(&[u8], &[u8])> = answer
            .headers
            .iter()
            .map(header_bytes)
            .chain([(request_id::HEADER.as_bytes(), ex.request_id.as_bytes())])
            .chain(signals.iter().map(header_bytes))
            .collect();
        let sent = d.send_answer(answer.status, &headers, &answer.body).await;
        ex.client_aborted |= sent.is_err();
    }
}
