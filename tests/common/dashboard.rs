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

/// The label matchers every panel query of the dashboard puts on every series it reads: its
/// template variables, so that two environments scraped by one Prometheus never mix.
pub const DASHBOARD_SCOPE: &str = "job=~\"$job\",namespace=~\"$namespace\",instance=~\"$instance\"";

/// Whether `name` is a metric the gateway exports: its own, and the process' standard ones.
fn is_gateway_metric(name: &str) -> bool {
    name.starts_with("agent_gateway_") || name.starts_with("process_")
}

/// Each series selector of a gateway metric in a PromQL expression, in order of appearance:
/// the metric's name and the text between its braces (empty without braces). String literals
/// such as label values are skipped.
pub fn metric_selectors(expr: &str) -> Vec<(String, String)> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
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
            if !is_variable && is_gateway_metric(word) {
                let matchers = match expr[i..].strip_prefix('{') {
                    Some(rest) => rest[..rest.find('}').expect("a closed selector")].to_owned(),
                    None => String::new(),
                };
                out.push((word.to_owned(), matchers));
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

/// The gateway metric names a PromQL expression reads, each once, in order of appearance.
pub fn gateway_metric_names(expr: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (name, _) in metric_selectors(expr) {
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}
