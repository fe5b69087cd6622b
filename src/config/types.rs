//! The validated value types a snapshot is made of. A leaf: it depends on nothing else in the
//! crate, and every constructor checks its input, so once built nothing re-checks: a
//! [`BusinessCode`] is always a safe path segment, a [`TokenDigest`] always 32 bytes, a
//! [`BasePath`] always a clean absolute path.

use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

/// A service business code: one safe path segment, `[A-Za-z0-9._~-]+`, never `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BusinessCode(String);

impl BusinessCode {
    pub fn parse(s: &str) -> Result<Self, String> {
        let safe = s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-'));
        if s.is_empty() || !safe || s == "." || s == ".." {
            return Err(format!(
                "{s:?} is not a safe path segment (allowed: A-Z a-z 0-9 . _ ~ -, not . or ..)"
            ));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An absolute path prefix made of safe segments, without a trailing slash (`/api/v1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasePath(String);

impl BasePath {
    pub fn parse(s: &str) -> Result<Self, String> {
        let Some(rest) = s.strip_prefix('/') else {
            return Err(format!("{s:?} must start with /"));
        };
        if rest.is_empty() {
            return Err("must have at least one segment (\"/\" alone is not a base)".into());
        }
        for seg in rest.split('/') {
            BusinessCode::parse(seg).map_err(|e| format!("in {s:?}: {e}"))?;
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when `self` equals `other` or is a whole-segment prefix of it.
    pub fn covers(&self, other: &BasePath) -> bool {
        other.0 == self.0
            || (other.0.starts_with(&self.0) && other.0.as_bytes()[self.0.len()] == b'/')
    }
}

/// The three base paths: public v1, public v2 and the backend's v2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bases {
    pub v1: BasePath,
    pub v2: BasePath,
    pub upstream: BasePath,
}

/// The SHA-256 of an agent's token. The token itself is never stored.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenDigest(pub [u8; 32]);

impl TokenDigest {
    /// The digest of `token`.
    pub fn of(token: &[u8]) -> Self {
        Self(Sha256::digest(token).into())
    }

    pub fn parse_hex(s: &str) -> Result<Self, String> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out)
            .map_err(|_| "must be 64 hex digits (the SHA-256 of the token)".to_string())?;
        Ok(Self(out))
    }

    /// The digest as written in `token_sha256`.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Its first 8 hex digits: how metrics name a token. They tell tokens apart and give
    /// nothing of a token that is not guessable (a weak one, such as the demo's, can be
    /// checked against them as against the whole digest).
    pub fn label(&self) -> String {
        hex::encode(&self.0[..4])
    }
}

/// An IP network (`10.0.0.0/8`, `2001:db8::/32`) or one address (`192.0.2.7`, a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    /// The network's address, its host bits zero.
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not an IP address or network such as 10.0.0.0/8");
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse().ok().filter(|n| *n <= max).ok_or_else(bad)?
            }
            Some(_) => return Err(bad()),
        };
        // `::ffff:10.0.0.5` (as a dual-stack socket shows an IPv4 peer) is the IPv4 address it
        // maps, as `contains` sees peers: else it could never match.
        let (addr, prefix) = match addr {
            IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => (IpAddr::V4(v4), prefix - 96),
                None => (addr, prefix),
            },
            _ => (addr, prefix),
        };
        let net = IpNet { addr, prefix };
        if net.masked(addr) != addr {
            return Err(format!(
                "{s:?} has host bits set: the network is {}/{prefix}",
                net.masked(addr)
            ));
        }
        Ok(net)
    }

    /// Whether `ip` is in this network (an IPv4-mapped IPv6 address as its IPv4 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && self.masked(ip) == self.addr
    }

    /// `ip` with the bits past the prefix cleared (`ip` of this network's family).
    fn masked(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(v4) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(v4) & mask).into())
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenDigest(..)")
    }
}

listed_enum! {
    /// What the gateway does with an agent's v1 calls.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
    #[serde(rename_all = "lowercase")]
    pub enum V1Policy {
        /// Forward, subject to sunset enforcement and brownouts.
        #[default]
        Allow => "allow",
        /// Refuse every v1 call with 410.
        Block => "block",
        /// Always forward: never blocked, browned out or sunset.
        Exempt => "exempt",
    }
}

/// What happens to request bodies that break the spec's schemas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ValidationMode {
    /// Answer 400 naming the field and rule; nothing reaches the backend.
    #[default]
    Enforce,
    /// Forward anyway, but count and log the violation.
    Report,
    /// Do not validate.
    Off,
}

/// Where the per-agent buckets live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RateLimitBackend {
    /// In this process: each replica allows every agent its whole limit.
    #[default]
    Local,
    /// In a Redis shared by every replica: the limit holds across them all.
    Redis,
}

/// What a request of a rate-limited agent gets when Redis cannot decide in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnRedisError {
    /// This replica's own in-process buckets decide (the limit then holds per replica).
    #[default]
    Local,
    /// Let the request through.
    Allow,
    /// Refuse it with 429 (message_code 42901).
    Deny,
}

/// The two dates v1 answers announce: `[retirement]`'s, or an agent's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dates {
    /// Sent as `Deprecation` (RFC 9745).
    pub deprecated_at: Option<SystemTime>,
    /// Sent as `Sunset` (RFC 8594); with `retirement.enforce_sunset`, the v1 cut-off.
    pub sunset_at: Option<SystemTime>,
}

impl Dates {
    /// These dates, each one not set here taken from `fallback`.
    pub fn or(self, fallback: Dates) -> Dates {
        Dates {
            deprecated_at: self.deprecated_at.or(fallback.deprecated_at),
            sunset_at: self.sunset_at.or(fallback.sunset_at),
        }
    }
}

/// How often a brownout window recurs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Repeat {
    Daily,
    Weekly,
}

impl Repeat {
    /// The time from one window's start to the next one's.
    pub fn period(self) -> Duration {
        match self {
            Repeat::Daily => Duration::from_secs(86_400),
            Repeat::Weekly => Duration::from_secs(7 * 86_400),
        }
    }
}

listed_enum! {
    /// A day of the week, in UTC; Monday first, as ISO 8601 counts.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
    #[serde(rename_all = "lowercase")]
    pub enum Weekday {
        Mon,
        Tue,
        Wed,
        Thu,
        Fri,
        Sat,
        Sun,
    }
}

impl Weekday {
    /// The UTC day of the week `t` falls on.
    pub fn of(t: SystemTime) -> Weekday {
        // 1970-01-01 was a Thursday, index 3 counting from Monday.
        let days = unix_seconds(t) / 86_400;
        Self::ALL[((days + 3) % 7) as usize]
    }
}

/// An RFC 3339 time with any offset (`2027-06-01T00:00:00Z`, `2027-06-01T02:00:00+02:00`), as
/// every date in the file is written. Every output writes it back in UTC ([`format_time`]).
pub(super) fn parse_time(s: &str) -> Result<SystemTime, String> {
    let bad = |why: &str| {
        format!(
            "{s:?} is not an RFC 3339 time such as 2027-06-01T00:00:00Z or \
             2027-06-01T02:00:00+02:00 ({why})"
        )
    };
    if s.is_empty() {
        return Err("required: an RFC 3339 time such as 2027-06-01T00:00:00Z".into());
    }
    let upper = s.to_ascii_uppercase();
    let (local, east) = match upper.len().checked_sub(6).map(|i| upper.split_at(i)) {
        Some((local, offset)) if offset.starts_with(['+', '-']) => {
            let east = utc_offset(offset).ok_or_else(|| bad("offset is not +hh:mm or -hh:mm"))?;
            (local, east)
        }
        _ => match upper.strip_suffix('Z') {
            Some(local) => (local, 0),
            None => return Err(bad("no offset: end it with Z for UTC, or +hh:mm")),
        },
    };
    let as_utc = humantime::parse_rfc3339(&format!("{local}Z")).map_err(|e| bad(&e.to_string()))?;
    let shift = Duration::from_secs(east.unsigned_abs());
    let utc = if east >= 0 {
        as_utc.checked_sub(shift)
    } else {
        as_utc.checked_add(shift)
    };
    utc.ok_or_else(|| bad("out of range"))
}

/// Seconds east of UTC of an RFC 3339 offset, `+hh:mm` or `-hh:mm`.
fn utc_offset(offset: &str) -> Option<i64> {
    let (sign, rest) = offset.split_at(1);
    let (h, m) = rest.split_once(':')?;
    let digits = |d: &str| {
        (d.len() == 2 && d.bytes().all(|b| b.is_ascii_digit()))
            .then(|| d.parse::<i64>().ok())
            .flatten()
    };
    let (h, m) = (digits(h)?, digits(m)?);
    if h > 23 || m > 59 {
        return None;
    }
    let secs = h * 3600 + m * 60;
    Some(if sign == "-" { -secs } else { secs })
}

/// A time as every output writes it: RFC 3339, whole seconds, UTC.
pub fn format_time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Whole seconds since the Unix epoch (0 before it).
pub fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_base_paths_are_refused() {
        for bad in [
            "api/v1",
            "/",
            "/api/",
            "/api//v1",
            "/api/../v1",
            "/api/v%31",
        ] {
            assert!(BasePath::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(BasePath::parse("/gw/api/v1").is_ok());
    }

    #[test]
    fn business_codes_are_single_safe_segments() {
        for bad in ["", ".", "..", "a/b", "a b", "a%2Fb", "é"] {
            assert!(BusinessCode::parse(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["ORG_DEFAULT", "a.b", "x~y-z", "..."] {
            assert!(BusinessCode::parse(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn weekdays_are_utc_days() {
        let at = |s: &str| humantime::parse_rfc3339(s).unwrap();
        assert_eq!(Weekday::of(at("1970-01-01T00:00:00Z")), Weekday::Thu);
        assert_eq!(Weekday::of(at("2026-12-07T00:00:00Z")), Weekday::Mon);
        assert_eq!(Weekday::of(at("2026-12-13T23:59:59Z")), Weekday::Sun);
        assert_eq!(Weekday::of(at("2026-12-14T00:00:00Z")), Weekday::Mon);
    }

    #[test]
    fn an_agents_dates_fall_back_one_by_one() {
        let t = |s| Some(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        let own = Dates {
            deprecated_at: None,
            sunset_at: t(20),
        };
        let global = Dates {
            deprecated_at: t(1),
            sunset_at: t(10),
        };
        assert_eq!(
            own.or(global),
            Dates {
                deprecated_at: t(1),
                sunset_at: t(20)
            }
        );
    }

    #[test]
    fn times_take_any_offset_and_are_kept_in_utc() {
        let utc = parse_time("2027-06-01T00:00:00Z").unwrap();
        for same in [
            "2027-06-01T02:00:00+02:00",
            "2027-05-31T19:30:00-04:30",
            "2027-06-01t00:00:00z",
            "2027-06-01T00:00:00-00:00",
        ] {
            assert_eq!(parse_time(same), Ok(utc), "{same}");
        }
        assert_eq!(format_time(utc), "2027-06-01T00:00:00Z");
        for bad in [
            "2027-06-01T00:00:00",
            "2027-06-01T00:00:00+2:00",
            "2027-06-01T00:00:00+24:00",
            "tomorrow",
            "",
        ] {
            assert!(parse_time(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn networks_hold_their_addresses_and_nothing_else() {
        let net = |s: &str| IpNet::parse(s).unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(net("10.0.0.0/8").contains(ip("10.255.1.2")));
        assert!(!net("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(net("192.0.2.7").contains(ip("192.0.2.7")));
        assert!(!net("192.0.2.7").contains(ip("192.0.2.8")));
        assert!(net("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(!net("0.0.0.0/0").contains(ip("::1")));
        assert!(net("2001:db8::/32").contains(ip("2001:db8:1::5")));
        assert!(!net("2001:db8::/32").contains(ip("2001:db9::5")));
        // A v4 peer seen on a dual-stack socket is still the v4 address, and so is a network
        // written as a dual-stack socket shows it (else it could never match).
        assert!(net("127.0.0.0/8").contains(ip("::ffff:127.0.0.2")));
        assert_eq!(net("::ffff:10.0.0.5"), net("10.0.0.5"));
        assert_eq!(net("::ffff:10.0.0.0/104"), net("10.0.0.0/8"));
        assert!(net("::ffff:10.0.0.5").contains(ip("10.0.0.5")));
        assert!(net("::ffff:10.0.0.5").contains(ip("::ffff:10.0.0.5")));
        for bad in [
            "10.0.0.1/8",
            "10.0.0.0/33",
            "10.0.0.0/",
            "10/8",
            "::1/129",
            "x",
            "1.2.3.4/-1",
        ] {
            assert!(IpNet::parse(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(net("10.0.0.0/8").to_string(), "10.0.0.0/8");
    }

    #[test]
    fn a_token_digest_is_the_hex_sha256_of_the_token() {
        let d = TokenDigest::of(b"secret");
        assert_eq!(
            d.to_hex(),
            "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
        );
        assert_eq!(d.label(), "2bb80d53");
        assert_eq!(TokenDigest::parse_hex(&d.to_hex()), Ok(d));
    }
}
