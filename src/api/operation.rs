//! The operations of the Agent REST Service, in one table.
//!
//! Everything the gateway knows about an operation is a column of [`OPERATIONS`]: its
//! method, its path after the v1 and the v2 base, its request body schema and its
//! documentation. Routing, rewriting, validation, the OpenAPI document, metrics,
//! `/v1-usage`, the load generator and the mock backend all read the table, and
//! every per-operation array is sized [`Operation::COUNT`]: a new operation is a new enum
//! variant and its row (the table is sized [`Operation::COUNT`] too, so it does not compile
//! without one).

use super::schema::{
    ObjectSchema, CONNECTION_INVITATION_REQUEST, CREDENTIAL_OFFER_REQUEST, VERIFY_REQUEST,
    VERIFY_RESPONSE_REQUEST,
};

listed_enum! {
    /// The public interface version a request used.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum ApiVersion {
        V1 => "v1",
        V2 => "v2",
    }
}

listed_enum! {
    /// An operation of the Agent REST Service; its facts are its row of [`OPERATIONS`], in
    /// the order of [`Operation::ALL`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Operation {
        VerifyRequest,
        VerifyResponse,
        ConnectionInvitation,
        CredentialOffer,
        TransactionStatus,
    }
}

/// One segment of an operation's path after its version's base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// This exact text.
    Literal(&'static str),
    /// `{service_business_code}`: the service the call acts on (v2 paths only).
    ServiceCode,
    /// `{transaction_id}`.
    TransactionId,
}

impl Segment {
    /// The segment as documentation writes it.
    pub fn template(self) -> &'static str {
        match self {
            Segment::Literal(text) => text,
            Segment::ServiceCode => "{service_business_code}",
            Segment::TransactionId => "{transaction_id}",
        }
    }
}

/// A group of operations in the OpenAPI document.
#[derive(Debug, PartialEq, Eq)]
pub struct Tag {
    pub name: &'static str,
    pub description: &'static str,
}

const VERIFY: Tag = Tag {
    name: "verify",
    description: "Proof requests and their responses.",
};
const CONNECTION: Tag = Tag {
    name: "connection",
    description: "Pairwise connection invitations.",
};
const CREDENTIAL: Tag = Tag {
    name: "credential",
    description: "Credential offers.",
};
const TRANSACTION: Tag = Tag {
    name: "transaction",
    description: "Transaction status.",
};

/// How an operation is documented in the OpenAPI document.
#[derive(Debug)]
pub struct Docs {
    /// The spec's operation id (its spelling kept: `create_credentil_offer`).
    pub operation_id: &'static str,
    pub tag: &'static Tag,
    pub summary: &'static str,
    /// The spec's rules for the operation, in a sentence or two (may be empty).
    pub rules: &'static str,
    /// The component schema of its 200 answer.
    pub success_schema: &'static str,
}

/// Everything the gateway knows about one operation.
#[derive(Debug)]
pub struct OperationSpec {
    pub operation: Operation,
    /// The label in metrics, logs and `/v1-usage`.
    pub name: &'static str,
    /// The one method it accepts.
    pub method: &'static str,
    /// Its path after the v1 base.
    pub v1_path: &'static [Segment],
    /// Its path after the v2 base (the public one and the backend's).
    pub v2_path: &'static [Segment],
    /// The schema of its request body; `None` when it takes none.
    pub schema: Option<&'static ObjectSchema>,
    pub docs: Docs,
    /// Whether `auth.require_on_status = false` lets it through without credentials.
    pub auth_optional: bool,
}

use Segment::{Literal, ServiceCode, TransactionId};

/// The table, in the order of [`Operation::ALL`].
pub static OPERATIONS: [OperationSpec; Operation::COUNT] = [
    OperationSpec {
        operation: Operation::VerifyRequest,
        name: "verify_request",
        method: "POST",
        v1_path: &[Literal("verify"), Literal("request")],
        v2_path: &[Literal("verify"), ServiceCode, Literal("request")],
        schema: Some(&VERIFY_REQUEST),
        docs: Docs {
            operation_id: "create_verify_request",
            tag: &VERIFY,
            summary: "Ask a holder to present a proof",
            rules: "When connection_id is present the request goes to that connection; when it \
                    is absent a pairwise connection is performed automatically first, and \
                    allow_multiple_read may be used (only then).",
            success_schema: "InvitationResponse",
        },
        auth_optional: false,
    },
    OperationSpec {
        operation: Operation::VerifyResponse,
        name: "verify_response",
        method: "POST",
        v1_path: &[Literal("verify"), Literal("response")],
        v2_path: &[Literal("verify"), Literal("response")],
        schema: Some(&VERIFY_RESPONSE_REQUEST),
        docs: Docs {
            operation_id: "create_verify_response",
            tag: &VERIFY,
            summary: "Send the response to a verify request",
            rules: "Sends a verify proof response for a previously executed verify request, \
                    identified by presentation_id.",
            success_schema: "ServiceAgentResponse",
        },
        auth_optional: false,
    },
    OperationSpec {
        operation: Operation::ConnectionInvitation,
        name: "connection_invitation",
        method: "POST",
        v1_path: &[Literal("connection"), Literal("invitation")],
        v2_path: &[Literal("connection"), ServiceCode, Literal("invitation")],
        schema: Some(&CONNECTION_INVITATION_REQUEST),
        docs: Docs {
            operation_id: "create_connection_invitation",
            tag: &CONNECTION,
            summary: "Request a pairwise connection through an invitation",
            rules: "",
            success_schema: "InvitationResponse",
        },
        auth_optional: false,
    },
    OperationSpec {
        operation: Operation::CredentialOffer,
        name: "credential_offer",
        method: "POST",
        v1_path: &[Literal("credential"), Literal("offer")],
        v2_path: &[Literal("credential"), ServiceCode, Literal("offer")],
        schema: Some(&CREDENTIAL_OFFER_REQUEST),
        docs: Docs {
            operation_id: "create_credentil_offer",
            tag: &CREDENTIAL,
            summary: "Send a credential offer",
            rules: "When connection_id is provided, credential_values must be provided.",
            success_schema: "InvitationResponse",
        },
        auth_optional: false,
    },
    OperationSpec {
        operation: Operation::TransactionStatus,
        name: "transaction_status",
        method: "GET",
        v1_path: &[Literal("transaction"), TransactionId, Literal("status")],
        v2_path: &[Literal("transaction"), TransactionId, Literal("status")],
        schema: None,
        docs: Docs {
            operation_id: "get_transaction_status",
            tag: &TRANSACTION,
            summary: "Read the status of a transaction",
            rules: "transaction_id identifies the transaction.",
            success_schema: "TransactionStatusResponse",
        },
        auth_optional: true,
    },
];

/// The most segments any operation's path has.
pub const MAX_SEGMENTS: usize = 3;

impl Operation {
    /// Its row of the table.
    pub fn spec(self) -> &'static OperationSpec {
        &OPERATIONS[self as usize]
    }

    /// The label used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    /// The one method this operation accepts.
    pub fn method(self) -> &'static str {
        self.spec().method
    }

    /// Its path after `version`'s base.
    pub fn path(self, version: ApiVersion) -> &'static [Segment] {
        match version {
            ApiVersion::V1 => self.spec().v1_path,
            ApiVersion::V2 => self.spec().v2_path,
        }
    }

    /// Whether the v2 path of this operation carries a `{service_business_code}`.
    pub fn is_service_scoped(self) -> bool {
        self.spec().v2_path.contains(&ServiceCode)
    }

    /// Whether a call must carry credentials, given `auth.require_on_status`.
    pub fn needs_auth(self, require_on_status: bool) -> bool {
        !self.spec().auth_optional || require_on_status
    }

    /// The schema of its request body; `None` when it takes none.
    pub fn schema(self) -> Option<&'static ObjectSchema> {
        self.spec().schema
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_row_per_operation_in_order() {
        for (i, op) in Operation::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, i, "{op:?} is out of place in ALL");
            assert_eq!(OPERATIONS[i].operation, op, "row {i} is not {op:?}'s");
        }
        let mut names: Vec<_> = OPERATIONS.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Operation::COUNT, "labels must be unique");
    }

    #[test]
    fn only_bodies_of_posts_have_schemas_and_paths_fit_the_bounds() {
        for spec in &OPERATIONS {
            assert_eq!(
                spec.schema.is_some(),
                spec.method == "POST",
                "{}",
                spec.name
            );
            for version in ApiVersion::ALL {
                let path = spec.operation.path(version);
                assert!(!path.is_empty() && path.len() <= MAX_SEGMENTS);
                if version == ApiVersion::V1 {
                    assert!(!path.contains(&ServiceCode), "v1 paths carry no code");
                }
            }
        }
    }

    #[test]
    fn every_request_body_schema_belongs_to_one_operation() {
        use crate::api::schema::REQUEST_SCHEMAS;
        let mut table: Vec<&str> = OPERATIONS
            .iter()
            .filter_map(|s| s.schema)
            .map(|s| s.name)
            .collect();
        let mut schemas: Vec<&str> = REQUEST_SCHEMAS.iter().map(|s| s.name).collect();
        table.sort();
        schemas.sort();
        assert_eq!(table, schemas);
    }

    /// Two shapes of the same length that agree at every literal could both match one path.
    #[test]
    fn no_path_can_name_two_operations() {
        for version in ApiVersion::ALL {
            for a in Operation::ALL {
                for b in Operation::ALL.into_iter().filter(|b| *b != a) {
                    let (pa, pb) = (a.path(version), b.path(version));
                    let overlap = pa.len() == pb.len()
                        && pa.iter().zip(pb).all(|(x, y)| match (x, y) {
                            (Literal(x), Literal(y)) => x == y,
                            _ => true,
                        });
                    assert!(!overlap, "{a:?} and {b:?} overlap under {version:?}");
                }
            }
        }
    }
}
