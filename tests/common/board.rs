//! The retirement board's page (`GET /` on the admin listener), read as its rows.

/// The table row of `agent` in the board's HTML, from its start tag to its end tag.
pub fn board_row<'a>(dom: &'a str, agent: &str) -> &'a str {
    let start = dom
        .find(&format!("<tr data-agent=\"{agent}\">"))
        .unwrap_or_else(|| panic!("no row for {agent} in\n{dom}"));
    let rest = &dom[start..];
    &rest[..rest.find("</tr>").unwrap() + "</tr>".len()]
}
