//! Request body schemas of the spec (section 2) as data, and the validator that enforces them.
//! (Being written.)

use crate::route::Operation;

/// A body rule that a request broke; the label is used in metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    NotJson,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::NotJson => "not_json",
        }
    }
}

/// Why a body is invalid: the field (a JSON path such as `credential_values[0].name`) and rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub rule: Rule,
}

/// Checks `body` against the schema of `operation`'s request body.
pub fn validate(_operation: Operation, _body: &[u8]) -> Result<(), Violation> {
    Ok(())
}
