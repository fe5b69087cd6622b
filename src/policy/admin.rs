//! Who may call the admin listener, as a plain function over plain data: the endpoint's
//! [`Access`] and what is known of the request ([`Caller`]: its `Authorization` header,
//! whether it came from loopback, where a browser says it comes from) in, allowed or why not
//! ([`Denied`]) out. The admin app ([`crate::app::admin`]) gives each endpoint its access
//! and each denial its answer.
//!
//! With `[admin] token_sha256` set, every endpoint but the probes (and `/metrics`, unless
//! `admin.protect_metrics`) needs `Authorization: Bearer <token>`, or, on those that change
//! nothing, `Basic` credentials with the token as the password: what a browser asks for and
//! keeps, so that the board opens in one. Without a token those endpoints answer only
//! connections from loopback to loopback (this host, or a `kubectl port-forward`; not a
//! sidecar relaying its network from a loopback address) that name a loopback host (not a
//! page whose own name was made to resolve to this host: DNS rebinding), so that an admin
//! listener bound to a pod's or a host's address opens no admin action to its network. Both
//! are credentials a browser presents by itself, so neither opens anything to a request the
//! browser says another site's page made ([`FetchedFrom`]).

use base64::prelude::{Engine as _, BASE64_STANDARD};

use crate::config::{AdminConfig, TokenDigest};
use crate::http1::split_host;
use crate::policy::auth::matching_digest;

/// Who may call an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The probes: a kubelet has no token.
    Open,
    /// `/metrics`: open, unless `admin.protect_metrics` puts it behind the admin token.
    Metrics,
    /// What shows what the gateway knows (its config, every agent id, the retirement board's
    /// plan of every agent): behind the admin token when there is one, and for loopback only
    /// when there is none.
    Admin,
    /// What changes the gateway: as [`Access::Admin`], but only a bearer token opens it, never
    /// the Basic credentials a browser keeps and sends by itself (see [`presented_token`]).
    AdminAction,
}

impl Access {
    /// Whether calling it changes nothing, so that credentials a browser presents by itself
    /// may open it: all but [`Access::AdminAction`].
    fn changes_nothing(self) -> bool {
        self != Access::AdminAction
    }
}

/// Why a request may not reach its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The endpoint needs the admin token, and the request did not carry a valid one; `basic`:
    /// the endpoint also takes it as Basic credentials.
    Unauthorized { basic: bool },
    /// No admin token is configured, and the request came from another host.
    LoopbackOnly,
    /// No admin token is configured, and the request, from loopback, names a host that is not
    /// a loopback one: a browser's page whose name resolves to this host (DNS rebinding).
    NotLoopbackName,
    /// A request a browser says another site's page made ([`FetchedFrom`]), with only the
    /// credentials the browser presents by itself: Basic ones, or its loopback address.
    FromAnotherSite,
}

/// What [`authorize`] knows of a request.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    /// Its `Authorization` header.
    pub authorization: Option<&'a [u8]>,
    /// Both ends of its connection are loopback addresses.
    pub from_loopback: bool,
    /// It names a loopback host, or none ([`names_loopback`]).
    pub names_loopback: bool,
    /// Where a browser says it comes from.
    pub fetched_from: FetchedFrom,
}

impl<'a> Caller<'a> {
    /// A request with the headers `header` finds (by lowercase name), on a connection
    /// `from_loopback`: the one place that says which headers decide.
    pub fn of(header: impl Fn(&str) -> Option<&'a [u8]>, from_loopback: bool) -> Self {
        let host = header("host");
        Caller {
            authorization: header("authorization"),
            from_loopback,
            names_loopback: host.is_none_or(names_loopback),
            fetched_from: FetchedFrom::of(
                header("sec-fetch-site"),
                header("sec-fetch-mode"),
                header("sec-fetch-dest"),
                header("sec-fetch-user"),
                header("origin").map(|origin| (origin, host)),
            ),
        }
    }
}

/// Whether a `Host` names this host by a loopback name: `localhost` (and its subdomains,
/// RFC 6761), an address in 127.0.0.0/8, or `[::1]`, with any port. A name a browser's page
/// may have made resolve here (DNS rebinding) is none of those.
pub fn names_loopback(host: &[u8]) -> bool {
    let Some((name, _port)) = std::str::from_utf8(host).ok().and_then(split_host) else {
        return false;
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    if let Ok(ip) = name.parse::<std::net::IpAddr>() {
        return ip.to_canonical().is_loopback();
    }
    let name = name.to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// Where a browser says a request comes from, by its Fetch Metadata headers, or, from a
/// browser that sends none (older ones, and every one to an `http://` name other than a
/// loopback one), by its `Origin`, which browsers send with every `POST`. From clients other
/// than browsers, and on a browser's `GET` without Fetch Metadata, [`FetchedFrom::NotSaid`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchedFrom {
    NotSaid,
    /// The listener's own page (`Sec-Fetch-Site: same-origin`, or an `Origin` of the `Host` it
    /// names), or typed or bookmarked (`none`).
    OwnPage,
    /// Another site's page, as a link a person followed: a top-level navigation the user made
    /// (`Sec-Fetch-Mode: navigate`, `Sec-Fetch-Dest: document`, `Sec-Fetch-User: ?1`).
    LinkFollowed,
    /// Another site's page, by itself: an image, a frame, a fetch, a script's navigation.
    AnotherSite,
}

impl FetchedFrom {
    /// By `Sec-Fetch-Site`, `-Mode`, `-Dest` and `-User`; without them, by the `Origin` and
    /// the `Host` a request names.
    pub fn of(
        site: Option<&[u8]>,
        mode: Option<&[u8]>,
        dest: Option<&[u8]>,
        user: Option<&[u8]>,
        origin_and_host: Option<(&[u8], Option<&[u8]>)>,
    ) -> Self {
        match site {
            None => match origin_and_host {
                None => FetchedFrom::NotSaid,
                Some((origin, Some(host))) if is_origin_of(origin, host) => FetchedFrom::OwnPage,
                Some(_) => FetchedFrom::AnotherSite,
            },
            Some(b"same-origin" | b"none") => FetchedFrom::OwnPage,
            Some(_)
                if mode == Some(b"navigate")
                    && dest == Some(b"document")
                    && user == Some(b"?1") =>
            {
                FetchedFrom::LinkFollowed
            }
            Some(_) => FetchedFrom::AnotherSite,
        }
    }

    /// Whether credentials a browser presents by itself (Basic ones, its loopback address) may
    /// open an endpoint of `access` for a request from here. Such a request reads nothing,
    /// but it may act (a reload, from a form another site's page submits), and each board it
    /// loads may query Prometheus for seconds. A link followed opens what changes nothing.
    fn lets_a_browser_s_own_credentials_open(self, access: Access) -> bool {
        match self {
            FetchedFrom::NotSaid | FetchedFrom::OwnPage => true,
            FetchedFrom::LinkFollowed => access.changes_nothing(),
            FetchedFrom::AnotherSite => false,
        }
    }
}

/// Whether `origin` (`http://name:port`, RFC 6454) is that of a page at `host` on the admin
/// listener, which speaks plain HTTP: the same name and port, port 80 written or not. `null`
/// (an opaque origin) and `https://` pages are not.
fn is_origin_of(origin: &[u8], host: &[u8]) -> bool {
    let Some(authority) = origin.strip_prefix(b"http://") else {
        return false;
    };
    fn without_port_80(authority: &[u8]) -> &[u8] {
        authority.strip_suffix(b":80").unwrap_or(authority)
    }
    without_port_80(authority).eq_ignore_ascii_case(without_port_80(host))
}

/// Whether `caller` may reach an endpoint of `access`, under `admin`: the one place where
/// admin authorization is decided. No token configured: the admin endpoints answer loopback
/// only, the others everyone. The token is compared as a digest, against every configured one
/// in constant time (a rotation lists the old and the new).
pub fn authorize(access: Access, admin: &AdminConfig, caller: &Caller) -> Result<(), Denied> {
    let needs_token = match access {
        Access::Open => false,
        Access::Metrics => admin.protect_metrics,
        Access::Admin | Access::AdminAction => true,
    };
    if !needs_token {
        return Ok(());
    }
    let browser_may = caller
        .fetched_from
        .lets_a_browser_s_own_credentials_open(access);
    if admin.tokens.is_empty() {
        return match access {
            Access::Admin | Access::AdminAction if !caller.from_loopback => {
                Err(Denied::LoopbackOnly)
            }
            Access::Admin | Access::AdminAction if !caller.names_loopback => {
                Err(Denied::NotLoopbackName)
            }
            Access::Admin | Access::AdminAction if !browser_may => Err(Denied::FromAnotherSite),
            _ => Ok(()),
        };
    }
    // Basic credentials open what changes nothing (see `presented_token`).
    let basic = access.changes_nothing();
    let refused = Denied::Unauthorized { basic };
    let presented = caller
        .authorization
        .and_then(|value| presented_token(value, basic))
        .ok_or(refused)?;
    let (Presented::Bearer(digest) | Presented::Basic(digest)) = &presented;
    matching_digest(digest, &admin.tokens).ok_or(refused)?;
    // After the token: a wrong one is a 401 however it came.
    match presented {
        Presented::Basic(_) if !browser_may => Err(Denied::FromAnotherSite),
        _ => Ok(()),
    }
}

/// An admin token as a request presents it, by its digest.
enum Presented {
    Bearer(TokenDigest),
    /// Basic credentials with the token as the password: a browser's, which it sends by itself.
    Basic(TokenDigest),
}

/// The admin token an `Authorization` header presents: `Bearer <token>`, or, where `basic`,
/// `Basic` credentials with the token as the password (any user name). A browser asks for
/// those on a 401 and then sends them to the listener with every request, those a page on
/// another site makes it send included (cross-site request forgery): so they are taken only
/// where the answer changes nothing, which another site cannot read, and not at all for what
/// a browser says another site's page made ([`FetchedFrom`]).
fn presented_token(value: &[u8], basic: bool) -> Option<Presented> {
    if let Some(token) = bearer_token(value) {
        return Some(Presented::Bearer(TokenDigest::of(token)));
    }
    if !basic {
        return None;
    }
    basic_password(value).map(|password| Presented::Basic(TokenDigest::of(&password)))
}

/// What follows `scheme` (its name and a space) in an `Authorization` value, trimmed: the
/// scheme's name in any case (RFC 9110 11.1).
fn after_scheme<'v>(value: &'v [u8], scheme: &[u8]) -> Option<&'v [u8]> {
    let (name, rest) = value.split_at_checked(scheme.len())?;
    name.eq_ignore_ascii_case(scheme).then(|| rest.trim_ascii())
}

/// The token of `Bearer <token>`.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    after_scheme(value, b"bearer ").filter(|token| !token.is_empty())
}

/// The password of `Basic <base64 of user:password>` (RFC 7617), when there is one.
fn basic_password(value: &[u8]) -> Option<Vec<u8>> {
    let pair = BASE64_STANDARD
        .decode(after_scheme(value, b"basic ")?)
        .ok()?;
    let colon = memchr::memchr(b':', &pair)?;
    let password = &pair[colon + 1..];
    (!password.is_empty()).then(|| password.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request with `authorization`, from loopback or not, that no browser says another
    /// site made.
    fn caller(authorization: Option<&[u8]>, from_loopback: bool) -> Caller<'_> {
        Caller {
            authorization,
            from_loopback,
            names_loopback: true,
            fetched_from: FetchedFrom::NotSaid,
        }
    }

    #[test]
    fn admin_endpoints_need_the_token_or_without_one_loopback() {
        let open = AdminConfig::default();
        let closed = AdminConfig {
            tokens: vec![TokenDigest::of(b"old"), TokenDigest::of(b"new")],
            protect_metrics: false,
        };
        let metrics_too = AdminConfig {
            protect_metrics: true,
            ..closed.clone()
        };
        for access in [
            Access::Open,
            Access::Metrics,
            Access::Admin,
            Access::AdminAction,
        ] {
            assert_eq!(authorize(access, &open, &caller(None, true)), Ok(()));
        }
        // Without a token, from another host: the probes and metrics, nothing else.
        assert_eq!(authorize(Access::Open, &open, &caller(None, false)), Ok(()));
        assert_eq!(
            authorize(Access::Metrics, &open, &caller(None, false)),
            Ok(())
        );
        for admin in [Access::Admin, Access::AdminAction] {
            assert_eq!(
                authorize(admin, &open, &caller(Some(b"Bearer any"), false)),
                Err(Denied::LoopbackOnly)
            );
        }
        assert_eq!(
            authorize(Access::Open, &metrics_too, &caller(None, false)),
            Ok(())
        );
        assert_eq!(
            authorize(Access::Metrics, &closed, &caller(None, false)),
            Ok(())
        );
        let refused = Err(Denied::Unauthorized { basic: true });
        assert_eq!(
            authorize(Access::Metrics, &metrics_too, &caller(None, true)),
            refused
        );
        // With a token, loopback is no exception.
        assert_eq!(
            authorize(Access::Admin, &closed, &caller(None, true)),
            refused
        );
        // A bearer token opens everything; Basic, the token as the password and any user
        // name, only what changes nothing.
        for (good, opens_actions) in [
            (&b"Bearer old"[..], true),
            (b"Bearer new", true),
            (b"bearer new", true),
            (b"BEARER  new ", true),
            (b"Basic YWRtaW46bmV3", false), // admin:new
            (b"BASIC  Om9sZA== ", false),   // :old
            (b"basic dTpuZXc=", false),     // u:new
        ] {
            assert_eq!(
                authorize(Access::Admin, &closed, &caller(Some(good), false)),
                Ok(())
            );
            assert_eq!(
                authorize(Access::Metrics, &metrics_too, &caller(Some(good), false)),
                Ok(())
            );
            let action = match opens_actions {
                true => Ok(()),
                false => Err(Denied::Unauthorized { basic: false }),
            };
            assert_eq!(
                authorize(Access::AdminAction, &closed, &caller(Some(good), false)),
                action,
                "{good:?}"
            );
        }
        for bad in [
            &b"Bearer wrong"[..],
            b"Bearer ",
            b"Basic b2xkOg==", // old: (the token as the user name, no password)
            b"Basic OmJsZA==", // :bld
            b"Basic bmV3",     // new (no colon)
            b"Basic Om5ldw=",  // :new, but not base64 (one pad short)
            b"Basic ",
            b"Basic",
            b"old",
            b"Bearerold",
        ] {
            assert_eq!(
                authorize(Access::Admin, &closed, &caller(Some(bad), true)),
                refused,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_browser_s_own_credentials_open_nothing_another_site_s_page_asks_for() {
        let closed = AdminConfig {
            tokens: vec![TokenDigest::of(b"new")],
            protect_metrics: true,
        };
        let open = AdminConfig::default();
        let by = |authorization: Option<&'static [u8]>, from_loopback, fetched_from| Caller {
            authorization,
            from_loopback,
            names_loopback: true,
            fetched_from,
        };
        let basic = Some(&b"Basic dTpuZXc="[..]); // u:new
        for access in [Access::Admin, Access::Metrics] {
            assert_eq!(
                authorize(access, &closed, &by(basic, false, FetchedFrom::AnotherSite)),
                Err(Denied::FromAnotherSite)
            );
            assert_eq!(
                authorize(
                    access,
                    &closed,
                    &by(basic, false, FetchedFrom::LinkFollowed)
                ),
                Ok(())
            );
            // A wrong token is refused as everywhere; a bearer token no browser sends by itself.
            let wrong = by(Some(b"Basic dTpvbGQ="), false, FetchedFrom::AnotherSite); // u:old
            assert_eq!(
                authorize(access, &closed, &wrong),
                Err(Denied::Unauthorized { basic: true })
            );
            let bearer = by(Some(b"Bearer new"), false, FetchedFrom::AnotherSite);
            assert_eq!(authorize(access, &closed, &bearer), Ok(()));
        }
        // Without a token, a loopback address is what a browser presents by itself.
        for (access, fetched_from, answer) in [
            (
                Access::Admin,
                FetchedFrom::AnotherSite,
                Err(Denied::FromAnotherSite),
            ),
            (Access::Admin, FetchedFrom::LinkFollowed, Ok(())),
            (Access::Admin, FetchedFrom::OwnPage, Ok(())),
            (
                Access::AdminAction,
                FetchedFrom::AnotherSite,
                Err(Denied::FromAnotherSite),
            ),
            // A form another site's page submits, by a person's click.
            (
                Access::AdminAction,
                FetchedFrom::LinkFollowed,
                Err(Denied::FromAnotherSite),
            ),
            (Access::AdminAction, FetchedFrom::OwnPage, Ok(())),
            (Access::Metrics, FetchedFrom::AnotherSite, Ok(())),
        ] {
            let caller = by(None, true, fetched_from);
            assert_eq!(
                authorize(access, &open, &caller),
                answer,
                "{access:?} {fetched_from:?}"
            );
        }
    }

    #[test]
    fn fetch_metadata_says_where_a_request_comes_from() {
        use FetchedFrom::*;
        // Sec-Fetch-Site, -Mode, -Dest and -User ("": absent).
        for (site, mode, dest, user, from) in [
            ("", "", "", "", NotSaid),
            ("same-origin", "cors", "empty", "", OwnPage),
            ("none", "navigate", "document", "?1", OwnPage),
            // A link from a dashboard on another site to the board, clicked.
            ("cross-site", "navigate", "document", "?1", LinkFollowed),
            ("same-site", "navigate", "document", "?1", LinkFollowed),
            // The same navigation by the page's script, with no click.
            ("cross-site", "navigate", "document", "", AnotherSite),
            ("cross-site", "no-cors", "image", "", AnotherSite),
            ("cross-site", "navigate", "iframe", "?1", AnotherSite),
            ("same-site", "cors", "empty", "", AnotherSite),
            ("cross-site", "", "", "", AnotherSite),
        ] {
            let header = |value: &'static str| (!value.is_empty()).then_some(value.as_bytes());
            assert_eq!(
                FetchedFrom::of(header(site), header(mode), header(dest), header(user), None),
                from,
                "{site} {mode} {dest} {user}"
            );
        }
    }

    #[test]
    fn without_fetch_metadata_the_origin_says_where_a_request_comes_from() {
        use FetchedFrom::*;
        let from = |origin: &'static str, host: Option<&'static str>| {
            FetchedFrom::of(
                None,
                None,
                None,
                None,
                Some((origin.as_bytes(), host.map(str::as_bytes))),
            )
        };
        let listener = "127.0.0.1:9090";
        for (origin, host, answer) in [
            ("http://127.0.0.1:9090", Some(listener), OwnPage),
            ("http://LOCALHOST:9090", Some("localhost:9090"), OwnPage),
            ("http://admin.example", Some("admin.example:80"), OwnPage),
            ("http://admin.example:80", Some("admin.example"), OwnPage),
            // A form on another site's page, posted by a browser that sends no Fetch Metadata.
            ("http://evil.example", Some(listener), AnotherSite),
            ("http://127.0.0.1:9091", Some(listener), AnotherSite),
            ("http://127.0.0.1", Some(listener), AnotherSite),
            // The listener speaks plain HTTP: a page on https:// is another's.
            ("https://127.0.0.1:9090", Some(listener), AnotherSite),
            ("https://admin.example", Some("admin.example"), AnotherSite),
            // An opaque origin (a sandboxed frame, a file), and an origin with no host to match.
            ("null", Some(listener), AnotherSite),
            ("http://127.0.0.1:9090", None, AnotherSite),
        ] {
            assert_eq!(from(origin, host), answer, "{origin} {host:?}");
        }
        // Fetch Metadata, when sent, decides.
        let site = Some(&b"cross-site"[..]);
        let own = Some((&b"http://127.0.0.1:9090"[..], Some(&b"127.0.0.1:9090"[..])));
        assert_eq!(FetchedFrom::of(site, None, None, None, own), AnotherSite);
    }

    #[test]
    fn loopback_names_are_localhost_127_and_the_ipv6_loopback() {
        for host in [
            "localhost",
            "localhost:9090",
            "LocalHost.:9090",
            "board.localhost:9090",
            "127.0.0.1",
            "127.0.0.1:9090",
            "127.1.2.3:9090",
            "[::1]:9090",
            "[::1]",
            "[::ffff:127.0.0.1]:9090",
        ] {
            assert!(names_loopback(host.as_bytes()), "{host}");
        }
        for host in [
            "rebind.attacker.example:9090",
            "localhost.attacker.example",
            "mylocalhost:9090",
            "10.0.0.5:9090",
            "0.0.0.0:9090",
            "[::]:9090",
            "[::1",
            "[fe80::1]:9090",
            "[::1]evil",
            "[::1]:x",
            "localhost:x",
            "localhost:9090:1",
            "",
        ] {
            assert!(!names_loopback(host.as_bytes()), "{host}");
        }
    }

    #[test]
    fn without_a_token_a_request_from_loopback_must_name_a_loopback_host() {
        let open = AdminConfig::default();
        let rebound = Caller {
            names_loopback: false,
            ..caller(None, true)
        };
        for access in [Access::Admin, Access::AdminAction] {
            assert_eq!(
                authorize(access, &open, &rebound),
                Err(Denied::NotLoopbackName)
            );
        }
        for access in [Access::Open, Access::Metrics] {
            assert_eq!(authorize(access, &open, &rebound), Ok(()));
        }
        // With a token, the token decides: a page on another name cannot know it.
        let closed = AdminConfig {
            tokens: vec![TokenDigest::of(b"new")],
            protect_metrics: false,
        };
        let with_token = Caller {
            names_loopback: false,
            ..caller(Some(b"Bearer new"), true)
        };
        assert_eq!(authorize(Access::AdminAction, &closed, &with_token), Ok(()));
    }

    #[test]
    fn a_caller_is_read_from_its_headers() {
        let headers = [
            ("host", "rebind.example:9090"),
            ("authorization", "Bearer t"),
            ("origin", "http://rebind.example:9090"),
        ];
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_bytes())
        };
        let caller = Caller::of(header, true);
        assert_eq!(caller.authorization, Some(&b"Bearer t"[..]));
        assert!(caller.from_loopback);
        assert!(!caller.names_loopback);
        assert_eq!(caller.fetched_from, FetchedFrom::OwnPage);
        // No Host (HTTP/1.0, and clients that are not browsers): nothing to rebind.
        assert!(Caller::of(|_| None, true).names_loopback);
    }
}
