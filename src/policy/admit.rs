//! The per-request decision: route, authenticate, pick the service code, build the upstream path.
//!
//! [`plan`] is the gateway's whole policy for one request header, as a pure function of the
//! request line, the two auth headers and a config [`Snapshot`]. The pingora glue in
//! [`crate::proxy`] only reads the headers, calls it, and carries out the answer.

use crate::api::reply::Reply;
use crate::config::{Agent, Snapshot};
use crate::policy::auth::{authenticate, AuthFailure};
use crate::policy::retirement;
use std::time::SystemTime;

use crate::api::operation::{ApiVersion, Operation};
use crate::api::route::{match_route, path_template, upstream_path, RouteError, RouteMatch};

/// What a request is, as far as it was understood (for logs and metrics even when refused).
#[derive(Debug, Clone, Copy, Default)]
pub struct Identified<'s> {
    pub version: Option<ApiVersion>,
    pub operation: Option<Operation>,
    pub agent: Option<&'s Agent>,
}

/// A request that may go upstream.
#[derive(Debug)]
pub struct Forward<'s> {
    pub who: Identified<'s>,
    pub operation: Operation,
    pub upstream_path: String,
}

/// A request that is answered by the gateway itself.
#[derive(Debug)]
pub struct Refusal<'s> {
    pub who: Identified<'s>,
    pub reply: Reply,
    pub auth_failure: Option<AuthFailure>,
    /// What the client should do instead, appended to the reply's message.
    pub hint: Option<String>,
}

/// The request-line facts and auth headers `plan` needs.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'r> {
    pub method: &'r str,
    pub path: &'r str,
    pub query: Option<&'r str>,
    pub agent_id: Option<&'r [u8]>,
    pub token: Option<&'r [u8]>,
    /// Decides brownout membership, so a retry with the same id gets the same answer.
    pub request_id: &'r str,
    /// The time the retirement policy is judged at (injected, so tests need no real clock).
    pub now: SystemTime,
}

/// Decides what happens to one request under one snapshot.
pub fn plan<'s>(
    snapshot: &'s Snapshot,
    req: &RequestFacts<'_>,
) -> Result<Forward<'s>, Refusal<'s>> {
    let mut who = Identified::default();
    let route: RouteMatch<'_> = match match_route(&snapshot.bases, req.method, req.path) {
        Ok(r) => r,
        Err(e) => {
            // A wrong method on a known path still counts against its version and operation.
            if let RouteError::MethodNotAllowed { version, operation } = e {
                who.version = Some(version);
                who.operation = Some(operation);
            }
            return Err(Refusal {
                who,
                reply: e.into(),
                auth_failure: None,
                hint: None,
            });
        }
    };
    who.version = Some(route.version);
    who.operation = Some(route.operation);

    let needs_auth = route.operation.needs_auth(snapshot.auth.require_on_status);
    let refuse = |who, failure| Refusal {
        who,
        reply: Reply::Unauthorized,
        auth_failure: Some(failure),
        hint: None,
    };
    if needs_auth {
        let agent =
            authenticate(&snapshot.auth, req.agent_id, req.token).map_err(|f| refuse(who, f))?;
        who.agent = Some(agent);
    }

    let service = match (route.operation.is_service_scoped(), route.service) {
        (false, _) => "",
        (true, Some(v2_code)) => v2_code,
        (true, None) => who
            .agent
            .and_then(|a| a.default_service.as_ref())
            .unwrap_or(&snapshot.v1_default_service)
            .as_str(),
    };
    if route.operation.is_service_scoped() {
        if let Some(agent) = who.agent {
            if !agent.may_use(service) {
                return Err(refuse(who, AuthFailure::ServiceNotAllowed));
            }
        }
    }

    if route.version == ApiVersion::V1 {
        if let Err(refusal) =
            retirement::decide(&snapshot.retirement, who.agent, req.now, req.request_id)
        {
            let v2 = path_template(snapshot.bases.v2.as_str(), ApiVersion::V2, route.operation);
            return Err(Refusal {
                who,
                reply: Reply::V1Gone(refusal),
                auth_failure: None,
                hint: Some(format!("use {} {v2} instead", route.operation.method())),
            });
        }
    }

    Ok(Forward {
        who,
        operation: route.operation,
        upstream_path: upstream_path(&snapshot.bases.upstream, &route, service, req.query),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file::AgentFile;
    use crate::config::testing::{self, AGENT_ID};
    use crate::config::V1Policy;

    /// The test config with agent-1 changed by `edit`.
    fn snapshot(edit: impl FnOnce(&mut AgentFile), require_on_status: bool) -> Snapshot {
        let mut f = testing::config();
        f.auth.require_on_status = require_on_status;
        edit(f.agent_mut(AGENT_ID));
        f.snapshot()
    }

    fn unchanged(_: &mut AgentFile) {}

    fn facts<'r>(
        method: &'r str,
        path: &'r str,
        id: Option<&'r str>,
        token: Option<&'r str>,
    ) -> RequestFacts<'r> {
        RequestFacts {
            method,
            path,
            query: None,
            agent_id: id.map(str::as_bytes),
            token: token.map(str::as_bytes),
            request_id: "req-1",
            now: SystemTime::now(),
        }
    }

    /// `plan` for a request with agent-1's valid credentials.
    fn as_agent_1<'s>(
        s: &'s Snapshot,
        method: &str,
        path: &str,
    ) -> Result<Forward<'s>, Refusal<'s>> {
        plan(s, &facts(method, path, Some("agent-1"), Some("secret")))
    }

    #[test]
    fn v1_gets_the_global_default_code() {
        let s = snapshot(unchanged, true);
        let f = as_agent_1(&s, "POST", "/api/v1/verify/request").unwrap();
        assert_eq!(f.upstream_path, "/api/v2/verify/ORG_DEFAULT/request");
        assert_eq!(f.who.agent.unwrap().id, "agent-1");
        assert_eq!(f.who.version, Some(ApiVersion::V1));
    }

    #[test]
    fn v1_uses_the_agents_own_default_code() {
        let s = snapshot(|a| a.default_service = Some("OTHER".into()), true);
        let f = as_agent_1(&s, "POST", "/api/v1/credential/offer").unwrap();
        assert_eq!(f.upstream_path, "/api/v2/credential/OTHER/offer");
    }

    #[test]
    fn services_allow_list_applies_to_v1_and_v2() {
        let s = snapshot(|a| a.services = Some(vec!["A".into()]), true);
        let ok = as_agent_1(&s, "POST", "/api/v2/verify/A/request");
        assert!(ok.is_ok());
        for path in ["/api/v2/verify/B/request", "/api/v1/verify/request"] {
            let r = plan(&s, &facts("POST", path, Some("agent-1"), Some("secret"))).unwrap_err();
            assert_eq!(r.reply, Reply::Unauthorized);
            assert_eq!(
                r.auth_failure,
                Some(AuthFailure::ServiceNotAllowed),
                "{path}"
            );
        }
        // Operations without a service code are not limited by the list.
        assert!(as_agent_1(&s, "POST", "/api/v1/verify/response").is_ok());
    }

    #[test]
    fn status_auth_follows_require_on_status() {
        let strict = snapshot(unchanged, true);
        let r = plan(
            &strict,
            &facts("GET", "/api/v1/transaction/t/status", None, None),
        )
        .unwrap_err();
        assert_eq!(r.auth_failure, Some(AuthFailure::MissingHeaders));
        let lax = snapshot(unchanged, false);
        let f = plan(
            &lax,
            &facts("GET", "/api/v1/transaction/t/status", None, None),
        )
        .unwrap();
        assert_eq!(f.upstream_path, "/api/v2/transaction/t/status");
        assert!(f.who.agent.is_none());
    }

    #[test]
    fn a_blocked_agent_gets_410_naming_the_v2_path_on_v1_only() {
        let s = snapshot(|a| a.v1_policy = V1Policy::Block, true);
        let r = as_agent_1(&s, "POST", "/api/v1/credential/offer").unwrap_err();
        assert_eq!(
            r.reply,
            Reply::V1Gone(crate::api::reply::V1Refusal::Blocked)
        );
        assert_eq!(
            r.hint.as_deref(),
            Some("use POST /api/v2/credential/{service_business_code}/offer instead")
        );
        assert!(as_agent_1(&s, "POST", "/api/v2/credential/X/offer").is_ok());
        // Authentication comes first: a wrong token is still 401.
        let r = plan(
            &s,
            &facts(
                "POST",
                "/api/v1/credential/offer",
                Some("agent-1"),
                Some("bad"),
            ),
        )
        .unwrap_err();
        assert_eq!(r.reply, Reply::Unauthorized);
    }

    #[test]
    fn routing_errors_come_before_auth() {
        let s = snapshot(unchanged, true);
        let r = plan(&s, &facts("GET", "/nope", None, None)).unwrap_err();
        assert_eq!(r.reply, Reply::NotFound);
        assert_eq!(r.auth_failure, None);
        let r = plan(&s, &facts("GET", "/api/v1/verify/request", None, None)).unwrap_err();
        assert_eq!(r.reply, Reply::MethodNotAllowed { allow: "POST" });
        assert_eq!(r.who.version, Some(ApiVersion::V1));
        assert_eq!(r.who.operation, Some(Operation::VerifyRequest));
    }
}
