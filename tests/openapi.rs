//! The generated OpenAPI document, checked by real validators rather than by our own reading
//! of the OpenAPI specification.
//!
//! - `openapi-spec-validator` (PyPI) validates the whole document as OpenAPI 3.1.
//! - `openapi-schema-validator` (its dependency) checks sample bodies against the document's
//!   request schemas, and the verdicts must equal those of `schema::validate`: the published
//!   schemas and the enforced ones say the same thing.
//!
//! Both run from the pinned virtualenv of `tests/common/python.rs` (`target/py-venv`, built on
//! first use; `AGENT_GATEWAY_PYTHON_BIN` points at another one).

use std::path::PathBuf;
use std::process::Command;

mod common;

use agent_gateway::api::openapi::{self, document};
use agent_gateway::api::operation::{ApiVersion, Operation};
use agent_gateway::api::reply::Reply;
use agent_gateway::api::schema;
use agent_gateway::config::testing;
use common::python::{run, venv_bin};
use serde_json::{json, Value};

/// The Python of the shared test virtualenv (`tests/common/python.rs`).
fn python() -> PathBuf {
    venv_bin().join("python")
}

/// Writes `v` as JSON into a fresh directory under target/tmp, removed when the guard drops.
fn write_temp(name: &str, v: &Value) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(v).unwrap()).unwrap();
    (dir, path)
}

#[test]
fn the_document_is_valid_openapi_3_1() {
    let python = python();
    let mut open_status = testing::config();
    open_status.auth.require_on_status = false;
    let mut sunset = testing::config();
    sunset.retirement.sunset_at = Some("2027-06-01T00:00:00Z".into());
    for (variant, config) in [
        ("the test config", testing::config()),
        ("auth.require_on_status = false", open_status),
        ("retirement.sunset_at set", sunset),
    ] {
        let doc = document(&config.snapshot());
        let (_dir, file) = write_temp("openapi.json", &doc);
        let out = Command::new(&python)
            .args([
                "-m",
                "openapi_spec_validator",
                "--schema",
                "3.1",
                "--validation-errors",
                "all",
            ])
            .arg(&file)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("OK"),
            "openapi-spec-validator refused the document ({variant}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Bodies on both sides of every rule the published schemas can express. Not here: `null` in
/// an optional field (the schemas say string or boolean; the gateway reads null as absent)
/// and repeated keys (gone once JSON is parsed).
fn sample_bodies() -> Vec<(Operation, Value)> {
    let item = json!({"name": "n", "mime_type": "text/plain", "value": "v"});
    let desc = json!({"lang": "en", "message": "m"});
    vec![
        (Operation::VerifyRequest, json!({"business_code": "b"})),
        (
            Operation::VerifyRequest,
            json!({"business_code": "b", "allow_multiple_read": true, "x": [1]}),
        ),
        (
            Operation::VerifyRequest,
            json!({"business_code": "b", "connection_id": "c"}),
        ),
        (
            Operation::VerifyRequest,
            json!({"business_code": "b", "connection_id": "c", "allow_multiple_read": false}),
        ),
        (Operation::VerifyRequest, json!({"connection_id": "c"})),
        (Operation::VerifyRequest, json!({"business_code": 1})),
        (Operation::VerifyRequest, json!([])),
        (Operation::VerifyRequest, json!("b")),
        (Operation::VerifyResponse, json!({})),
        (
            Operation::VerifyResponse,
            json!({"presentation_id": "p", "result": true, "descriptions": [desc]}),
        ),
        (Operation::VerifyResponse, json!({"result": "true"})),
        (
            Operation::VerifyResponse,
            json!({"descriptions": [{"lang": "en"}]}),
        ),
        (
            Operation::VerifyResponse,
            json!({"descriptions": [desc, {"lang": "en", "message": 5}]}),
        ),
        (Operation::VerifyResponse, json!({"descriptions": ["en"]})),
        (Operation::VerifyResponse, json!({"descriptions": {}})),
        (
            Operation::ConnectionInvitation,
            json!({"organization_name": "o", "allow_multiple_read": true}),
        ),
        (
            Operation::ConnectionInvitation,
            json!({"organization_name": "o", "allow_multiple_read": 1}),
        ),
        (Operation::ConnectionInvitation, json!({})),
        (
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d"}),
        ),
        (
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d", "connection_id": "c"}),
        ),
        (
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d", "connection_id": "c",
                   "credential_values": [item]}),
        ),
        (
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d", "connection_id": "c",
                   "credential_values": []}),
        ),
        (
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d",
                   "credential_values": [{"name": "n", "value": "v"}]}),
        ),
        (
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d", "comment": false}),
        ),
        (
            Operation::CredentialOffer,
            json!({"organization_name": "o"}),
        ),
    ]
}

/// The schemas the document publishes accept exactly the bodies the gateway accepts.
#[test]
fn published_schemas_agree_with_the_validator() {
    let python = python();
    let doc = document(&testing::snapshot());
    let cases: Vec<Value> = sample_bodies()
        .iter()
        .map(|(op, body)| json!({"schema": op.schema().unwrap().name, "body": body}))
        .collect();
    let (_dir, file) = write_temp("cases.json", &json!({"document": doc, "cases": cases}));
    let script = r##"
import json, sys
from openapi_schema_validator import OAS31Validator
data = json.load(open(sys.argv[1]))
components = data["document"]["components"]
verdicts = []
for case in data["cases"]:
    schema = {"$ref": "#/components/schemas/" + case["schema"], "components": components}
    verdicts.append(OAS31Validator(schema).is_valid(case["body"]))
print(json.dumps(verdicts))
"##;
    let out = run(Command::new(&python).arg("-c").arg(script).arg(&file));
    let published: Vec<bool> = serde_json::from_slice(&out.stdout).unwrap();
    let bodies = sample_bodies();
    assert_eq!(published.len(), bodies.len());
    let mut accepted = 0;
    for ((op, body), published) in bodies.iter().zip(published) {
        let enforced = schema::validate(op.schema().unwrap(), body.to_string().as_bytes());
        assert_eq!(
            published,
            enforced.is_ok(),
            "{op:?} {body}: published schema says {published}, validator says {enforced:?}"
        );
        accepted += usize::from(published);
    }
    // Both verdicts are exercised.
    assert!(accepted > 3 && accepted < bodies.len() - 3);
}

#[test]
fn every_route_and_status_is_documented() {
    let s = testing::snapshot();
    let doc = document(&s);
    for version in ApiVersion::ALL {
        for op in Operation::ALL {
            let path = openapi::public_path(&s.bases, version, op);
            let o = &doc["paths"][&path][op.method().to_ascii_lowercase()];
            assert_eq!(
                o["operationId"],
                openapi::operation_id(version, op),
                "{} {path}",
                op.method()
            );
        }
    }
    let mut statuses = std::collections::BTreeSet::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for o in item.as_object().unwrap().values() {
            for status in o["responses"].as_object().unwrap().keys() {
                statuses.insert(status.parse::<u16>().unwrap());
            }
        }
    }
    let mut want: Vec<u16> = vec![200, 400, 401, 404, 405, 410, 413, 415, 429, 502, 504];
    want.extend(Reply::ALL_CODES.iter().map(|r| r.status()));
    for status in want {
        assert!(statuses.contains(&status), "{status} is not documented");
    }
}
