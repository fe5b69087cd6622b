//! `listen.trusted_proxies` and `listen.proxy_protocol`: what the gateway believes about who is
//! calling (the decision itself is `policy::client`). Both reload live.

use super::file::ListenFile;
use super::problems::Problems;
use super::types::IpNet;

/// Who sits in front of the proxy listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeConfig {
    /// Peers whose `X-Forwarded-For` is believed, and whose PROXY protocol header is.
    pub trusted_proxies: Vec<IpNet>,
    /// Every connection opens with a PROXY protocol header.
    pub proxy_protocol: bool,
}

/// Validates the two keys.
pub(super) fn edge(f: &ListenFile, p: &mut Problems) -> EdgeConfig {
    let trusted_proxies = f
        .trusted_proxies
        .iter()
        .enumerate()
        .filter_map(|(i, net)| p.check(format!("listen.trusted_proxies[{i}]"), IpNet::parse(net)))
        .collect();
    EdgeConfig {
        trusted_proxies,
        proxy_protocol: f.proxy_protocol,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::testing;

    #[test]
    fn trusted_proxies_are_networks() {
        let mut f = testing::config();
        f.listen.trusted_proxies = vec!["10.0.0.0/8".into(), "10.0.0.1/8".into(), "::1".into()];
        assert_eq!(f.refused_keys(), ["listen.trusted_proxies[1]"]);
        let mut f = testing::config();
        f.listen.trusted_proxies = vec!["10.0.0.0/8".into(), "::1".into()];
        f.listen.proxy_protocol = true;
        let edge = f.snapshot().edge;
        assert_eq!(edge.trusted_proxies.len(), 2);
        assert!(edge.proxy_protocol);
    }
}
