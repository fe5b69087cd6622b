//! Fuzzes the two pure functions that read raw client bytes: the body validator (for every
//! operation) and the router (the input as a request path).
//!
//! Run from the repository root with a nightly toolchain:
//! `cargo +nightly fuzz run validate fuzz/corpus/validate fuzz/seeds/validate -- -max_total_time=300`.
#![no_main]

use std::sync::OnceLock;

use agent_gateway::config::BasePath;
use agent_gateway::api::operation::Operation;
use agent_gateway::api::route::{check_path, match_route, upstream_path};
use agent_gateway::config::Bases;
use agent_gateway::api::schema::{validate, Rule};
use libfuzzer_sys::fuzz_target;

fn bases() -> &'static Bases {
    static BASES: OnceLock<Bases> = OnceLock::new();
    BASES.get_or_init(|| Bases {
        v1: BasePath::parse("/api/v1").unwrap(),
        v2: BasePath::parse("/api/v2").unwrap(),
        upstream: BasePath::parse("/backend/v2").unwrap(),
    })
}

fuzz_target!(|data: &[u8]| {
    // serde_json's own reading, as an oracle. It refuses a little more than the validator
    // (nesting deeper than 128 and unpaired surrogate escapes in fields the validator skips),
    // so it is only trusted where it parses.
    let json = serde_json::from_slice::<serde_json::Value>(data).ok();
    for op in Operation::ALL {
        let Some(schema) = op.schema() else {
            continue;
        };
        let verdict = validate(schema, data);
        if let Err(v) = &verdict {
            assert!(v.message().contains(v.rule.as_str()));
        }
        if let Some(j) = &json {
            let rule = verdict.as_ref().err().map(|v| v.rule);
            assert_ne!(rule, Some(Rule::NotJson), "serde_json parsed it");
            assert_eq!(rule == Some(Rule::NotObject), !j.is_object());
        }
    }

    if let Ok(path) = std::str::from_utf8(data) {
        for method in ["GET", "POST"] {
            if let Ok(m) = match_route(bases(), method, path) {
                assert_eq!(method, m.operation.method());
                // What goes upstream is itself a clean path, and a URI: ASCII only (bytes
                // outside it percent-encoded), with the query encoded the same way.
                let up = upstream_path(&bases().upstream, &m, m.service.unwrap_or("DEF"), None);
                assert!(check_path(&up).is_ok(), "{path:?} -> {up:?}");
                assert!(up.starts_with("/backend/v2/"));
                assert!(up.is_ascii(), "{path:?} -> {up:?}");
                let with_query =
                    upstream_path(&bases().upstream, &m, m.service.unwrap_or("DEF"), Some(path));
                assert!(with_query.is_ascii(), "{path:?} -> {with_query:?}");
            }
        }
    }
});
