//! `[admin]`: the admin token that closes the admin listener. Reloads live, so the token can
//! be rotated as an agent's is (a list: the new one beside the old one, then without it).

use super::auth::digests;
use super::file::AdminFile;
use super::problems::Problems;
use super::types::TokenDigest;

/// Who may call the admin listener's endpoints beyond the probes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminConfig {
    /// The admin tokens' digests; empty: no token, every endpoint open.
    pub tokens: Vec<TokenDigest>,
    /// `/metrics` needs the token too.
    pub protect_metrics: bool,
}

/// Validates `[admin]`.
pub(super) fn admin(f: &AdminFile, p: &mut Problems) -> AdminConfig {
    let tokens = digests(&f.token_sha256, "admin.token_sha256", p);
    if f.protect_metrics && f.token_sha256.is_empty() {
        p.push(
            "admin.protect_metrics",
            "needs admin.token_sha256: without a token nothing can be protected",
        );
    }
    AdminConfig {
        tokens,
        protect_metrics: f.protect_metrics,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::file::Digests;
    use crate::config::{testing, TokenDigest};

    #[test]
    fn one_token_or_a_list_and_metrics_only_behind_one() {
        let hex = |t: &str| TokenDigest::of(t.as_bytes()).to_hex();
        let mut f = testing::config();
        f.admin.token_sha256 = Digests(vec![hex("old"), hex("new")]);
        let admin = f.snapshot().admin;
        assert_eq!(
            admin.tokens,
            [TokenDigest::of(b"old"), TokenDigest::of(b"new")]
        );
        let mut f = testing::config();
        f.admin.token_sha256 = Digests(vec![hex("a"), "nope".into()]);
        assert_eq!(f.refused_keys(), ["admin.token_sha256[1]"]);
        let mut f = testing::config();
        f.admin.protect_metrics = true;
        assert_eq!(f.refused_keys(), ["admin.protect_metrics"]);
    }
}
