//! The requests a run sends: bodies valid for each operation, paths, the bytes on the wire,
//! and the transaction ids answers carry.

use std::collections::VecDeque;

use bytes::BytesMut;
use serde::Deserialize;
use serde_json::json;

use crate::api::operation::{ApiVersion, Operation};
use crate::api::route::build_path;
use crate::http1::{percent_encode, RequestWriter};
use crate::policy::auth::{AGENT_ID_HEADER, AUTH_TOKEN_HEADER};

use super::args::{splitmix64, Mix};

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

/// Everything needed to write request `i`; shared by every connection.
#[derive(Debug, Clone)]
pub struct Script {
    pub authority: String,
    pub prefix: String,
    pub api: ApiVersion,
    pub service: String,
    pub agent_id: String,
    pub token: String,
    pub mix: Mix,
    /// Distinguishes this run's request_uids and synthetic ids from another run's.
    pub run: u64,
}

impl Script {
    /// The operation request `i` performs. A status read needs a transaction id this
    /// connection was given (`known_ids`); until there is one it is another operation of the
    /// mix, drawn with the mix's weights, so that a run does not manufacture 404s. Only a mix
    /// of status reads alone reads ids nobody issued.
    pub fn operation(&self, i: u64, known_ids: bool) -> Operation {
        match self.mix.pick(i) {
            Operation::TransactionStatus if !known_ids => self
                .mix
                .pick_other_than(i, Operation::TransactionStatus)
                .unwrap_or(Operation::TransactionStatus),
            op => op,
        }
    }

    /// Writes request `i` into `out` (cleared first) and returns its operation
    /// ([`Self::operation`]). Status reads use a transaction id from `tx_ids`, or a synthetic
    /// one when the mix has nothing else.
    pub fn write_request(
        &self,
        i: u64,
        tx_ids: &VecDeque<String>,
        out: &mut BytesMut,
    ) -> Operation {
        let op = self.operation(i, !tx_ids.is_empty());
        let synthetic;
        let tx = if op == Operation::TransactionStatus {
            match tx_ids.len() {
                0 => {
                    synthetic = format!("tx-load-{:08x}-{i}", self.run);
                    synthetic.as_str()
                }
                n => tx_ids[(splitmix64(i) % n as u64) as usize].as_str(),
            }
        } else {
            ""
        };
        let path = request_path(&self.prefix, self.api, &self.service, op, tx);
        let body = request_body(op, i, self.run);
        out.clear();
        let mut w = RequestWriter::new(out, op.method(), &path);
        w.header("host", &self.authority)
            .header("user-agent", "agent-gateway-load")
            .header("accept", "application/json")
            .header(AGENT_ID_HEADER, &self.agent_id)
            .header(AUTH_TOKEN_HEADER, &self.token);
        if let Some(b) = &body {
            w.header("content-type", "application/json")
                .number("content-length", b.len() as u64);
        }
        w.end();
        if let Some(b) = body {
            out.extend_from_slice(b.as_bytes());
        }
        op
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
