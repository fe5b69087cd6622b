//! How a secret is hidden wherever it could be shown: `config dump` and the admin listener's
//! `/config`, a problem of the config (`check-config`, a refused reload), a log line, a
//! client's error, the `Debug` print of a struct that holds a URL. A value is replaced whole
//! by [`REDACTED`] (a token digest); a URL keeps all but its password, which [`redact_url`]
//! replaces by the same marker. Here, beneath the config and the clients, so that each of
//! them hides a secret the same way.

/// What a redacted value, or a URL's redacted password, reads.
pub const REDACTED: &str = "<redacted>";

/// `url` with anything after its user name's `:` replaced by [`REDACTED`]:
/// `scheme://user:<redacted>@host...`. A URL without a password is returned as it is; one
/// written without its scheme (`user:pw@host:1`, refused, but shown in the problem) is
/// redacted all the same.
///
/// The user information is taken to end at the last `@`, not at the first `/`: a password
/// written unencoded may hold a `/`, `?` or `#` (`openssl rand -base64` makes `/`), which
/// would end it early and leave the rest on show. Masking too much (a path with an `@` and a
/// port before it) is the safe mistake.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    let Some((user, _password)) = userinfo.split_once(':') else {
        return url.to_owned();
    };
    let scheme = scheme.map_or_else(String::new, |s| format!("{s}://"));
    format!("{scheme}{user}:{REDACTED}@{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_s_password_is_redacted_and_the_rest_kept() {
        for (url, shown) in [
            ("http://u:secret@h/p", "http://u:<redacted>@h/p"),
            (
                "redis://:hunter2@127.0.0.1:6379/0",
                "redis://:<redacted>@127.0.0.1:6379/0",
            ),
            (
                "https://reader:p%40ss@prom.example:9443/prometheus/",
                "https://reader:<redacted>@prom.example:9443/prometheus/",
            ),
            // A `:` in the password: the user name ends at the first.
            ("http://u:pa:ss@h", "http://u:<redacted>@h"),
            // No scheme: refused by every key, and redacted in the problem that says so.
            ("u:secret@h:1", "u:<redacted>@h:1"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn a_url_without_a_password_is_shown_as_written() {
        for url in [
            "http://prometheus:9090",
            "redis://h:1",
            "redis://app@127.0.0.1:6379/0",
            "http://h/a@b",
            "not a url",
            "",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }

    /// Unencoded, each of these would end a parser's authority early: the user information
    /// ends at the last `@`.
    #[test]
    fn a_password_written_unencoded_is_redacted_whole() {
        for password in [
            "Sup3r/Secret+pw==",
            "hunt3r?two",
            "k3pt#s3cr3t",
            "qwx/zyk@vvq",
            "pr:om/pw",
        ] {
            let shown = redact_url(&format!("http://ops:{password}@prometheus:9090/prom"));
            assert_eq!(shown, "http://ops:<redacted>@prometheus:9090/prom");
        }
    }
}
