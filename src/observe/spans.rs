//! What a request's span says, decided from its finished record ([`Exchange`]): the route in
//! its name, the HTTP and gateway attributes, an event where each phase ended, and whether it
//! failed. [`outline`] is pure, so everything a span carries beyond the request line and the
//! few headers [`crate::observe::trace`] reads at the start is in this one function; the
//! record holds no token, so neither can a span.

use std::time::{Instant, SystemTime};

use opentelemetry::{Array, KeyValue, StringValue, Value};

use crate::api::failure::Chain;
use crate::api::openapi::public_path;
use crate::config::Bases;
use crate::observe::exchange::{method_name, Exchange, Phase, Protocol};
use crate::observe::trace::SpanOutline;

/// Ends the request's span, if it has one, as its record says.
pub fn finish(ex: &mut Exchange, bases: &Bases) {
    if let Some(span) = ex.span.take() {
        let outline = if span.is_recording() {
            outline(ex, bases)
        } else {
            SpanOutline::default()
        };
        span.finish(outline);
    }
}

/// The span of the request `ex` records, with its routes read under `bases`.
pub fn outline(ex: &Exchange, bases: &Bases) -> SpanOutline {
    let route = match (ex.version, ex.operation) {
        (Some(version), Some(operation)) => Some(public_path(bases, version, operation)),
        _ => None,
    };
    let protocol_version = match ex.protocol {
        Protocol::Http1 => "1.1",
        Protocol::Http2 => "2",
    };
    let mut attributes = vec![
        KeyValue::new("network.protocol.version", protocol_version),
        KeyValue::new("agent_gateway.request_id", ex.request_id.clone()),
        KeyValue::new("agent_gateway.auth", ex.auth_outcome()),
    ];
    if ex.status != 0 {
        attributes.push(KeyValue::new(
            "http.response.status_code",
            i64::from(ex.status),
        ));
    }
    if let Some(route) = &route {
        attributes.push(KeyValue::new("http.route", route.clone()));
    }
    if let Some(version) = ex.version {
        attributes.push(KeyValue::new("agent_gateway.api_version", version.as_str()));
    }
    if let Some(operation) = ex.operation {
        attributes.push(KeyValue::new("agent_gateway.operation", operation.as_str()));
    }
    if let Some(agent) = &ex.agent_id {
        attributes.push(KeyValue::new("agent_gateway.agent_id", agent.to_string()));
    }
    if let Some(reply) = ex.refused {
        attributes.push(KeyValue::new(
            "agent_gateway.message_code",
            i64::from(reply.message_code()),
        ));
    }
    if let Some(failure) = &ex.failure {
        attributes.push(KeyValue::new(
            "agent_gateway.cause",
            Chain(failure).to_string(),
        ));
    }
    if let Some(rule) = ex.validation_failure {
        attributes.push(KeyValue::new(
            "agent_gateway.validation_failure",
            rule.as_str(),
        ));
    }
    attributes.push(KeyValue::new("http.request.body.size", ex.bytes_in as i64));
    attributes.push(KeyValue::new(
        "http.response.body.size",
        ex.bytes_out as i64,
    ));
    if ex.client_aborted {
        attributes.push(KeyValue::new("agent_gateway.client_aborted", true));
    }
    let up = &ex.upstream;
    if let Some(address) = up.address {
        attributes.push(KeyValue::new(
            "agent_gateway.upstream.address",
            address.to_string(),
        ));
        attributes.push(KeyValue::new("agent_gateway.upstream.reused", up.reused));
    }
    if let Some(path) = &up.path {
        // Without the query, like the access log: a query may carry data not to be kept.
        let path = path.split('?').next().unwrap_or(path);
        attributes.push(KeyValue::new(
            "agent_gateway.upstream.path",
            path.to_owned(),
        ));
    }
    if !up.errors.is_empty() {
        let kinds = up
            .errors
            .iter()
            .map(|k| StringValue::from(k.as_str()))
            .collect();
        attributes.push(KeyValue::new(
            "agent_gateway.upstream.errors",
            Value::Array(Array::String(kinds)),
        ));
    }
    let failure = failure(ex);
    if let Some((error_type, _)) = &failure {
        attributes.push(KeyValue::new("error.type", error_type.clone()));
    }
    SpanOutline {
        name: route.map(|r| format!("{} {r}", method_name(ex.method.as_ref()))),
        attributes,
        events: events(ex),
        error: failure.map(|(_, description)| description),
    }
}

/// `error.type` and the status description of a request that failed on the gateway's side:
/// a 5xx (the backend's own, or the gateway's answer when the backend failed), or an answer
/// the backend broke off. A 4xx is the client's error, not the server span's (HTTP semantic
/// conventions); `agent_gateway.message_code` says which refusal it was.
fn failure(ex: &Exchange) -> Option<(String, String)> {
    let last_error = || ex.upstream.errors.last().map_or("other", |k| k.as_str());
    if ex.closed_by_gateway {
        return Some((
            "closed_by_gateway".to_owned(),
            "the gateway closed the connection before the answer was through".to_owned(),
        ));
    }
    if let Some(reply) = ex.refused.filter(|r| r.status() >= 500) {
        return Some((last_error().to_owned(), reply.message().to_owned()));
    }
    if ex.upstream.answer_broken {
        return Some((
            last_error().to_owned(),
            "the backend broke off its answer".to_owned(),
        ));
    }
    (ex.status >= 500).then(|| {
        (
            ex.status.to_string(),
            format!("the backend answered {}", ex.status),
        )
    })
}

/// An event where each phase ended, in order: admission, the body, its validation, the
/// backend's new connection, its answer's head (or the failure), the end of its answer.
fn events(ex: &Exchange) -> Vec<(&'static str, SystemTime)> {
    let at = |instant: Instant| ex.started_at + instant.saturating_duration_since(ex.started);
    let mut events: Vec<_> = Phase::ALL
        .iter()
        .filter_map(|&p| Some((p.as_str(), at(ex.phase_ends[p as usize]?))))
        .collect();
    let up = &ex.upstream;
    if let Some(started) = up.started.map(at) {
        if let Some(t) = up.connect_time {
            events.push(("upstream.connected", started + t));
        }
        // The gateway's own 5xx: the backend failed where an answer's head was expected
        // (then the header time is the failure's, and there is no answer to end), or its
        // answer broke off before any of the body went out.
        let failed = ex.refused.is_some_and(|r| r.status() >= 500);
        if let Some(t) = up.header_time {
            let name = if failed && up.duration.is_none() {
                "upstream.failed"
            } else {
                "upstream.response_head"
            };
            events.push((name, started + t));
        }
        // An answer whose body broke off ends where it failed.
        if let Some(t) = up.duration {
            let name = if failed || up.answer_broken {
                "upstream.failed"
            } else {
                "upstream.response_end"
            };
            events.push((name, started + t));
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::api::failure::UpstreamErrorKind;
    use crate::api::operation::{ApiVersion, Operation};
    use crate::api::reply::Reply;
    use crate::config::testing;

    fn routed(status: u16) -> Exchange<'static> {
        let mut ex = Exchange::start(
            Protocol::Http1,
            Some(&http::Method::GET),
            "/api/v2/transaction/tx-1/status",
        );
        ex.request_id = "rid".into();
        ex.version = Some(ApiVersion::V2);
        ex.operation = Some(Operation::TransactionStatus);
        ex.status = status;
        ex
    }

    fn attribute(outline: &SpanOutline, key: &str) -> Option<Value> {
        outline
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
    }

    #[test]
    fn the_name_and_route_are_the_operations_template_under_the_configured_base() {
        let mut bases = testing::snapshot().bases;
        bases.v2 = crate::config::BasePath::parse("/gw/v2").unwrap();
        let outline = outline(&routed(200), &bases);
        assert_eq!(
            outline.name.as_deref(),
            Some("GET /gw/v2/transaction/{transaction_id}/status")
        );
        assert_eq!(
            attribute(&outline, "http.route"),
            Some("/gw/v2/transaction/{transaction_id}/status".into())
        );
        assert_eq!(outline.error, None);
        let unrouted = Exchange::start(Protocol::Http1, Some(&http::Method::GET), "/nope");
        assert_eq!(outline_of(&unrouted).name, None);
    }

    fn outline_of(ex: &Exchange) -> SpanOutline {
        outline(ex, &testing::snapshot().bases)
    }

    #[test]
    fn only_failures_on_the_gateways_side_are_errors() {
        assert_eq!(outline_of(&routed(404)).error, None);
        let backend_503 = outline_of(&routed(503));
        assert_eq!(attribute(&backend_503, "error.type"), Some("503".into()));
        assert_eq!(
            backend_503.error.as_deref(),
            Some("the backend answered 503")
        );

        let mut timed_out = routed(504);
        timed_out.refused = Some(Reply::UpstreamTimeout);
        timed_out.upstream.errors = vec![UpstreamErrorKind::Reset, UpstreamErrorKind::Timeout];
        let outline = outline_of(&timed_out);
        assert_eq!(attribute(&outline, "error.type"), Some("timeout".into()));
        assert_eq!(
            outline.error.as_deref(),
            Some(Reply::UpstreamTimeout.message())
        );

        let mut broken = routed(200);
        broken.upstream.errors = vec![UpstreamErrorKind::Reset];
        broken.upstream.answer_broken = true;
        let outline = outline_of(&broken);
        assert_eq!(attribute(&outline, "error.type"), Some("reset".into()));
        assert!(outline.error.is_some());

        // The gateway's own cut is not the backend's doing, whatever status it leaves.
        for head_sent in [false, true] {
            let mut cut = routed(200);
            cut.answer_lost(true, head_sent);
            let outline = outline_of(&cut);
            assert_eq!(
                attribute(&outline, "error.type"),
                Some("closed_by_gateway".into())
            );
            assert_eq!(
                outline.error.as_deref(),
                Some("the gateway closed the connection before the answer was through")
            );
        }
    }

    #[test]
    fn events_are_placed_on_the_records_clock_in_phase_order() {
        let mut ex = routed(200);
        let (t0, at0) = (ex.started, ex.started_at);
        let ms = Duration::from_millis;
        ex.phase_ends[Phase::Admitted as usize] = Some(t0 + ms(1));
        ex.upstream.started = Some(t0 + ms(2));
        ex.upstream.connect_time = Some(ms(3));
        ex.upstream.header_time = Some(ms(5));
        ex.upstream.duration = Some(ms(8));
        assert_eq!(
            outline_of(&ex).events,
            [
                ("gateway.admitted", at0 + ms(1)),
                ("upstream.connected", at0 + ms(5)),
                ("upstream.response_head", at0 + ms(7)),
                ("upstream.response_end", at0 + ms(10)),
            ]
        );
    }

    #[test]
    fn an_answer_broken_off_ends_where_it_failed() {
        let ms = Duration::from_millis;
        let timed = |ex: &mut Exchange| {
            ex.upstream.started = Some(ex.started);
            ex.upstream.header_time = Some(ms(5));
        };
        let names = |ex: &Exchange| {
            outline_of(ex)
                .events
                .iter()
                .map(|(name, _)| *name)
                .collect::<Vec<_>>()
        };
        // No head came: the header time is the failure's.
        let mut no_head = routed(502);
        timed(&mut no_head);
        no_head.refused = Some(Reply::UpstreamBroken);
        assert_eq!(names(&no_head), ["upstream.failed"]);
        // A head, then the body broke before any of it went out: the gateway's 502.
        let mut replaced = routed(502);
        timed(&mut replaced);
        replaced.upstream.duration = Some(ms(9));
        replaced.refused = Some(Reply::UpstreamBroken);
        assert_eq!(
            names(&replaced),
            ["upstream.response_head", "upstream.failed"]
        );
        // A head and part of the body went out, then it broke: the client's answer is cut.
        let mut cut = routed(200);
        timed(&mut cut);
        cut.upstream.duration = Some(ms(9));
        cut.upstream.answer_broken = true;
        assert_eq!(names(&cut), ["upstream.response_head", "upstream.failed"]);
    }

    #[test]
    fn a_query_never_reaches_the_span() {
        let mut ex = routed(200);
        ex.upstream.path = Some("/api/v2/transaction/tx-1/status?token=t0ps3cret".into());
        let outline = outline_of(&ex);
        assert!(!format!("{outline:?}").contains("t0ps3cret"), "{outline:?}");
        assert_eq!(
            attribute(&outline, "agent_gateway.upstream.path"),
            Some("/api/v2/transaction/tx-1/status".into())
        );
    }
}
