//! The HTML report (`--report FILE.html`): one self-contained page that opens offline. It
//! carries the report's JSON (the same the `--json` output prints) and an inline script that
//! draws the charts as SVG; its Content-Security-Policy forbids loading anything else, so a
//! page that would fetch a script, font or stylesheet from elsewhere breaks visibly.

use serde::Serialize;

use super::report::{KneeReport, Report};
use crate::http1::escape_html;

const STYLE: &str = include_str!("report.css");
const SCRIPT: &str = include_str!("report.js");

/// The page of one run.
pub fn run_page(r: &Report) -> String {
    page(&format!("load test of {}", r.target), r)
}

/// The page of a `--find-max` search.
pub fn knee_page(k: &KneeReport) -> String {
    page(&format!("find-max against {}", k.target), k)
}

fn page<T: Serialize>(title: &str, data: &T) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         script-src 'unsafe-inline'; style-src 'unsafe-inline'\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n\
         <main id=\"report\"><noscript>The charts of this report are drawn by its inline \
         script; the data is in the <code>report-data</code> element.</noscript></main>\n\
         <script type=\"application/json\" id=\"report-data\">{data}</script>\n\
         <script>\n{SCRIPT}</script>\n</body>\n</html>\n",
        title = escape_html(title),
        data = script_json(data),
    )
}

/// JSON that cannot end the script element holding it: every `<` escaped (so no `</script>`
/// or `<!--` from a target URL or a status text), still the same JSON to `JSON.parse`.
pub fn script_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v)
        .expect("a report always serializes")
        .replace('<', "\\u003c")
}
