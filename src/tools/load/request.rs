//! The requests a run sends: which agent sends each and which operation it is, bodies valid
//! for each operation, paths, the request as HTTP/1.1 bytes or an HTTP/2 request, and the
//! transaction ids answers carry.

use std::collections::VecDeque;
use std::fmt;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, USER_AGENT};
use serde::{Deserialize, Serialize};

use crate::api::operation::{ApiVersion, Operation};
use crate::api::route::build_path;
use crate::client::redact::REDACTED;
use crate::http1::{percent_encode, RequestWriter};
use crate::policy::auth::{AGENT_ID_HEADER, AUTH_TOKEN_HEADER};

use super::agents::Token;
use super::args::{splitmix64, HeaderArg, Mix, Weights};

/// A realistic JSON body for `op` (spec section 2), varied by request index `i`.
/// `None` for the status read, which has no body. Written from borrowed fields (in the
/// order of their names, as a `serde_json::Value` would write them): building a `Value` tree
/// per request cost a dozen allocations.
pub fn request_body(op: Operation, i: u64, run: u64) -> Option<String> {
    let uid = format!("load-{run:08x}-{i}");
    let connection = format!("conn-{:012x}", splitmix64(i ^ run) & 0xffff_ffff_ffff);
    const ORGANIZATION: &str = "Acme Verification Services";
    const DEFINITION: &str = "Th7MpTaRZVRYnPiabds81Y:3:CL:12:membership";
    let body = match op {
        // Rule 1/2: with a connection_id the request goes there and allow_multiple_read does
        // not apply; without one, a pairwise connection is made first.
        Operation::VerifyRequest if i % 4 == 0 => to_json(&VerifyOnConnection {
            business_code: "KYC-BASIC",
            connection_id: &connection,
            request_uid: &uid,
        }),
        Operation::VerifyRequest => to_json(&Verify {
            allow_multiple_read: i % 2 == 0,
            business_code: "KYC-BASIC",
            request_uid: &uid,
        }),
        Operation::VerifyResponse => to_json(&VerifyResult {
            descriptions: [
                Description {
                    lang: "en",
                    message: "Proof of identity verified",
                },
                Description {
                    lang: "fr",
                    message: "Preuve d'identité vérifiée",
                },
            ],
            presentation_id: &format!("pres-{:016x}", splitmix64(i.wrapping_add(run))),
            result: i % 10 != 0,
        }),
        Operation::ConnectionInvitation => to_json(&Invitation {
            allow_multiple_read: i % 3 == 0,
            organization_name: ORGANIZATION,
            request_uid: &uid,
        }),
        // Rule 3: credential_values are mandatory with a connection_id.
        Operation::CredentialOffer if i % 2 == 0 => to_json(&OfferOnConnection {
            comment: "Your membership credential",
            connection_id: &connection,
            credential_def_id: DEFINITION,
            credential_values: [
                ("given_name", "Ada"),
                ("family_name", "Lovelace"),
                ("member_since", "2024-01-15"),
            ]
            .map(|(name, value)| CredentialValue {
                mime_type: "text/plain",
                name,
                value,
            }),
            organization_name: ORGANIZATION,
            request_uid: &uid,
        }),
        Operation::CredentialOffer => to_json(&Offer {
            comment: "Scan to receive your membership credential",
            credential_def_id: DEFINITION,
            organization_name: ORGANIZATION,
            request_uid: &uid,
        }),
        Operation::TransactionStatus => return None,
    };
    Some(body)
}

fn to_json<T: Serialize>(body: &T) -> String {
    serde_json::to_string(body).expect("plain fields serialize")
}

#[derive(Serialize)]
struct VerifyOnConnection<'a> {
    business_code: &'a str,
    connection_id: &'a str,
    request_uid: &'a str,
}

#[derive(Serialize)]
struct Verify<'a> {
    allow_multiple_read: bool,
    business_code: &'a str,
    request_uid: &'a str,
}

#[derive(Serialize)]
struct Description<'a> {
    lang: &'a str,
    message: &'a str,
}

#[derive(Serialize)]
struct VerifyResult<'a> {
    descriptions: [Description<'a>; 2],
    presentation_id: &'a str,
    result: bool,
}

#[derive(Serialize)]
struct Invitation<'a> {
    allow_multiple_read: bool,
    organization_name: &'a str,
    request_uid: &'a str,
}

#[derive(Serialize)]
struct CredentialValue<'a> {
    mime_type: &'a str,
    name: &'a str,
    value: &'a str,
}

#[derive(Serialize)]
struct OfferOnConnection<'a> {
    comment: &'a str,
    connection_id: &'a str,
    credential_def_id: &'a str,
    credential_values: [CredentialValue<'a>; 3],
    organization_name: &'a str,
    request_uid: &'a str,
}

#[derive(Serialize)]
struct Offer<'a> {
    comment: &'a str,
    credential_def_id: &'a str,
    organization_name: &'a str,
    request_uid: &'a str,
}

/// The request path of `op` under `prefix` for the given version and service code: the
/// gateway's own path shapes, with the segments filled in.
pub fn request_path(
    prefix: &str,
    api: ApiVersion,
    service: &str,
    op: Operation,
    transaction_id: &str,
) -> String {
    let base = format!("{prefix}/api/{}", api.as_str());
    build_path(
        &base,
        api,
        op,
        service,
        // A transaction id from a response becomes exactly one path segment.
        &percent_encode(transaction_id),
        None,
    )
}

/// Transaction ids remembered per agent on each connection, for status reads.
const TX_POOL: usize = 64;

/// One agent as the requests carry it.
#[derive(Debug, Clone)]
pub struct AgentScript {
    pub id: String,
    pub token: Token,
    /// The code in its v2 paths (empty for v1).
    pub service: String,
}

/// Everything needed to write request `i`; shared by every connection.
#[derive(Debug, Clone)]
pub struct Script {
    pub authority: String,
    pub prefix: String,
    pub api: ApiVersion,
    pub agents: Vec<AgentScript>,
    /// The agents' weights (indexed like `agents`).
    pub agent_weights: Weights,
    /// `-H`, on every request, after the generator's own headers.
    pub headers: Vec<HeaderArg>,
    pub mix: Mix,
    /// Distinguishes this run's request_uids and synthetic ids from another run's.
    pub run: u64,
}

/// The transaction ids answers returned on one connection, per agent: a status read asks for
/// one its own agent was given.
#[derive(Debug, Clone, Default)]
pub struct TxIds {
    by_agent: Vec<VecDeque<String>>,
}

impl TxIds {
    fn of(&self, agent: usize) -> Option<&VecDeque<String>> {
        self.by_agent.get(agent).filter(|ids| !ids.is_empty())
    }

    /// Remembers an id `agent` was given, forgetting its oldest beyond [`TX_POOL`].
    pub fn remember(&mut self, agent: usize, id: String) {
        if self.by_agent.len() <= agent {
            self.by_agent.resize_with(agent + 1, VecDeque::new);
        }
        let ids = &mut self.by_agent[agent];
        if ids.len() == TX_POOL {
            ids.pop_front();
        }
        ids.push_back(id);
    }
}

/// What every HTTP/2 request of a run shares ([`Script::h2_heads`]).
#[derive(Clone)]
pub struct H2Heads {
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// Each agent's id and token, indexed like the script's agents.
    agents: Vec<(HeaderValue, HeaderValue)>,
    /// user-agent and accept unless `-H` replaces them, then the `-H` headers.
    common: Vec<(HeaderName, HeaderValue)>,
}

/// By hand, so that no token or `-H` value is printed; each field named, so that one added
/// later is placed here too.
impl fmt::Debug for H2Heads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            scheme,
            authority,
            agents,
            common,
        } = self;
        let agents: Vec<_> = agents.iter().map(|(id, _)| (id, REDACTED)).collect();
        let common: Vec<_> = common.iter().map(|(name, _)| (name, REDACTED)).collect();
        f.debug_struct("H2Heads")
            .field("scheme", scheme)
            .field("authority", authority)
            .field("agents", &agents)
            .field("common", &common)
            .finish()
    }
}

const AGENT_ID: HeaderName = HeaderName::from_static(AGENT_ID_HEADER);
const AUTH_TOKEN: HeaderName = HeaderName::from_static(AUTH_TOKEN_HEADER);

/// One request, made and not yet written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// Index into the script's agents.
    pub agent: usize,
    pub op: Operation,
    pub path: String,
    pub body: Option<String>,
}

/// Salt of the agent draw, so that which agent sends request `i` does not follow which
/// operation it is.
const AGENT_DRAW: u64 = 0x5bd1_e995_0000_0001;

impl Script {
    /// The agent that sends request `i` (an index into `agents`): a deterministic draw with
    /// their weights.
    pub fn agent(&self, i: u64) -> usize {
        match self.agents.len() {
            1 => 0,
            _ => self.agent_weights.pick(splitmix64(i ^ AGENT_DRAW)),
        }
    }

    /// The operation request `i` performs. A status read needs a transaction id its agent
    /// was given on this connection (`known_ids`); until there is one it is another
    /// operation of the mix, drawn with the mix's weights, so that a run does not
    /// manufacture 404s. Only a mix of status reads alone reads ids nobody issued.
    pub fn operation(&self, i: u64, known_ids: bool) -> Operation {
        match self.mix.pick(i) {
            Operation::TransactionStatus if !known_ids => self
                .mix
                .pick_other_than(i, Operation::TransactionStatus)
                .unwrap_or(Operation::TransactionStatus),
            op => op,
        }
    }

    /// The agent and operation of request `i` without making it (what a request that is
    /// never sent would have been).
    pub fn draw(&self, i: u64, tx_ids: &TxIds) -> (usize, Operation) {
        let agent = self.agent(i);
        (agent, self.operation(i, tx_ids.of(agent).is_some()))
    }

    /// Request `i`: its agent, operation ([`Self::operation`]), path and body. Status reads
    /// use a transaction id its agent was given, or a synthetic one when the mix has
    /// nothing else.
    pub fn prepare(&self, i: u64, tx_ids: &TxIds) -> Prepared {
        let (agent, op) = self.draw(i, tx_ids);
        let synthetic;
        let tx = if op == Operation::TransactionStatus {
            match tx_ids.of(agent) {
                None => {
                    synthetic = format!("tx-load-{:08x}-{i}", self.run);
                    synthetic.as_str()
                }
                Some(ids) => ids[(splitmix64(i) % ids.len() as u64) as usize].as_str(),
            }
        } else {
            ""
        };
        let a = &self.agents[agent];
        Prepared {
            agent,
            op,
            path: request_path(&self.prefix, self.api, &a.service, op, tx),
            body: request_body(op, i, self.run),
        }
    }

    /// Writes `req` as HTTP/1.1 into `out` (cleared first).
    pub fn write_h1(&self, req: &Prepared, out: &mut BytesMut) {
        let a = &self.agents[req.agent];
        out.clear();
        let mut w = RequestWriter::new(out, req.op.method(), &req.path);
        w.header("host", &self.authority);
        if !self.sets("user-agent") {
            w.header("user-agent", "agent-gateway-load");
        }
        if !self.sets("accept") {
            w.header("accept", "application/json");
        }
        w.header(AGENT_ID_HEADER, &a.id)
            .header(AUTH_TOKEN_HEADER, a.token.as_str());
        for h in &self.headers {
            w.header(h.name.as_str(), h.value.as_bytes());
        }
        if let Some(b) = &req.body {
            w.header("content-type", "application/json")
                .number("content-length", b.len() as u64);
        }
        w.end();
        if let Some(b) = &req.body {
            out.extend_from_slice(b.as_bytes());
        }
    }

    /// What every HTTP/2 request of the run shares, made once: the scheme and authority of
    /// its URI, each agent's credential headers, the constant ones.
    pub fn h2_heads(&self, scheme: http::uri::Scheme) -> H2Heads {
        let value = |v: &str| {
            HeaderValue::from_str(v).expect("ids and tokens checked when the run was planned")
        };
        let mut common = Vec::with_capacity(self.headers.len() + 2);
        if !self.sets("user-agent") {
            common.push((USER_AGENT, HeaderValue::from_static("agent-gateway-load")));
        }
        if !self.sets("accept") {
            common.push((ACCEPT, HeaderValue::from_static("application/json")));
        }
        common.extend(
            self.headers
                .iter()
                .map(|h| (h.name.clone(), h.value.clone())),
        );
        H2Heads {
            scheme,
            authority: self
                .authority
                .parse()
                .expect("the authority of a URL that parsed"),
            agents: self
                .agents
                .iter()
                .map(|a| (value(&a.id), value(a.token.as_str())))
                .collect(),
            common,
        }
    }

    /// `req` as an HTTP/2 request and its body. Built field by field from `heads`, whose
    /// values are shared rather than copied: the request builder's chain moved the whole
    /// request at each header, which showed in a profile against h2load.
    pub fn h2_request(&self, req: Prepared, heads: &H2Heads) -> (http::Request<()>, Option<Bytes>) {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(heads.scheme.clone());
        parts.authority = Some(heads.authority.clone());
        parts.path_and_query = Some(
            http::uri::PathAndQuery::from_maybe_shared(Bytes::from(req.path))
                .expect("a path the gateway's routes build"),
        );
        let mut request = http::Request::new(());
        *request.method_mut() = match req.op.method() {
            "GET" => http::Method::GET,
            _ => http::Method::POST,
        };
        *request.uri_mut() = http::Uri::from_parts(parts).expect("scheme, authority and path");
        let headers = request.headers_mut();
        headers.reserve(heads.common.len() + 4);
        let (id, token) = &heads.agents[req.agent];
        headers.insert(AGENT_ID, id.clone());
        headers.insert(AUTH_TOKEN, token.clone());
        for (name, value) in &heads.common {
            headers.append(name.clone(), value.clone());
        }
        let body = req.body.map(Bytes::from);
        if let Some(body) = &body {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        (request, body)
    }

    /// Whether `-H` sets header `name` (lower case), replacing the generator's own.
    fn sets(&self, name: &str) -> bool {
        self.headers.iter().any(|h| h.name == name)
    }
}

/// The `transaction_id` of an InvitationResponse-like body, when it has a usable one.
pub fn transaction_id(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct WithTx {
        transaction_id: Option<String>,
    }
    let id = serde_json::from_slice::<WithTx>(body)
        .ok()?
        .transaction_id?;
    (!id.is_empty() && id.len() <= 256 && id != "." && id != "..").then_some(id)
}
