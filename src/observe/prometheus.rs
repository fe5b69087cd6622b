//! A Prometheus server's query API, over HTTP or HTTPS with credentials ([`crate::client`]):
//! where `v1-usage --prometheus` reads the fleet's v1 usage ([`super::fleet`]) from, and what
//! the admin listener's retirement board can read it with too.

use std::time::SystemTime;

use crate::client::{Client, ClientError, ClientOptions};
use crate::http1::percent_encode;
use crate::observe::fleet::{FleetError, Prometheus};

/// A Prometheus at its base URL (with the path prefix of its `--web.route-prefix`, if any).
pub struct PrometheusApi {
    client: Client,
}

impl PrometheusApi {
    /// The Prometheus at `url`, reached as `options` say.
    pub fn new(url: &str, options: &ClientOptions) -> Result<Self, ClientError> {
        Ok(Self {
            client: Client::new(url, options)?,
        })
    }

    /// Its base URL, without credentials.
    pub fn base(&self) -> String {
        self.client.base()
    }
}

impl Prometheus for PrometheusApi {
    async fn query(&mut self, promql: &str, at: Option<SystemTime>) -> Result<Vec<u8>, FleetError> {
        let mut path = format!("/api/v1/query?query={}", percent_encode(promql));
        if let Some(t) = at {
            let secs = t
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            path.push_str(&format!("&time={secs:.3}"));
        }
        let answer = self
            .client
            .get(&path)
            .await
            .map_err(|e| FleetError::Fetch(e.to_string()))?;
        // Prometheus answers its errors in JSON too, with a 4xx or 5xx status: the body says
        // why. Anything else (a proxy's 401 or 502 page) is not Prometheus speaking.
        let json = answer.body.first() == Some(&b'{');
        if !(200..300).contains(&answer.status) && !json {
            return Err(FleetError::Fetch(format!(
                "{} answered {}{}",
                self.base(),
                answer.status,
                match answer.status {
                    401 | 403 => " (check the credentials)",
                    _ => "",
                }
            )));
        }
        Ok(answer.body.to_vec())
    }
}
