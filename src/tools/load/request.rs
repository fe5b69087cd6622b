//! The requests a run sends: which agent sends each and which operation it is, bodies valid
//! for each operation, paths, the request as HTTP/1.1 bytes or an HTTP/2 request, and the
//! transaction ids answers carry.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::json;

use crate::api::operation::{ApiVersion, Operation};
use crate::api::route::build_path;
use crate::http1::{percent_encode, RequestWriter};
use crate::policy::auth::{AGENT_ID_HEADER, AUTH_TOKEN_HEADER};

use super::args::{splitmix64, HeaderArg, Mix, Weights};

/// A realistic JSON body for `op` (spec section 2), varied by request index `i`.
/// `None` for the status read, which has no body.
pub fn request_body(op: Operation, i: u64, run: u64) -> Option<String> {
    let uid = format!("load-{run:08x}-{i}");
    let connection = format!("conn-{:012x}", splitmix64(i ^ run) & 0xffff_ffff_ffff);
    let body = match op {
        // Rule 1/2: with a connection_id the request goes there and allow_multiple_read does
        // not apply; without one, a pairwise connection is made first.
        Operation::VerifyRequest if i % 4 == 0 => json!({
            "business_code": "KYC-BASIC",
            "connection_id": connection,
            "request_uid": uid,
        }),
        Operation::VerifyRequest => json!({
            "business_code": "KYC-BASIC",
            "allow_multiple_read": i % 2 == 0,
            "request_uid": uid,
        }),
        Operation::VerifyResponse => json!({
            "presentation_id": format!("pres-{:016x}", splitmix64(i.wrapping_add(run))),
            "result": i % 10 != 0,
            "descriptions": [
                {"lang": "en", "message": "Proof of identity verified"},
                {"lang": "fr", "message": "Preuve d'identité vérifiée"},
            ],
        }),
        Operation::ConnectionInvitation => json!({
            "organization_name": "Acme Verification Services",
            "allow_multiple_read": i % 3 == 0,
            "request_uid": uid,
        }),
        // Rule 3: credential_values are mandatory with a connection_id.
        Operation::CredentialOffer if i % 2 == 0 => json!({
            "organization_name": "Acme Verification Services",
            "credential_def_id": "Th7MpTaRZVRYnPiabds81Y:3:CL:12:membership",
            "request_uid": uid,
            "connection_id": connection,
            "credential_values": [
                {"name": "given_name", "mime_type": "text/plain", "value": "Ada"},
                {"name": "family_name", "mime_type": "text/plain", "value": "Lovelace"},
                {"name": "member_since", "mime_type": "text/plain", "value": "2024-01-15"},
            ],
            "comment": "Your membership credential",
        }),
        Operation::CredentialOffer => json!({
            "organization_name": "Acme Verification Services",
            "credential_def_id": "Th7MpTaRZVRYnPiabds81Y:3:CL:12:membership",
            "request_uid": uid,
            "comment": "Scan to receive your membership credential",
        }),
        Operation::TransactionStatus => return None,
    };
    Some(body.to_string())
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
    pub token: String,
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
            .header(AUTH_TOKEN_HEADER, &a.token);
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

    /// `req` as an HTTP/2 request to `scheme://authority` and its body.
    pub fn h2_request(
        &self,
        req: Prepared,
        scheme: &http::uri::Scheme,
    ) -> (http::Request<()>, Option<Bytes>) {
        let a = &self.agents[req.agent];
        let uri = http::Uri::builder()
            .scheme(scheme.clone())
            .authority(self.authority.as_str())
            .path_and_query(req.path)
            .build()
            .expect("the target's authority and a path the gateway's routes build");
        let mut b = http::Request::builder().method(req.op.method()).uri(uri);
        if !self.sets("user-agent") {
            b = b.header("user-agent", "agent-gateway-load");
        }
        if !self.sets("accept") {
            b = b.header("accept", "application/json");
        }
        b = b
            .header(AGENT_ID_HEADER, a.id.as_str())
            .header(AUTH_TOKEN_HEADER, a.token.as_str());
        for h in &self.headers {
            b = b.header(&h.name, &h.value);
        }
        if let Some(body) = &req.body {
            b = b
                .header("content-type", "application/json")
                .header("content-length", body.len());
        }
        let request = b
            .body(())
            .expect("header names and values checked when the run was planned");
        (request, req.body.map(Bytes::from))
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
