//! The request pipeline, the same for every client protocol.
//!
//! Per request: keep or mint the request id and start its span → [`admit()`] (the whole
//! header-stage policy) → the rate limiter's verdict → read and check the body → send it
//! upstream ([`super::upstream`]) → relay the answer ([`super::relay`]) → record what
//! happened, and end the span from that record. Each refusal on the way is the gateway's own
//! [`crate::api::reply::Answer`]; a failure (the head, the body, the backend) arrives as the
//! error it was, which the record keeps ([`Exchange::failed`]) and `api::reply` answers. The
//! span travels in the record ([`Exchange`]), which notes where each phase ended. The
//! pipeline speaks to the client only through [`Downstream`]: a protocol (HTTP/1.1 in
//! [`super::h1`], HTTP/2 in [`super::h2`]) supplies the request's head and body and renders
//! answers, and keeps its own connection state.

use std::net::IpAddr;
use std::pin::pin;

use super::downstream::{header_bytes, Downstream};
use super::forwarding::UpstreamRequest;
use super::relay;
use super::upstream::Unanswered;
use super::ProxyApp;
use crate::api::failure::{Chain, Failure, UnreadableHead};
use crate::api::reply::Reply;
use crate::api::{route, schema};
use crate::config::{Snapshot, ValidationMode};
use crate::observe::exchange::{Exchange, Phase};
use crate::observe::spans;
use crate::observe::trace::RequestSpan;
use crate::policy::admit::{
    self, admit, throttled, Forward, Refusal, RequestFacts, RequestView, RetirementHeaders,
};
use crate::policy::client::{self, FORWARDED_FOR, FORWARDED_PROTO};
use crate::policy::request_id;
use crate::policy::throttle::Verdict;

impl ProxyApp {
    /// Serves the request whose head `d` holds, under one snapshot from start to end.
    pub(super) async fn serve<D: Downstream>(&self, d: &mut D, snap: &Snapshot) {
        let _in_flight = self.telemetry.in_flight.enter();
        // One view of the head for the record and for admission.
        let (mut ex, admitted) = {
            let req = d.request();
            let method = http::Method::from_bytes(req.method().as_bytes()).ok();
            let mut ex = Exchange::start(d.protocol(), method.as_ref(), req.path());
            ex.request_id = request_id::client_value(&req).unwrap_or_else(|| self.ids.next_id());
            let peer = d.client_ip();
            let trusted = &snap.edge.trusted_proxies;
            ex.client_addr = peer.map(|peer| {
                client::client_address(peer, req.headers_named(FORWARDED_FOR), trusted)
            });
            ex.user_agent = req
                .single_header("user-agent")
                .map(|v| String::from_utf8_lossy(v).into_owned());
            ex.span = self.tracer.start(snap, &req, ex.client_addr, ex.started_at);
            let admitted = self.admit_unless_throttled(snap, &req, &ex);
            (ex, admitted)
        };
        self.serve_admitted(d, snap, &mut ex, admitted).await;
        self.telemetry.record(&ex);
        spans::finish(&mut ex, &snap.bases);
    }

    /// Answers a request whose head could not be read at all: it has no method or path.
    pub(super) async fn refuse_unreadable<D: Downstream>(
        &self,
        d: &mut D,
        snap: &Snapshot,
        unreadable: UnreadableHead,
    ) {
        let _in_flight = self.telemetry.in_flight.enter();
        let mut ex = Exchange::start(d.protocol(), None, "");
        ex.request_id = self.ids.next_id();
        ex.span = self.tracer.start_unreadable(ex.started_at);
        let reply = ex.failed(unreadable);
        tracing::debug!(request_id = %ex.request_id, status = reply.status(), error = %Chain(&unreadable), "unreadable request");
        self.answer(d, &mut ex, reply, None, &RetirementHeaders::default())
            .await;
        self.telemetry.record(&ex);
        spans::finish(&mut ex, &snap.bases);
    }

    /// Admission of the request `req` (recorded in `ex`), unless its client address is past
    /// `auth.max_failures_per_minute`: then it is refused before anything of it is looked
    /// at, and its credential is not checked.
    fn admit_unless_throttled<'s, R: RequestView>(
        &self,
        snap: &'s Snapshot,
        req: &R,
        ex: &Exchange<'_>,
    ) -> Result<Forward<'s>, Refusal<'s>> {
        if let Some((limit, client)) = snap.auth.max_failures_per_minute.zip(ex.client_addr) {
            let verdict = self.failed_auths.verdict(client, limit, ex.started);
            if let Verdict::Throttled {
                retry_after_secs,
                first,
            } = verdict
            {
                if first {
                    tracing::warn!(client_addr = %client, limit, retry_after_secs, "too many failed authentications from this address: its requests get 429 for the rest of the minute");
                }
                return Err(throttled(snap, req.method(), req.path(), retry_after_secs));
            }
        }
        admit(snap, &RequestFacts::of(req, &ex.request_id, ex.started_at))
    }

    async fn serve_admitted<'s, D: Downstream>(
        &self,
        d: &mut D,
        snap: &'s Snapshot,
        ex: &mut Exchange<'s>,
        admitted: Result<Forward<'s>, Refusal<'s>>,
    ) {
        let mut forward = match admitted {
            Ok(forward) => forward,
            Err(refusal) => {
                let counted = snap.auth.max_failures_per_minute.and(ex.client_addr);
                if let (Some(client), Some(_)) = (counted, refusal.auth_failure) {
                    if !self.failed_auths.count_failure(client, ex.started) {
                        self.telemetry.auth_failure_untracked();
                    }
                }
                return self.refuse(d, ex, &refusal).await;
            }
        };
        ex.identified(&forward.who);
        // Only authenticated requests reach the bucket, so strangers cannot spend an agent's
        // budget; and only ones admitted otherwise, so a refused request spends none.
        if let Some((agent, limit)) = forward.rate_limit {
            let decision = self
                .rate_limits
                .check(&snap.rate_limit, &agent.id, limit, ex.started)
                .await;
            ex.rate_limit = Some(decision);
            if let Some(refusal) = admit::rate_limit_refusal(&forward, decision.outcome) {
                return self.refuse(d, ex, &refusal).await;
            }
        }
        ex.reached(Phase::Admitted);
        let retirement = &forward.retirement_headers;
        let body = forward.body;
        if let Err(e) = d
            .read_body(body.max_bytes, snap.limits.client_body_timeout)
            .await
        {
            tracing::debug!(request_id = %ex.request_id, error = %Chain(&e), "request body not read");
            let reply = ex.failed(e);
            return self.answer(d, ex, reply, None, retirement).await;
        }
        ex.bytes_in = d.body().len();
        ex.reached(Phase::BodyReceived);
        if let Some(schema) = body.schema {
            if let Err(violation) = schema::validate(schema, d.body()) {
                let message = violation.message();
                tracing::info!(request_id = %ex.request_id, %message, "request body breaks the schema");
                ex.validation_failure = Some(violation.rule);
                if body.mode == ValidationMode::Enforce {
                    ex.refused = Some(Reply::InvalidBody);
                    return self
                        .answer(d, ex, Reply::InvalidBody, Some(&message), retirement)
                        .await;
                }
            }
            ex.reached(Phase::BodyValidated);
        }
        self.forward(d, snap, ex, &mut forward).await;
    }

    /// Sends the admitted request upstream and relays the answer, or answers the failure.
    async fn forward<'s, D: Downstream>(
        &self,
        d: &mut D,
        snap: &'s Snapshot,
        ex: &mut Exchange<'s>,
        forward: &mut Forward<'s>,
    ) {
        // A client that has cancelled the request (an HTTP/2 reset) has it sent nowhere.
        if d.cancelled() {
            ex.client_gone(d.closed_by_gateway());
            return;
        }
        let retirement = &forward.retirement_headers;
        // The backend is the one of now, not of the request's snapshot (DNS and reloads move
        // it), and the path goes under the base its addresses serve under: a reload since the
        // request started may have moved both at once.
        let backend = self.upstream.backend();
        let rebased = backend
            .base
            .as_ref()
            .and_then(|base| route::rebased(&forward.upstream_path, &snap.bases.upstream, base));
        if let Some(path) = &rebased {
            tracing::debug!(request_id = %ex.request_id, %path, "the backend's base changed since the request started; sent under the new one");
        }
        let exchanged = {
            let client_ip = d.client_ip();
            let (req, body, client_gone) = d.outgoing();
            let request = UpstreamRequest {
                view: &req,
                body,
                path: rebased.as_deref().unwrap_or(&forward.upstream_path),
                request_id: &ex.request_id,
                client_ip,
                proto: forwarded_proto(snap, &req, client_ip),
                trace: ex.span.as_ref().map(RequestSpan::propagation),
            };
            self.upstream
                .exchange(
                    snap,
                    &backend,
                    &request,
                    forward.idempotent(),
                    &mut ex.upstream,
                    pin!(Some(client_gone)),
                )
                .await
        };
        // The set is held no longer than the exchange: an address retired from it counts as
        // connected while anything holds it (`backends::Retired`).
        drop(backend);
        // The record keeps the path sent: the request has no more use for it.
        ex.upstream.path =
            Some(rebased.unwrap_or_else(|| std::mem::take(&mut forward.upstream_path)));
        // An answer that broke before any of its body went out is answered as a failed
        // exchange is.
        let relayed = match exchanged {
            Ok(up) => relay::relay(&self.upstream, d, up, snap, ex, retirement)
                .await
                .map_err(Failure::from),
            Err(Unanswered::Failed(e)) => Err(e),
            Err(Unanswered::ClientGone) => {
                tracing::debug!(request_id = %ex.request_id, "the client went while its request waited for a backend connection; not sent");
                ex.client_gone(d.closed_by_gateway());
                // Nobody reads an answer: the connection closes.
                d.abort();
                return;
            }
        };
        if let Err(e) = relayed {
            let reply = ex.failed(e);
            self.answer(d, ex, reply, None, retirement).await;
        }
    }

    /// Answers an admission refusal.
    async fn refuse<'s, D: Downstream>(
        &self,
        d: &mut D,
        ex: &mut Exchange<'s>,
        refusal: &Refusal<'s>,
    ) {
        ex.refused(refusal);
        let hint = refusal.hint.as_deref();
        self.answer(d, ex, refusal.reply, hint, &refusal.retirement_headers)
            .await;
    }

    /// Sends one of the gateway's own answers, with the request id and the `retirement` headers.
    async fn answer<D: Downstream>(
        &self,
        d: &mut D,
        ex: &mut Exchange<'_>,
        reply: Reply,
        hint: Option<&str>,
        retirement: &RetirementHeaders<'_>,
    ) {
        let answer = reply.answer(hint);
        ex.status = answer.status;
        ex.bytes_out = answer.body.len();
        let headers: Vec<(&[u8], &[u8])> = answer
            .headers
            .iter()
            .map(header_bytes)
            .chain([(request_id::HEADER.as_bytes(), ex.request_id.as_bytes())])
            .chain(retirement.headers())
            .collect();
        if d.send_answer(answer.status, &headers, &answer.body)
            .await
            .is_err()
        {
            ex.answer_lost(d.closed_by_gateway(), false);
        }
    }
}

/// `X-Forwarded-Proto` for a request `req` from the peer `peer`: a trusted proxy's own, else
/// the proxy listener's scheme.
fn forwarded_proto<R: RequestView>(snap: &Snapshot, req: &R, peer: Option<IpAddr>) -> &'static str {
    let trusted = peer.is_some_and(|ip| client::is_trusted(ip, &snap.edge.trusted_proxies));
    let claimed = req.single_header(FORWARDED_PROTO);
    client::forwarded_proto(trusted, claimed, snap.startup.proxy_tls)
}
