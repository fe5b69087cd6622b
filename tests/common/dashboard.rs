//! The shipped Grafana dashboard, read as its queries: what `tests/observability.rs` checks
//! against `/metrics` and `tests/prometheus_e2e.rs` runs in a real Prometheus.

/// The shipped Grafana dashboard.
pub const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/config/grafana/agent-gateway.json"
);

/// One PromQL query of a dashboard panel.
#[derive(Debug, Clone)]
pub struct PanelQuery {
    pub panel: String,
    pub ref_id: String,
    pub expr: String,
}

/// The shipped dashboard, parsed.
pub fn dashboard() -> serde_json::Value {
    let text = std::fs::read_to_string(DASHBOARD).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every panel of a dashboard, those inside collapsed rows included.
pub fn dashboard_panels(dash: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels is a list") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// Every `expr` of every panel target.
pub fn dashboard_queries(dash: &serde_json::Value) -> Vec<PanelQuery> {
    let mut out = Vec::new();
    for p in dashboard_panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push(PanelQuery {
                    panel: p["title"].as_str().unwrap_or("").to_string(),
                    ref_id: t["refId"].as_str().unwrap_or("").to_string(),
                    expr: expr.to_string(),
                });
            }
        }
    }
    out
}

/// The query text of each templating variable backed by the data source.
pub fn dashboard_variable_queries(dash: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"].as_str().or(v["query"].as_str());
        out.push(q.expect("a query variable has a query").to_string());
    }
    out
}

/// The `agent_gateway_*` metric names a PromQL expression reads, in order of appearance
/// (string literals such as label values are skipped).
pub fn gateway_metric_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            let word = &expr[start..i];
            // `$__rate_interval` and the like are Grafana variables, not identifiers.
            let is_variable = start > 0 && b[start - 1] == b'$';
            if !is_variable && word.starts_with("agent_gateway_") && !out.iter().any(|w| w == word)
            {
                out.push(word.to_string());
            }
        } else if c.is_ascii_digit() {
            // A number or duration (`5m`, `1e3`) is not the start of a name.
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}
