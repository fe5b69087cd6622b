//! The OpenAPI 3.1 document of the proxy's public interface.
//!
//! Generated, never written by hand: the paths come from the routing table
//! ([`ApiVersion::ALL`] × [`Operation::ALL`] under the snapshot's bases, each with
//! [`Operation::method`]), the request schemas from the tables in [`crate::api::schema`] that the
//! body validator enforces, and the gateway's own error answers from [`Reply`]. A change to
//! any of them shows up here without an edit, and the tests below check the document against
//! [`crate::api::route::match_route`].
//!
//! Operation ids follow the spec. v1 and v2 name the same operations, and ids must be unique
//! in one document, so the v1 ones carry the suffix `_v1` (`create_verify_request_v1`). The
//! spec gives the status reads no id; they are `get_transaction_status` and
//! `get_transaction_status_v1`.

use serde_json::{json, Map, Value};

use crate::api::operation::{ApiVersion, Operation, Segment, Tag, OPERATIONS};
use crate::api::reply::Reply;
use crate::api::route;
use crate::api::schema::{self, Constraint, FieldType, ObjectSchema, Rule};
use crate::config::Bases;
use crate::config::Snapshot;

/// The OpenAPI version written.
const OPENAPI_VERSION: &str = "3.1.0";

/// The two API-key schemes of spec section 5: (scheme name, header).
const SECURITY_SCHEMES: [(&str, &str); 2] = [
    ("Auth_token", "X-Auth-Token"),
    ("Agent_id", "X-Service-Agent-Id"),
];

/// What a status the gateway answers by itself means, in one line; its causes (message codes)
/// are [`Reply`]'s, listed after it.
fn status_summary(status: u16) -> &'static str {
    match status {
        400 => "The request is malformed.",
        404 => "No operation has this path.",
        405 => "The path names an operation that takes another method.",
        408 => "The request body was not received in time.",
        410 => "A v1 call refused by the retirement policy.",
        413 => "The request body is too large.",
        414 => "The request target is too long.",
        415 => "The request body is not declared as application/json.",
        429 => "Too many requests.",
        431 => "The request headers are too large.",
        502 => "The backend could not be reached or answered badly.",
        503 => "Every backend connection the gateway may open is busy; retry after `Retry-After` seconds.",
        504 => "The backend did not answer in time.",
        _ => "Answered by the gateway.",
    }
}

/// The document for the routes and schemas `snapshot` enforces.
pub fn document(snapshot: &Snapshot) -> Value {
    document_with_sunset(snapshot, legacy_sunset(snapshot).as_deref())
}

/// The v1 sunset date configured in `snapshot` (`retirement.sunset_at`), in RFC 3339.
fn legacy_sunset(snapshot: &Snapshot) -> Option<String> {
    snapshot
        .retirement
        .terms
        .dates
        .sunset_at
        .map(crate::config::format_time)
}

/// The document, with `sunset` as the legacy v1 interface's configured sunset date.
fn document_with_sunset(snapshot: &Snapshot, sunset: Option<&str>) -> Value {
    let mut paths = Map::new();
    for version in ApiVersion::ALL {
        for op in Operation::ALL {
            let item = paths
                .entry(public_path(&snapshot.bases, version, op))
                .or_insert_with(|| json!({}));
            item[op.method().to_ascii_lowercase()] = operation(snapshot, version, op, sunset);
        }
    }

    let mut schemas = Map::new();
    for s in schema::all_schemas() {
        schemas.insert(s.name.to_owned(), object_schema(s));
    }
    schemas.insert(
        "ServiceAgentResponse".into(),
        json!({
            "type": "object",
            "description": "The service's answer. The gateway's own answers use this shape too, \
                            with message_code = status * 100 + a number for the cause.",
            "required": ["status_code", "message_code", "message"],
            "properties": {
                "status_code": {"type": "integer", "format": "int32"},
                "message_code": {"type": "integer", "format": "int32"},
                "message": {"type": "string"},
            },
        }),
    );
    for (name, what) in [
        ("InvitationResponse", "an invitation"),
        ("TransactionStatusResponse", "a transaction status"),
    ] {
        schemas.insert(
            name.into(),
            json!({
                "description": format!(
                    "ServiceAgentResponse for {what}. The fields it adds are not given by the \
                     interface specification; they are passed through from the backend unchanged."
                ),
                "allOf": [{"$ref": "#/components/schemas/ServiceAgentResponse"}],
            }),
        );
    }
    schemas.insert(
        "NotAuthorized".into(),
        json!({"type": "string", "description": "not authorized", "examples": ["not authorized"]}),
    );

    let mut responses = Map::new();
    for status in gateway_statuses() {
        responses.insert(response_name(status), gateway_response(status));
    }

    let mut security_schemes = Map::new();
    for (name, header) in SECURITY_SCHEMES {
        security_schemes.insert(
            name.into(),
            json!({"type": "apiKey", "in": "header", "name": header}),
        );
    }

    json!({
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "Agent REST Service (through agent-gateway)",
            "version": "2.0",
            "description": info_description(snapshot, sunset),
        },
        "servers": [{"url": "/"}],
        "tags": tags(),
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": responses,
            "securitySchemes": security_schemes,
            "parameters": {
                "XRequestId": {
                    "name": "X-Request-Id",
                    "in": "header",
                    "required": false,
                    "description": "Kept when it is 1 to 128 of A-Z a-z 0-9 - _ . : +, else \
                                    replaced by a generated one; sent upstream and returned.",
                    "schema": {"type": "string"},
                },
            },
            "headers": {
                "X-Request-Id": {
                    "description": "The request's id (the client's, or generated).",
                    "schema": {"type": "string"},
                },
            },
        },
    })
}

/// The tags of the operation table, in its order, each once.
fn tags() -> Vec<Value> {
    let mut tags: Vec<&Tag> = Vec::new();
    for spec in &OPERATIONS {
        if !tags.contains(&spec.docs.tag) {
            tags.push(spec.docs.tag);
        }
    }
    tags.iter()
        .map(|t| json!({"name": t.name, "description": t.description}))
        .collect()
}

/// The public path of `op` under `version` and the snapshot's bases, with
/// `{service_business_code}` and `{transaction_id}` as OpenAPI path parameters.
pub fn public_path(bases: &Bases, version: ApiVersion, op: Operation) -> String {
    let base = match version {
        ApiVersion::V1 => &bases.v1,
        ApiVersion::V2 => &bases.v2,
    };
    route::path_template(base.as_str(), version, op)
}

/// The spec's operation id (`create_credentil_offer` spelled as the spec spells it), with
/// `_v1` appended for the legacy version.
pub fn operation_id(version: ApiVersion, op: Operation) -> String {
    let id = op.spec().docs.operation_id;
    match version {
        ApiVersion::V2 => id.to_owned(),
        ApiVersion::V1 => format!("{id}_v1"),
    }
}

/// The sentences on every v1 operation about the legacy interface's end; `sunset` is the
/// configured sunset date.
fn v1_sunset_notice(sunset: Option<&str>) -> String {
    let refusals = "v1 calls may be refused with 410 for agents whose v1 access is blocked and \
                    during scheduled brownouts";
    let signals = "Every answer names the v2 path of the same call in a Link header with \
                   rel=\"successor-version\"; a request with the header X-Sunset-Rehearsal: 1 \
                   gets the answer of a call after the sunset (410) now, and is not forwarded.";
    match sunset {
        Some(date) => format!(
            "Its sunset date is {date} (an agent may have its own). {refusals}, and after the \
             sunset date when it is enforced. {signals}"
        ),
        None => format!("No sunset date is configured. {refusals}. {signals}"),
    }
}

fn info_description(snapshot: &Snapshot, sunset: Option<&str>) -> String {
    format!(
        "Versions 2.0 (under {v2}) and 1.0 (legacy, under {v1}) of the Agent REST Service, as \
         served by agent-gateway in front of a backend that speaks only 2.0. v1 operations act \
         on the default configured service and are deprecated. {notice}\n\n\
         Request bodies are checked against the schemas below before anything is forwarded; \
         fields they do not declare are passed through, and an explicit null in an optional \
         field counts as absent. Answers with the statuses listed as the gateway's come from \
         the gateway itself; every other answer is the backend's, passed through unchanged.",
        v1 = snapshot.bases.v1.as_str(),
        v2 = snapshot.bases.v2.as_str(),
        notice = v1_sunset_notice(sunset),
    )
}

fn needs_auth(snapshot: &Snapshot, op: Operation) -> bool {
    op.needs_auth(snapshot.auth.require_on_status)
}

/// Whether the gateway can answer `status` to `op` under `version`.
fn status_applies(status: u16, snapshot: &Snapshot, version: ApiVersion, op: Operation) -> bool {
    match status {
        401 => needs_auth(snapshot, op),
        410 => version == ApiVersion::V1,
        // Answers about the request body.
        408 | 413 | 415 => op.method() == "POST",
        _ => true,
    }
}

/// One operation of the document: `op` under `version`.
fn operation(
    snapshot: &Snapshot,
    version: ApiVersion,
    op: Operation,
    sunset: Option<&str>,
) -> Value {
    let mut o = json!({
        "operationId": operation_id(version, op),
        "tags": [op.spec().docs.tag.name],
        "summary": op.spec().docs.summary,
        "parameters": parameters(version, op),
        "responses": responses(snapshot, version, op),
    });
    let description = description(snapshot, version, op, sunset);
    if !description.is_empty() {
        o["description"] = json!(description);
    }
    if let Some(s) = op.schema() {
        o["requestBody"] = json!({
            "required": true,
            "content": {"application/json": {"schema": {
                "$ref": format!("#/components/schemas/{}", s.name),
            }}},
        });
    }
    o["security"] = if needs_auth(snapshot, op) {
        let both: Map<String, Value> = SECURITY_SCHEMES
            .iter()
            .map(|(name, _)| ((*name).to_owned(), json!([])))
            .collect();
        json!([both])
    } else {
        json!([])
    };
    if version == ApiVersion::V1 {
        o["deprecated"] = json!(true);
        if let Some(date) = sunset {
            o["x-sunset"] = json!(date);
        }
    }
    o
}

/// What v1 forwards to and its end (v1 only), then the spec's rules for the operation.
fn description(
    snapshot: &Snapshot,
    version: ApiVersion,
    op: Operation,
    sunset: Option<&str>,
) -> String {
    let mut description = match version {
        ApiVersion::V2 => String::new(),
        ApiVersion::V1 => {
            let scope = if op.is_service_scoped() {
                format!(
                    "Acts on the default configured service: the calling agent's own default \
                     service when it has one, else `{}`; forwarded to the v2 operation \
                     `{}`. ",
                    snapshot.v1_default_service.as_str(),
                    operation_id(ApiVersion::V2, op),
                )
            } else {
                format!(
                    "Forwarded to the v2 operation `{}`. ",
                    operation_id(ApiVersion::V2, op)
                )
            };
            format!(
                "Legacy interface 1.0, deprecated. {scope}{} The spec calls this operation \
                 `{}`; `_v1` keeps ids unique in this document.",
                v1_sunset_notice(sunset),
                op.spec().docs.operation_id,
            )
        }
    };
    let rules = op.spec().docs.rules;
    if !rules.is_empty() {
        if !description.is_empty() {
            description.push_str("\n\n");
        }
        description.push_str(rules);
    }
    description
}

/// The path parameters of `op` under `version`, then the request id header.
fn parameters(version: ApiVersion, op: Operation) -> Vec<Value> {
    let mut parameters = Vec::new();
    if version == ApiVersion::V2 && op.is_service_scoped() {
        parameters.push(json!({
            "name": "service_business_code",
            "in": "path",
            "required": true,
            "description": "Business code of the service the operation acts on, as configured \
                            in the service section of the provider's administration console.",
            "schema": path_segment_schema(),
        }));
    }
    if op.path(version).contains(&Segment::TransactionId) {
        parameters.push(json!({
            "name": "transaction_id",
            "in": "path",
            "required": true,
            "description": "Identifies the transaction.",
            "schema": path_segment_schema(),
        }));
    }
    parameters.push(json!({"$ref": "#/components/parameters/XRequestId"}));
    parameters
}

/// The backend's 200, then each answer of the gateway's own that `op` can get.
fn responses(snapshot: &Snapshot, version: ApiVersion, op: Operation) -> Map<String, Value> {
    let mut responses = Map::new();
    responses.insert(
        "200".into(),
        json!({
            "description": "Success (the backend's answer).",
            "headers": {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}},
            "content": {"application/json": {"schema": {
                "$ref": format!("#/components/schemas/{}", op.spec().docs.success_schema),
            }}},
        }),
    );
    for status in gateway_statuses() {
        if status_applies(status, snapshot, version, op) {
            responses.insert(
                status.to_string(),
                json!({"$ref": format!("#/components/responses/{}", response_name(status))}),
            );
        }
    }
    responses
}

/// Every status the gateway answers by itself ([`Reply::ALL_CODES`]), ascending.
fn gateway_statuses() -> Vec<u16> {
    let mut out: Vec<u16> = Reply::ALL_CODES.iter().map(|r| r.status()).collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn response_name(status: u16) -> String {
    if status == 401 {
        "NotAuthorized".into()
    } else {
        format!("Gateway{status}")
    }
}

fn gateway_response(status: u16) -> Value {
    let request_id = json!({"$ref": "#/components/headers/X-Request-Id"});
    if status == 401 {
        return json!({
            "description": "not authorized: a header is missing, the agent is unknown, the \
                            token is wrong, or the service is outside the agent's allowed \
                            services. The body is the JSON string \"not authorized\".",
            "headers": {"X-Request-Id": request_id},
            "content": {"application/json": {"schema": {
                "$ref": "#/components/schemas/NotAuthorized",
            }}},
        });
    }
    let mut description = format!(
        "{} Answered by the gateway with a ServiceAgentResponse.",
        status_summary(status)
    );
    let causes: Vec<String> = Reply::ALL_CODES
        .iter()
        .filter(|r| r.status() == status)
        .map(|r| format!("- message_code {}: {}", r.message_code(), r.message()))
        .collect();
    if !causes.is_empty() {
        description.push_str("\n\n");
        description.push_str(&causes.join("\n"));
    }
    if status == 400 {
        let labels: Vec<&str> = Rule::ALL.iter().map(|r| r.as_str()).collect();
        description.push_str(&format!(
            "\n\nFor a request body that breaks its schema, the message also names the field \
             and the rule, one of: {}.",
            labels.join(", ")
        ));
    }
    let mut headers = Map::new();
    headers.insert("X-Request-Id".into(), request_id);
    if status == 405 {
        headers.insert(
            "Allow".into(),
            json!({"description": "The one method this path takes.", "schema": {"type": "string"}}),
        );
    }
    if status == 410 || status == 429 {
        headers.insert(
            "Retry-After".into(),
            json!({
                "description": "When a temporary refusal (a brownout, a rate limit) ends.",
                "schema": {"type": "string"},
            }),
        );
    }
    json!({
        "description": description,
        "headers": headers,
        "content": {"application/json": {"schema": {
            "$ref": "#/components/schemas/ServiceAgentResponse",
        }}},
    })
}

/// What a `{service_business_code}` or `{transaction_id}` may be, decoded: one path segment
/// that is not empty, `.` or `..`, and holds no ASCII control character (the gateway answers
/// 400 to those, see `route::check_path`). A `/` is fine: it travels encoded as `%2F`.
fn path_segment_schema() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "pattern": "^(?!\\.\\.?$)[^\\u0000-\\u001F\\u007F]+$",
    })
}

/// A schema matching a field that is given and not `null` (the validator's "present").
fn present(name: &str) -> Value {
    json!({"required": [name], "properties": {name: {"not": {"type": "null"}}}})
}

/// An object schema as JSON Schema 2020-12, cross-field rules included. Like the validator,
/// it reads an explicit `null` in an optional field as absent: optional fields also admit
/// `null`, and the cross-field rules only look at fields that are present and not `null`.
fn object_schema(s: &ObjectSchema) -> Value {
    let mut properties = Map::new();
    for f in s.fields {
        let ty = if f.required {
            json!(f.ty.json_type())
        } else {
            json!([f.ty.json_type(), "null"])
        };
        let mut p = json!({"type": ty, "description": f.description});
        if let FieldType::ArrayOf(items) = f.ty {
            p["items"] = json!({"$ref": format!("#/components/schemas/{}", items.name)});
        }
        properties.insert(f.name.to_owned(), p);
    }
    let required: Vec<&str> = s
        .fields
        .iter()
        .filter(|f| f.required)
        .map(|f| f.name)
        .collect();
    let mut description = s.description.to_owned();
    let mut rules = Vec::new();
    for &c in s.constraints {
        description.push_str(&format!(" Rule {}: {}.", c.rule().as_str(), c.sentence()));
        rules.push(match c {
            Constraint::Requires { when, then, .. } => {
                json!({"if": present(when), "then": present(then)})
            }
            // `then` must be absent or null.
            Constraint::Excludes { when, then, .. } => {
                json!({"if": present(when), "then": {"properties": {then: {"type": "null"}}}})
            }
        });
    }
    let mut o = json!({"type": "object", "description": description, "properties": properties});
    if !required.is_empty() {
        o["required"] = json!(required);
    }
    if !rules.is_empty() {
        o["allOf"] = Value::Array(rules);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::route::match_route;
    use crate::config::testing;

    /// Every (path, method, operation object) of the document.
    fn operations(doc: &Value) -> Vec<(String, String, Value)> {
        let mut out = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                out.push((path.clone(), method.to_ascii_uppercase(), op.clone()));
            }
        }
        out
    }

    /// The response object behind `r`, following a `$ref` into components.
    fn resolve<'a>(doc: &'a Value, r: &'a Value) -> &'a Value {
        match r["$ref"].as_str() {
            Some(target) => doc
                .pointer(target.trim_start_matches('#'))
                .unwrap_or_else(|| panic!("dangling {target}")),
            None => r,
        }
    }

    #[test]
    fn every_route_appears_with_its_method_and_path() {
        for v1_base in ["/api/v1", "/gw/legacy"] {
            let mut f = testing::config();
            f.v1.base_path = v1_base.into();
            let s = f.snapshot();
            let doc = document(&s);
            let ops = operations(&doc);
            assert_eq!(
                ops.len(),
                ApiVersion::ALL.len() * Operation::ALL.len(),
                "one entry per route, no others"
            );
            for version in ApiVersion::ALL {
                for op in Operation::ALL {
                    let path = public_path(&s.bases, version, op);
                    let o = &doc["paths"][&path][op.method().to_ascii_lowercase()];
                    assert_eq!(o["operationId"], operation_id(version, op), "{path}");
                    assert_eq!(o["deprecated"] == json!(true), version == ApiVersion::V1);
                    assert_eq!(o["requestBody"].is_object(), op.method() == "POST");
                }
            }
            // Each documented path, its parameters filled in, is the route the gateway takes.
            for (path, method, o) in ops {
                let concrete = path
                    .replace("{service_business_code}", "SVC")
                    .replace("{transaction_id}", "tx-1");
                let m = match_route(&s.bases, &method, &concrete)
                    .unwrap_or_else(|e| panic!("{method} {concrete}: {e:?}"));
                assert_eq!(o["operationId"], operation_id(m.version, m.operation));
                assert_eq!(
                    m.service.is_some(),
                    path.contains("{service_business_code}")
                );
                assert_eq!(
                    m.transaction_id.is_some(),
                    path.contains("{transaction_id}")
                );
            }
        }
    }

    #[test]
    fn spec_operation_ids_and_unique_ids() {
        let doc = document(&testing::snapshot());
        let mut ids: Vec<String> = operations(&doc)
            .iter()
            .map(|(_, _, o)| o["operationId"].as_str().unwrap().to_owned())
            .collect();
        for want in [
            "create_verify_request",
            "create_verify_response",
            "create_connection_invitation",
            "create_credentil_offer",
            "get_transaction_status",
            "create_credentil_offer_v1",
        ] {
            assert!(ids.iter().any(|i| i == want), "{want} missing");
        }
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "duplicate operation ids");
    }

    #[test]
    fn every_gateway_status_appears() {
        let doc = document(&testing::snapshot());
        let mut seen = std::collections::BTreeSet::new();
        for (_, _, o) in operations(&doc) {
            for (status, r) in o["responses"].as_object().unwrap() {
                let r = resolve(&doc, r);
                assert!(r["description"].is_string(), "{status}");
                let schema = &r["content"]["application/json"]["schema"]["$ref"];
                let want = match status.as_str() {
                    "200" => schema.as_str().unwrap().to_owned(),
                    "401" => "#/components/schemas/NotAuthorized".to_owned(),
                    _ => "#/components/schemas/ServiceAgentResponse".to_owned(),
                };
                assert_eq!(schema, &json!(want), "{status}");
                seen.insert(status.parse::<u16>().unwrap());
            }
        }
        for status in [200, 400, 401, 404, 405, 410, 413, 415, 429, 502, 504] {
            assert!(seen.contains(&status), "{status} missing");
        }
        for r in Reply::ALL_CODES {
            assert!(seen.contains(&r.status()), "{r:?}");
            assert!(
                r == Reply::Unauthorized || status_summary(r.status()) != status_summary(0),
                "{} has no summary",
                r.status()
            );
            let text = doc["components"]["responses"][response_name(r.status())]["description"]
                .as_str()
                .unwrap();
            if r != Reply::Unauthorized {
                assert!(text.contains(&r.message_code().to_string()), "{r:?}");
            }
        }
        let not_authorized = &doc["components"]["schemas"]["NotAuthorized"];
        assert_eq!(not_authorized["type"], "string");
        assert_eq!(not_authorized["examples"][0], "not authorized");
    }

    #[test]
    fn responses_fit_each_operation() {
        let s = testing::snapshot();
        let doc = document(&s);
        let path = |v, op| public_path(&s.bases, v, op);
        let status_v2 = &doc["paths"][path(ApiVersion::V2, Operation::TransactionStatus)]["get"];
        let offer_v1 = &doc["paths"][path(ApiVersion::V1, Operation::CredentialOffer)]["post"];
        let offer_v2 = &doc["paths"][path(ApiVersion::V2, Operation::CredentialOffer)]["post"];
        assert!(status_v2["responses"]["413"].is_null());
        assert!(status_v2["responses"]["410"].is_null());
        assert!(offer_v2["responses"]["410"].is_null());
        assert!(offer_v1["responses"]["410"].is_object());
        assert!(offer_v2["responses"]["413"].is_object());
        assert_eq!(
            offer_v2["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/InvitationResponse"
        );
        assert_eq!(
            status_v2["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/TransactionStatusResponse"
        );
    }

    #[test]
    fn security_on_every_post_and_on_status_when_configured() {
        let both = json!([{"Auth_token": [], "Agent_id": []}]);
        for status_auth in [true, false] {
            let mut f = testing::config();
            f.auth.require_on_status = status_auth;
            let s = f.snapshot();
            let doc = document(&s);
            for (path, method, o) in operations(&doc) {
                let want_auth = method == "POST" || status_auth;
                assert_eq!(o["security"] == both, want_auth, "{method} {path}");
                assert_eq!(o["responses"]["401"].is_object(), want_auth);
                if !want_auth {
                    assert_eq!(o["security"], json!([]));
                }
            }
            let schemes = &doc["components"]["securitySchemes"];
            assert_eq!(schemes["Auth_token"]["name"], "X-Auth-Token");
            assert_eq!(schemes["Agent_id"]["name"], "X-Service-Agent-Id");
            assert_eq!(schemes["Agent_id"]["in"], "header");
        }
    }

    #[test]
    fn request_schemas_come_from_the_validator_tables() {
        let doc = document(&testing::snapshot());
        // Spec section 2's request bodies: the required fields in order, and each field's
        // JSON type (an optional field also admits null).
        let optional = |ty: &str| json!([ty, "null"]);
        let expected = [
            (
                "VerifyRequest",
                json!(["business_code"]),
                json!({
                    "business_code": "string",
                    "connection_id": optional("string"),
                    "allow_multiple_read": optional("boolean"),
                    "request_uid": optional("string"),
                }),
            ),
            (
                "VerifyResponseRequest",
                Value::Null,
                json!({
                    "presentation_id": optional("string"),
                    "result": optional("boolean"),
                    "descriptions": optional("array"),
                }),
            ),
            (
                "ServiceDescription",
                json!(["lang", "message"]),
                json!({"lang": "string", "message": "string"}),
            ),
            (
                "ConnectionInvitationRequest",
                json!(["organization_name"]),
                json!({
                    "organization_name": "string",
                    "allow_multiple_read": optional("boolean"),
                    "request_uid": optional("string"),
                }),
            ),
            (
                "CredentialOfferRequest",
                json!(["organization_name", "credential_def_id"]),
                json!({
                    "organization_name": "string",
                    "credential_def_id": "string",
                    "connection_id": optional("string"),
                    "credential_values": optional("array"),
                    "comment": optional("string"),
                    "request_uid": optional("string"),
                }),
            ),
            (
                "CredentialAttributePreview",
                json!(["name", "mime_type", "value"]),
                json!({"name": "string", "mime_type": "string", "value": "string"}),
            ),
        ];
        let mut names: Vec<&str> = expected.iter().map(|(name, _, _)| *name).collect();
        let mut tables: Vec<&str> = schema::all_schemas().iter().map(|s| s.name).collect();
        names.sort_unstable();
        tables.sort_unstable();
        assert_eq!(
            names, tables,
            "every schema the validator enforces, and no other"
        );
        for (name, required, types) in expected {
            let c = &doc["components"]["schemas"][name];
            assert_eq!(c["required"], required, "{name}");
            let got: Map<String, Value> = c["properties"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(field, p)| (field.clone(), p["type"].clone()))
                .collect();
            assert_eq!(Value::Object(got), types, "{name}");
        }
        let not_null = json!({"not": {"type": "null"}});
        let offer = &doc["components"]["schemas"]["CredentialOfferRequest"];
        assert_eq!(
            offer["allOf"],
            json!([{
                "if": {"required": ["connection_id"], "properties": {"connection_id": not_null}},
                "then": {"required": ["credential_values"], "properties": {"credential_values": not_null}},
            }])
        );
        assert_eq!(
            offer["properties"]["credential_values"]["items"]["$ref"],
            "#/components/schemas/CredentialAttributePreview"
        );
        let verify = &doc["components"]["schemas"]["VerifyRequest"];
        assert_eq!(
            verify["allOf"],
            json!([{
                "if": {"required": ["connection_id"], "properties": {"connection_id": not_null}},
                "then": {"properties": {"allow_multiple_read": {"type": "null"}}},
            }])
        );
    }

    #[test]
    fn v1_mentions_the_default_service_and_the_sunset() {
        let s = testing::snapshot();
        let path = public_path(&s.bases, ApiVersion::V1, Operation::VerifyRequest);
        let doc = document(&s);
        let text = doc["paths"][&path]["post"]["description"].as_str().unwrap();
        assert!(text.contains("ORG_DEFAULT"), "{text}");
        assert!(text.contains("No sunset date"), "{text}");
        let doc = document_with_sunset(&s, Some("2027-01-31"));
        let o = &doc["paths"][&path]["post"];
        assert!(o["description"].as_str().unwrap().contains("2027-01-31"));
        assert_eq!(o["x-sunset"], "2027-01-31");
        let v2 = public_path(&s.bases, ApiVersion::V2, Operation::VerifyRequest);
        assert!(doc["paths"][&v2]["post"]["x-sunset"].is_null());
        // The configured retirement date is the one documented.
        let mut f = testing::config();
        f.retirement.sunset_at = Some("2027-06-01T00:00:00Z".into());
        let s = f.snapshot();
        let doc = document(&s);
        assert_eq!(
            doc["paths"][&path]["post"]["x-sunset"],
            "2027-06-01T00:00:00Z"
        );
    }

    #[test]
    fn every_ref_resolves() {
        fn walk(doc: &Value, v: &Value) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(r)) = m.get("$ref") {
                        assert!(
                            doc.pointer(r.trim_start_matches('#')).is_some(),
                            "dangling {r}"
                        );
                    }
                    m.values().for_each(|v| walk(doc, v));
                }
                Value::Array(a) => a.iter().for_each(|v| walk(doc, v)),
                _ => {}
            }
        }
        let doc = document(&testing::snapshot());
        walk(&doc, &doc);
        assert_eq!(doc["openapi"], OPENAPI_VERSION);
        assert_eq!(doc["servers"], json!([{"url": "/"}]));
    }
}
