//! Tests of the body validator: its rules one by one, and property tests against serde_json.

use super::*;
use crate::api::operation::Operation;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Validates `body` against the schema of `op`, which must take a body.
fn validate(op: Operation, body: &[u8]) -> Result<(), Violation> {
    super::validate(request_schema(op).unwrap(), body)
}

/// The schema of `op`'s body, as the operation table has it.
fn request_schema(op: Operation) -> Option<&'static ObjectSchema> {
    op.schema()
}

fn check(op: Operation, body: Value) -> Result<(), Violation> {
    validate(op, body.to_string().as_bytes())
}

fn fails(op: Operation, body: Value, field: &str, rule: Rule) {
    let text = body.to_string();
    assert_eq!(
        validate(op, text.as_bytes()),
        Err(Violation {
            field: field.to_owned(),
            rule
        }),
        "{text}"
    );
}

fn offer_item() -> Value {
    json!({"name": "age", "mime_type": "text/plain", "value": "42"})
}

#[test]
fn minimal_valid_bodies_pass() {
    assert_eq!(
        check(Operation::VerifyRequest, json!({"business_code": "KYC"})),
        Ok(())
    );
    assert_eq!(check(Operation::VerifyResponse, json!({})), Ok(()));
    assert_eq!(
        check(
            Operation::ConnectionInvitation,
            json!({"organization_name": "Org"})
        ),
        Ok(())
    );
    assert_eq!(
        check(
            Operation::CredentialOffer,
            json!({"organization_name": "Org", "credential_def_id": "d"})
        ),
        Ok(())
    );
}

#[test]
fn full_valid_bodies_pass() {
    let bodies = [
        (
            Operation::VerifyRequest,
            json!({"business_code": "b", "allow_multiple_read": true, "request_uid": "u"}),
        ),
        (
            Operation::VerifyRequest,
            json!({"business_code": "b", "connection_id": "c", "request_uid": "u"}),
        ),
        (
            Operation::VerifyResponse,
            json!({"presentation_id": "p", "result": false,
                   "descriptions": [{"lang": "en", "message": "ok"}, {"lang": "fr", "message": ""}]}),
        ),
        (
            Operation::ConnectionInvitation,
            json!({"organization_name": "o", "allow_multiple_read": false, "request_uid": "u"}),
        ),
        (
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d", "request_uid": "u",
                   "connection_id": "c", "credential_values": [offer_item()], "comment": "hi"}),
        ),
    ];
    for (op, body) in bodies {
        assert_eq!(check(op, body.clone()), Ok(()), "{body}");
    }
}

#[test]
fn transaction_status_has_no_body_to_check() {
    assert_eq!(Operation::TransactionStatus.schema(), None);
}

#[test]
fn not_json() {
    for body in [
        &b""[..],
        b"   ",
        b"{",
        b"{\"business_code\":\"x\"",
        b"{\"business_code\":\"x\"} {}",
        b"{\"business_code\":\"x\"},",
        b"{'business_code':'x'}",
        b"{\"business_code\":\"x\",}",
        b"\xef\xbb\xbf{\"business_code\":\"x\"}",
        // Invalid UTF-8 inside a skipped, undeclared field.
        b"{\"business_code\":\"x\",\"extra\":\"\xff\"}",
        // A syntax error after a type violation still makes the body not JSON.
        b"{\"business_code\":5,",
    ] {
        let got = validate(Operation::VerifyRequest, body).unwrap_err();
        assert_eq!(
            got.rule,
            Rule::NotJson,
            "{:?}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(got.field, "");
    }
}

#[test]
fn not_object() {
    for body in [
        "[]",
        "[{\"business_code\":\"x\"}]",
        "\"x\"",
        "1",
        "null",
        "true",
    ] {
        for op in [Operation::VerifyRequest, Operation::CredentialOffer] {
            assert_eq!(
                validate(op, body.as_bytes()),
                Err(Violation {
                    field: String::new(),
                    rule: Rule::NotObject
                }),
                "{body}"
            );
        }
    }
}

#[test]
fn required_fields() {
    fails(
        Operation::VerifyRequest,
        json!({}),
        "business_code",
        Rule::Required,
    );
    fails(
        Operation::ConnectionInvitation,
        json!({"allow_multiple_read": true}),
        "organization_name",
        Rule::Required,
    );
    fails(
        Operation::CredentialOffer,
        json!({"organization_name": "o"}),
        "credential_def_id",
        Rule::Required,
    );
    // Missing fields are reported in schema order.
    fails(
        Operation::CredentialOffer,
        json!({}),
        "organization_name",
        Rule::Required,
    );
}

#[test]
fn null_is_absent() {
    // Optional: accepted, and does not count as present for the cross-field rules.
    assert_eq!(
        check(
            Operation::VerifyRequest,
            json!({"business_code": "b", "connection_id": null, "allow_multiple_read": true,
                   "request_uid": null})
        ),
        Ok(())
    );
    assert_eq!(
        check(
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d",
                   "connection_id": null, "credential_values": null})
        ),
        Ok(())
    );
    // Required: missing.
    fails(
        Operation::VerifyRequest,
        json!({"business_code": null}),
        "business_code",
        Rule::Required,
    );
    fails(
        Operation::CredentialOffer,
        json!({"organization_name": "o", "credential_def_id": "d",
               "credential_values": [{"name": "n", "mime_type": null, "value": "v"}]}),
        "credential_values[0].mime_type",
        Rule::ItemRequired,
    );
}

#[test]
fn declared_types() {
    fails(
        Operation::VerifyRequest,
        json!({"business_code": 7}),
        "business_code",
        Rule::Type,
    );
    fails(
        Operation::VerifyRequest,
        json!({"business_code": "b", "allow_multiple_read": "true"}),
        "allow_multiple_read",
        Rule::Type,
    );
    fails(
        Operation::VerifyResponse,
        json!({"result": 1}),
        "result",
        Rule::Type,
    );
    fails(
        Operation::VerifyResponse,
        json!({"descriptions": {"lang": "en", "message": "m"}}),
        "descriptions",
        Rule::Type,
    );
    fails(
        Operation::CredentialOffer,
        json!({"organization_name": ["o"], "credential_def_id": "d"}),
        "organization_name",
        Rule::Type,
    );
    fails(
        Operation::CredentialOffer,
        json!({"organization_name": "o", "credential_def_id": "d", "comment": {}}),
        "comment",
        Rule::Type,
    );
}

#[test]
fn the_first_wrong_field_in_document_order_is_reported() {
    let body = br#"{"result": 1, "presentation_id": 2}"#;
    assert_eq!(
        validate(Operation::VerifyResponse, body).unwrap_err().field,
        "result"
    );
    // A wrong type is reported before a missing required field.
    let body = br#"{"request_uid": 1}"#;
    assert_eq!(
        validate(Operation::VerifyRequest, body).unwrap_err(),
        Violation {
            field: "request_uid".into(),
            rule: Rule::Type
        }
    );
}

#[test]
fn array_items() {
    let offer = |items: Value| json!({"organization_name": "o", "credential_def_id": "d", "credential_values": items});
    fails(
        Operation::CredentialOffer,
        offer(json!([offer_item(), {"name": "n", "value": "v"}])),
        "credential_values[1].mime_type",
        Rule::ItemRequired,
    );
    fails(
        Operation::CredentialOffer,
        offer(json!([offer_item(), offer_item(), {"name": "n", "mime_type": 3, "value": "v"}])),
        "credential_values[2].mime_type",
        Rule::ItemType,
    );
    fails(
        Operation::CredentialOffer,
        offer(json!(["age"])),
        "credential_values[0]",
        Rule::ItemType,
    );
    fails(
        Operation::CredentialOffer,
        offer(json!([null])),
        "credential_values[0]",
        Rule::ItemType,
    );
    fails(
        Operation::VerifyResponse,
        json!({"descriptions": [{"lang": "en"}]}),
        "descriptions[0].message",
        Rule::ItemRequired,
    );
    fails(
        Operation::VerifyResponse,
        json!({"descriptions": [{"lang": false, "message": "m"}]}),
        "descriptions[0].lang",
        Rule::ItemType,
    );
    // Unknown fields in items are allowed; an empty array is an array.
    assert_eq!(
        check(
            Operation::VerifyResponse,
            json!({"descriptions": [{"lang": "en", "message": "m", "extra": [1, {}]}]})
        ),
        Ok(())
    );
    assert_eq!(check(Operation::CredentialOffer, offer(json!([]))), Ok(()));
}

#[test]
fn rule_2_allow_multiple_read_only_without_connection() {
    for amr in [true, false] {
        fails(
            Operation::VerifyRequest,
            json!({"business_code": "b", "connection_id": "c", "allow_multiple_read": amr}),
            "allow_multiple_read",
            Rule::AllowMultipleReadWithConnection,
        );
    }
    assert_eq!(
        check(
            Operation::VerifyRequest,
            json!({"business_code": "b", "allow_multiple_read": false})
        ),
        Ok(())
    );
    // The invitation body has no connection_id; an undeclared one changes nothing.
    assert_eq!(
        check(
            Operation::ConnectionInvitation,
            json!({"organization_name": "o", "connection_id": "c", "allow_multiple_read": true})
        ),
        Ok(())
    );
}

#[test]
fn rule_3_credential_values_with_connection() {
    fails(
        Operation::CredentialOffer,
        json!({"organization_name": "o", "credential_def_id": "d", "connection_id": "c"}),
        "credential_values",
        Rule::CredentialValuesRequired,
    );
    fails(
        Operation::CredentialOffer,
        json!({"organization_name": "o", "credential_def_id": "d", "connection_id": "c",
               "credential_values": null}),
        "credential_values",
        Rule::CredentialValuesRequired,
    );
    // Without connection_id credential_values stays optional.
    assert_eq!(
        check(
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d"})
        ),
        Ok(())
    );
}

#[test]
fn duplicate_declared_fields() {
    let body = br#"{"business_code": 1, "business_code": "b"}"#;
    // The wrong first copy is reported first; a second copy of a good one is a duplicate.
    assert_eq!(
        validate(Operation::VerifyRequest, body).unwrap_err().rule,
        Rule::Type
    );
    let body = br#"{"business_code": "a", "business_code": "b"}"#;
    assert_eq!(
        validate(Operation::VerifyRequest, body),
        Err(Violation {
            field: "business_code".into(),
            rule: Rule::Duplicate
        })
    );
    let body = br#"{"business_code": "a", "business\u005fcode": "b"}"#;
    assert_eq!(
        validate(Operation::VerifyRequest, body).unwrap_err().rule,
        Rule::Duplicate
    );
    let body = br#"{"descriptions": [{"lang": "a", "message": "m", "lang": "b"}]}"#;
    assert_eq!(
        validate(Operation::VerifyResponse, body),
        Err(Violation {
            field: "descriptions[0].lang".into(),
            rule: Rule::Duplicate
        })
    );
    // Undeclared keys may repeat.
    let body = br#"{"business_code": "a", "x": 1, "x": 2}"#;
    assert_eq!(validate(Operation::VerifyRequest, body), Ok(()));
}

#[test]
fn unpaired_surrogates_are_refused_only_where_read() {
    let body = br#"{"business_code": "b", "x": "\ud800"}"#;
    assert_eq!(validate(Operation::VerifyRequest, body), Ok(()));
    let body = br#"{"business_code": "\ud800"}"#;
    assert_eq!(
        validate(Operation::VerifyRequest, body).unwrap_err().rule,
        Rule::NotJson
    );
}

#[test]
fn escaped_keys_and_values_are_read_as_json() {
    let body = br#"{"business\u005fcode": "\u004b\"YC"}"#;
    assert_eq!(validate(Operation::VerifyRequest, body), Ok(()));
}

#[test]
fn deep_nesting_is_skipped_without_overflow() {
    // Only the schema's own few levels are walked; anything deeper is skipped by
    // serde_json without recursion, wherever it sits.
    let deep = "[".repeat(200_000) + &"]".repeat(200_000);
    let body = format!(r#"{{"business_code":"b","x":{deep}}}"#);
    assert_eq!(validate(Operation::VerifyRequest, body.as_bytes()), Ok(()));
    let body = format!(r#"{{"business_code":{deep}}}"#);
    assert_eq!(
        validate(Operation::VerifyRequest, body.as_bytes()),
        Err(Violation {
            field: "business_code".into(),
            rule: Rule::Type
        })
    );
    let body = format!(r#"{{"descriptions":[{{"lang":{deep}}}]}}"#);
    assert_eq!(
        validate(Operation::VerifyResponse, body.as_bytes()),
        Err(Violation {
            field: "descriptions[0].lang".into(),
            rule: Rule::ItemType
        })
    );
    let body = format!(r#"{{"descriptions":{deep}}}"#);
    assert_eq!(
        validate(Operation::VerifyResponse, body.as_bytes()),
        Err(Violation {
            field: "descriptions[0]".into(),
            rule: Rule::ItemType
        })
    );
    // Unbalanced: not JSON, still no overflow.
    let body = format!(r#"{{"business_code":"b","x":{}}}"#, "[".repeat(200_000));
    assert_eq!(
        validate(Operation::VerifyRequest, body.as_bytes())
            .unwrap_err()
            .rule,
        Rule::NotJson
    );
}

#[test]
fn a_large_body_is_validated() {
    let items: Vec<Value> = (0..20_000).map(|_| offer_item()).collect();
    let body = json!({"organization_name": "o", "credential_def_id": "d",
                      "connection_id": "c", "credential_values": items, "pad": "x".repeat(100_000)});
    let text = body.to_string();
    assert!(text.len() > 1_000_000);
    assert_eq!(
        validate(Operation::CredentialOffer, text.as_bytes()),
        Ok(())
    );
}

#[test]
fn messages_name_field_and_rule() {
    let cases = [
        (
            "",
            Rule::NotJson,
            "the body is not valid UTF-8 JSON (rule not_json)",
        ),
        (
            "business_code",
            Rule::Required,
            "business_code is required (rule required)",
        ),
        (
            "allow_multiple_read",
            Rule::Type,
            "allow_multiple_read must be a boolean (rule type)",
        ),
        (
            "credential_values",
            Rule::Type,
            "credential_values must be an array of objects (rule type)",
        ),
        (
            "credential_values[2].mime_type",
            Rule::ItemType,
            "credential_values[2].mime_type must be a string (rule item_type)",
        ),
        (
            "credential_values[2]",
            Rule::ItemType,
            "credential_values[2] must be an object (rule item_type)",
        ),
        (
            "allow_multiple_read",
            Rule::AllowMultipleReadWithConnection,
            "allow_multiple_read may only be used without connection_id \
             (rule allow_multiple_read_with_connection)",
        ),
        (
            "credential_values",
            Rule::CredentialValuesRequired,
            "credential_values is required when connection_id is given \
             (rule credential_values_required)",
        ),
    ];
    for (field, rule, want) in cases {
        let v = Violation {
            field: field.into(),
            rule,
        };
        assert_eq!(v.message(), want);
        assert_eq!(v.to_string(), want);
    }
    for rule in Rule::ALL {
        let m = Violation {
            field: "x".into(),
            rule,
        }
        .message();
        assert!(m.contains(rule.as_str()), "{m}");
    }
}

#[test]
fn schema_tables_are_consistent() {
    let all = all_schemas();
    assert_eq!(all.len(), 6);
    let mut labels: Vec<&str> = Rule::ALL.iter().map(|r| r.as_str()).collect();
    labels.sort();
    labels.dedup();
    assert_eq!(labels.len(), Rule::ALL.len());
    for s in &all {
        assert!(s.fields.len() <= 64, "{}", s.name);
        for (i, f) in s.fields.iter().enumerate() {
            assert_eq!(s.index(f.name), Some(i), "{}.{} twice", s.name, f.name);
            // expected_noun looks types up by name alone.
            for other in all.iter().flat_map(|o| o.fields) {
                if other.name == f.name {
                    assert_eq!(other.ty.noun(), f.ty.noun(), "{}", f.name);
                }
            }
        }
        for c in s.constraints {
            let (Constraint::Requires { when, then, .. } | Constraint::Excludes { when, then, .. }) =
                *c;
            assert!(s.index(when).is_some() && s.index(then).is_some());
            assert_eq!(constraint_of(c.rule()), Some(*c));
        }
    }
    for op in Operation::ALL {
        assert_eq!(
            request_schema(op).is_some(),
            op != Operation::TransactionStatus
        );
    }
}

// ---- Property tests ----

/// All violations of `v` against `schema`, computed the obvious way over a parsed value: the
/// model the streaming validator is checked against.
fn model(schema: &ObjectSchema, v: &Value, path: &str, item: bool) -> Vec<Violation> {
    let at = |name: &str| {
        if path.is_empty() {
            name.to_owned()
        } else {
            format!("{path}.{name}")
        }
    };
    let viol = |field: String, rule| Violation { field, rule };
    let Some(obj) = v.as_object() else {
        let rule = if item {
            Rule::ItemType
        } else {
            Rule::NotObject
        };
        return vec![viol(path.to_owned(), rule)];
    };
    let (req, ty) = if item {
        (Rule::ItemRequired, Rule::ItemType)
    } else {
        (Rule::Required, Rule::Type)
    };
    let mut out = Vec::new();
    let present = |name: &str| obj.get(name).is_some_and(|v| !v.is_null());
    for f in schema.fields {
        match obj.get(f.name) {
            None | Some(Value::Null) => {
                if f.required {
                    out.push(viol(at(f.name), req));
                }
            }
            Some(v) => match (f.ty, v) {
                (FieldType::String, Value::String(_)) => {}
                (FieldType::Boolean, Value::Bool(_)) => {}
                (FieldType::ArrayOf(items), Value::Array(a)) => {
                    for (i, e) in a.iter().enumerate() {
                        out.extend(model(items, e, &format!("{}[{i}]", at(f.name)), true));
                    }
                }
                _ => out.push(viol(at(f.name), ty)),
            },
        }
    }
    for c in schema.constraints {
        let broken = match *c {
            Constraint::Requires { when, then, .. } => present(when) && !present(then),
            Constraint::Excludes { when, then, .. } => present(when) && present(then),
        };
        if broken {
            out.push(viol(at(c.field()), c.rule()));
        }
    }
    out
}

fn body_op() -> impl Strategy<Value = Operation> {
    proptest::sample::select(
        Operation::ALL
            .iter()
            .copied()
            .filter(|op| request_schema(*op).is_some())
            .collect::<Vec<_>>(),
    )
}

/// Any JSON value, small.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A field name no schema declares.
fn unknown_name() -> impl Strategy<Value = String> {
    "[a-z_]{1,12}".prop_filter("undeclared", |n| {
        !all_schemas()
            .iter()
            .flat_map(|s| s.fields)
            .any(|f| f.name == n)
    })
}

fn good_value(ty: FieldType) -> BoxedStrategy<Value> {
    match ty {
        FieldType::String => any::<String>().prop_map(Value::String).boxed(),
        FieldType::Boolean => any::<bool>().prop_map(Value::Bool).boxed(),
        FieldType::ArrayOf(items) => proptest::collection::vec(valid_object(items), 0..4)
            .prop_map(Value::Array)
            .boxed(),
    }
}

/// An object that satisfies `schema`: required fields good, optional ones absent, null
/// or good, undeclared extras, then the cross-field rules made to hold.
fn valid_object(schema: &'static ObjectSchema) -> BoxedStrategy<Value> {
    let fields: Vec<BoxedStrategy<Option<Value>>> = schema
        .fields
        .iter()
        .map(|f| {
            if f.required {
                good_value(f.ty).prop_map(Some).boxed()
            } else {
                prop_oneof![
                    2 => Just(None),
                    1 => Just(Some(Value::Null)),
                    3 => good_value(f.ty).prop_map(Some),
                ]
                .boxed()
            }
        })
        .collect();
    let extras = proptest::collection::vec((unknown_name(), any_json()), 0..3);
    (fields, extras)
        .prop_map(move |(values, extras)| {
            let mut m = Map::new();
            for (k, v) in extras {
                m.insert(k, v);
            }
            for (f, v) in schema.fields.iter().zip(values) {
                if let Some(v) = v {
                    m.insert(f.name.to_owned(), v);
                }
            }
            let present = |m: &Map<String, Value>, n: &str| m.get(n).is_some_and(|v| !v.is_null());
            for c in schema.constraints {
                match *c {
                    Constraint::Requires { when, then, .. } => {
                        if present(&m, when) && !present(&m, then) {
                            m.remove(when);
                        }
                    }
                    Constraint::Excludes { when, then, .. } => {
                        if present(&m, when) && present(&m, then) {
                            m.remove(then);
                        }
                    }
                }
            }
            Value::Object(m)
        })
        .boxed()
}

/// A value of the wrong type for `ty`.
fn bad_value(ty: FieldType) -> BoxedStrategy<Value> {
    let all = prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<bool>().prop_map(Value::Bool),
        ".{0,4}".prop_map(Value::String),
        Just(json!({})),
        Just(json!([])),
        Just(json!([1])),
    ];
    all.prop_filter("wrong type", move |v| {
        !matches!(
            (ty, v),
            (FieldType::String, Value::String(_))
                | (FieldType::Boolean, Value::Bool(_))
                | (FieldType::ArrayOf(_), Value::Array(_))
        )
    })
    .boxed()
}

/// An object shaped like `schema` where every field may be absent, null, good or wrong,
/// and array items likewise: reaches every rule.
fn shaped_object(schema: &'static ObjectSchema, depth: u32) -> BoxedStrategy<Value> {
    let fields: Vec<BoxedStrategy<Option<Value>>> = schema
        .fields
        .iter()
        .map(|f| {
            let good = match f.ty {
                FieldType::ArrayOf(items) if depth > 0 => proptest::collection::vec(
                    prop_oneof![
                        3 => shaped_object(items, depth - 1),
                        1 => any_json(),
                    ],
                    0..3,
                )
                .prop_map(Value::Array)
                .boxed(),
                ty => good_value(ty),
            };
            prop_oneof![
                2 => Just(None),
                1 => Just(Some(Value::Null)),
                4 => good.prop_map(Some),
                1 => bad_value(f.ty).prop_map(Some),
            ]
            .boxed()
        })
        .collect();
    let extras = proptest::collection::vec((unknown_name(), any_json()), 0..2);
    (fields, extras)
        .prop_map(move |(values, extras)| {
            let mut m: Map<String, Value> = extras.into_iter().collect();
            for (f, v) in schema.fields.iter().zip(values) {
                if let Some(v) = v {
                    m.insert(f.name.to_owned(), v);
                }
            }
            Value::Object(m)
        })
        .boxed()
}

fn op_and_valid_body() -> impl Strategy<Value = (Operation, Value)> {
    body_op().prop_flat_map(|op| (Just(op), valid_object(request_schema(op).unwrap())))
}

/// An operation whose body has an array field, and a valid body where that array has
/// at least one item.
fn op_and_body_with_items() -> impl Strategy<Value = (Operation, Value, &'static str)> {
    let ops: Vec<(Operation, &'static Field)> = Operation::ALL
        .iter()
        .filter_map(|&op| Some((op, request_schema(op)?)))
        .flat_map(|(op, s)| {
            s.fields
                .iter()
                .filter(|f| matches!(f.ty, FieldType::ArrayOf(_)))
                .map(move |f| (op, f))
        })
        .collect();
    proptest::sample::select(ops).prop_flat_map(|(op, f)| {
        let FieldType::ArrayOf(items) = f.ty else {
            unreachable!()
        };
        (
            valid_object(request_schema(op).unwrap()),
            proptest::collection::vec(valid_object(items), 1..4),
        )
            .prop_map(move |(mut body, items)| {
                body[f.name] = Value::Array(items);
                (op, body, f.name)
            })
    })
}

fn op_and_shaped_body() -> impl Strategy<Value = (Operation, Value)> {
    body_op().prop_flat_map(|op| (Just(op), shaped_object(request_schema(op).unwrap(), 2)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics_on_bytes(op in body_op(), body in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Err(v) = validate(op, &body) {
            prop_assert!(!v.message().is_empty());
        }
    }

    #[test]
    fn never_panics_on_json_like_text(op in body_op(), body in r#"[{}\[\]":,a-z0-9 \\tnulrefs_.-]{0,64}"#) {
        let _ = validate(op, body.as_bytes());
    }

    #[test]
    fn any_json_agrees_with_the_model(op in body_op(), body in any_json()) {
        let schema = request_schema(op).unwrap();
        let want = model(schema, &body, "", false);
        match validate(op, body.to_string().as_bytes()) {
            Ok(()) => prop_assert!(want.is_empty(), "passed, model says {want:?}"),
            Err(v) => prop_assert!(want.contains(&v), "{v:?} not in {want:?}"),
        }
    }

    #[test]
    fn shaped_bodies_agree_with_the_model((op, body) in op_and_shaped_body()) {
        let schema = request_schema(op).unwrap();
        let want = model(schema, &body, "", false);
        match validate(op, body.to_string().as_bytes()) {
            Ok(()) => prop_assert!(want.is_empty(), "passed, model says {want:?}"),
            Err(v) => prop_assert!(want.contains(&v), "{v:?} not in {want:?}"),
        }
    }

    #[test]
    fn valid_bodies_pass((op, body) in op_and_valid_body(), pretty in any::<bool>()) {
        let text = if pretty {
            serde_json::to_string_pretty(&body).unwrap()
        } else {
            body.to_string()
        };
        prop_assert_eq!(validate(op, text.as_bytes()), Ok(()), "{}", text);
    }

    #[test]
    fn removing_a_required_field_fails_naming_it(
        (op, body) in op_and_valid_body(),
        pick in any::<proptest::sample::Index>(),
    ) {
        let schema = request_schema(op).unwrap();
        let required: Vec<&Field> = schema.fields.iter().filter(|f| f.required).collect();
        prop_assume!(!required.is_empty());
        let f = required[pick.index(required.len())];
        let mut body = body;
        body.as_object_mut().unwrap().remove(f.name);
        prop_assert_eq!(
            validate(op, body.to_string().as_bytes()),
            Err(Violation { field: f.name.to_owned(), rule: Rule::Required })
        );
    }

    #[test]
    fn removing_an_item_field_fails_naming_it(
        (op, body, array) in op_and_body_with_items(),
        pick in any::<proptest::sample::Index>(),
    ) {
        let FieldType::ArrayOf(items) = request_schema(op)
            .unwrap()
            .fields
            .iter()
            .find(|f| f.name == array)
            .unwrap()
            .ty
        else {
            unreachable!()
        };
        let mut targets = Vec::new();
        for i in 0..body[array].as_array().unwrap().len() {
            for f in items.fields.iter().filter(|f| f.required) {
                targets.push((i, f.name));
            }
        }
        let (i, field) = targets[pick.index(targets.len())];
        let mut body = body;
        body[array][i].as_object_mut().unwrap().remove(field);
        prop_assert_eq!(
            validate(op, body.to_string().as_bytes()),
            Err(Violation { field: format!("{array}[{i}].{field}"), rule: Rule::ItemRequired })
        );
    }

    #[test]
    fn unknown_fields_never_change_the_verdict(
        (op, body) in op_and_shaped_body(),
        extras in proptest::collection::vec((unknown_name(), any_json()), 1..4),
    ) {
        let before = validate(op, body.to_string().as_bytes());
        let mut with = body;
        for (k, v) in extras {
            with.as_object_mut().unwrap().insert(k, v);
        }
        prop_assert_eq!(validate(op, with.to_string().as_bytes()), before);
    }

    #[test]
    fn non_objects_are_not_objects(op in body_op(), body in any_json()) {
        prop_assume!(!body.is_object());
        prop_assert_eq!(
            validate(op, body.to_string().as_bytes()).unwrap_err().rule,
            Rule::NotObject
        );
    }
}
