//! Looking the backend's names up, on the runtime (hickory-resolver: no blocking call), at
//! start and then as each answer's TTL says ([`crate::policy::backend::dns`] decides when);
//! [`Backends`] turns the answers into the set.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::TokioResolver;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::time::Instant;

use super::backends::Backends;
use crate::config::{BasePath, DnsConfig, UpstreamConfig};

/// How long one DNS server has to answer one query, and how many times it is asked.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
const QUERY_ATTEMPTS: usize = 2;

/// A resolver asking `dns.resolvers`, or the system's (`/etc/resolv.conf`) when none is set.
/// It keeps no cache: each lookup asks, and the TTL it answers is when the next one is due.
fn resolver(dns: &DnsConfig) -> Result<TokioResolver, String> {
    let mut options = ResolverOpts::default();
    options.cache_size = 0;
    options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    options.timeout = QUERY_TIMEOUT;
    options.attempts = QUERY_ATTEMPTS;
    let builder = if dns.resolvers.is_empty() {
        TokioResolver::builder_tokio()
            .map_err(|e| format!("cannot read the system's resolver configuration: {e}"))?
    } else {
        let servers: Vec<NameServerConfig> = dns
            .resolvers
            .iter()
            .flat_map(|at| {
                [
                    NameServerConfig::new(*at, Protocol::Udp),
                    NameServerConfig::new(*at, Protocol::Tcp),
                ]
            })
            .collect();
        TokioResolver::builder_with_config(
            ResolverConfig::from_parts(None, Vec::new(), servers),
            TokioConnectionProvider::default(),
        )
    };
    Ok(builder.with_options(options).build())
}

/// `name`'s addresses and how long they are good for.
async fn lookup(resolver: &TokioResolver, name: &str) -> Answer {
    let answer = resolver.lookup_ip(name).await.map_err(|e| e.to_string())?;
    let ttl = answer
        .valid_until()
        .saturating_duration_since(std::time::Instant::now());
    let addresses: Vec<IpAddr> = answer.iter().collect();
    if addresses.is_empty() {
        return Err("no A or AAAA record".into());
    }
    Ok((addresses, ttl))
}

/// An answer of [`lookup`]: the addresses and how long they are good for, or why there is
/// none.
type Answer = Result<(Vec<IpAddr>, Duration), String>;

/// Each of `names` looked up once, as the proxy looks it up (`dns.resolvers`, or the
/// system's), in order. On a thread of its own with a runtime of its own, so that it may be
/// called from a runtime or from none: before the gateway serves, and by `check-config`.
fn look_up_once(dns: &DnsConfig, names: Vec<String>) -> Result<Vec<(String, Answer)>, String> {
    let dns = dns.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime for DNS: {e}"))?;
        Ok(runtime.block_on(async {
            let made = resolver(&dns);
            let mut answers = Vec::with_capacity(names.len());
            for name in names {
                let answer = match &made {
                    Ok(resolver) => lookup(resolver, &name).await,
                    Err(error) => Err(error.clone()),
                };
                answers.push((name, answer));
            }
            answers
        }))
    })
    .join()
    .map_err(|_| "the DNS lookup panicked".to_owned())?
}

/// Why each of `names` that has no address has none, each looked up once as the proxy looks
/// it up: `check-config`'s lookup.
pub fn unresolved(dns: &DnsConfig, names: &[&str]) -> Result<Vec<(String, String)>, String> {
    let names = names.iter().map(|&n| n.to_owned()).collect();
    Ok(look_up_once(dns, names)?
        .into_iter()
        .filter_map(|(name, answer)| Some((name, answer.err()?)))
        .collect())
}

/// Looks every name of `upstream` up once and follows it (under `base`, its snapshot's
/// `upstream.base_path`): at start, before the first request. `Err` names the names with no
/// address, unless `upstream.allow_unresolved_at_start`.
pub fn resolve_at_start(
    backends: &Arc<Backends>,
    upstream: &UpstreamConfig,
    base: &BasePath,
) -> Result<(), String> {
    backends.follow(upstream, base);
    if upstream.names().is_empty() {
        return Ok(());
    }
    let (due, _, _) = backends.due(Instant::now());
    for (name, answer) in look_up_once(&upstream.dns, due)? {
        backends.looked_up(&name, answer);
    }
    let unresolved = backends.unresolved();
    if unresolved.is_empty() || upstream.dns.allow_unresolved_at_start {
        return Ok(());
    }
    Err(format!(
        "upstream name(s) {} did not resolve (upstream.allow_unresolved_at_start = true starts anyway)",
        unresolved.join(", ")
    ))
}

/// Looks each name up again when it is due, and a reload's new names at once.
pub struct NameFollower {
    pub backends: Arc<Backends>,
}

#[async_trait]
impl BackgroundService for NameFollower {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut resolving: Option<(DnsConfig, Result<TokioResolver, String>)> = None;
        loop {
            let (due, dns, next) = self.backends.due(Instant::now());
            if let (false, Some(dns)) = (due.is_empty(), dns) {
                if resolving.as_ref().is_none_or(|(was, _)| *was != dns) {
                    resolving = Some((dns.clone(), resolver(&dns)));
                }
                if let Some((_, made)) = &resolving {
                    for name in due {
                        let answer = match made {
                            Ok(resolver) => lookup(resolver, &name).await,
                            Err(error) => Err(error.clone()),
                        };
                        self.backends.looked_up(&name, answer);
                    }
                }
                continue;
            }
            let wake = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep_until(wake) => {}
                _ = self.backends.new_name() => {}
            }
        }
    }
}
