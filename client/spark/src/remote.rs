//! The `sc://host:port/;token=..;use_ssl=true;user_id=..` connection string, token redacted.

use std::fmt;

use spark_connect_core::ChannelBuilder;

use crate::error::{Error, Result};

/// A parsed Spark Connect connection string (Spark's `sc://` URL format).
///
/// Parsing is the ASF core crate's (`ChannelBuilder`), so every parameter Spark
/// documents is understood; unknown `key=value` parameters become gRPC headers.
/// The token never appears in `Debug` or `Display`.
///
/// ```
/// use kindling_spark::RemoteUrl;
/// let url = RemoteUrl::parse("sc://spark.example:443/;use_ssl=true;token=s3cr3t;user_id=ada")?;
/// assert_eq!(url.address(), "spark.example:443");
/// assert!(url.use_ssl());
/// assert_eq!(url.user_id(), Some("ada"));
/// assert!(!format!("{url:?}").contains("s3cr3t"));
/// # Ok::<(), kindling_spark::Error>(())
/// ```
#[derive(Clone)]
pub struct RemoteUrl {
    builder: ChannelBuilder,
    redacted: String,
}

impl RemoteUrl {
    /// Parses `sc://host[:port][/;key=value;...]` (default port 15002).
    ///
    /// ```
    /// let url = kindling_spark::RemoteUrl::parse("sc://localhost")?;
    /// assert_eq!(url.address(), "localhost:15002");
    /// # Ok::<(), kindling_spark::Error>(())
    /// ```
    pub fn parse(url: &str) -> Result<Self> {
        let redacted = redact(url);
        let builder = ChannelBuilder::parse(url).map_err(|e| Error::InvalidUrl {
            url: redacted.clone(),
            message: e.to_string(),
        })?;
        builder.session_id().map_err(|e| Error::InvalidUrl {
            url: redacted.clone(),
            message: e.to_string(),
        })?;
        let remote = Self { builder, redacted };
        if remote.token().is_some() && !remote.use_ssl() && !remote.builder.is_loopback() {
            return Err(Error::InvalidUrl {
                url: remote.redacted,
                message: "a token is only sent over TLS (add use_ssl=true) or to a loopback host".into(),
            });
        }
        Ok(remote)
    }

    /// `host:port` the channel dials.
    ///
    /// ```
    /// # let url = kindling_spark::RemoteUrl::parse("sc://10.0.0.5:7077")?;
    /// assert_eq!(url.address(), "10.0.0.5:7077");
    /// # Ok::<(), kindling_spark::Error>(())
    /// ```
    pub fn address(&self) -> String {
        self.builder.endpoint()
    }

    /// Whether TLS is used (`use_ssl=true`).
    ///
    /// ```
    /// # let url = kindling_spark::RemoteUrl::parse("sc://h/;use_ssl=true")?;
    /// assert!(url.use_ssl());
    /// # Ok::<(), kindling_spark::Error>(())
    /// ```
    pub fn use_ssl(&self) -> bool {
        self.builder.use_ssl()
    }

    /// The bearer token, if the URL has one (only from the URL, never the environment).
    ///
    /// ```
    /// # let url = kindling_spark::RemoteUrl::parse("sc://localhost/;token=abc")?;
    /// assert_eq!(url.token(), Some("abc"));
    /// # Ok::<(), kindling_spark::Error>(())
    /// ```
    pub fn token(&self) -> Option<&str> {
        self.builder.get(spark_connect_core::channel::PARAM_TOKEN)
    }

    /// `user_id=` parameter.
    ///
    /// ```
    /// # let url = kindling_spark::RemoteUrl::parse("sc://h/;user_id=ada")?;
    /// assert_eq!(url.user_id(), Some("ada"));
    /// # Ok::<(), kindling_spark::Error>(())
    /// ```
    pub fn user_id(&self) -> Option<&str> {
        self.builder.user_id()
    }

    /// `session_id=` parameter (a UUID v4) to join an existing server session.
    ///
    /// ```
    /// # let url = kindling_spark::RemoteUrl::parse("sc://h")?;
    /// assert_eq!(url.session_id(), None);
    /// # Ok::<(), kindling_spark::Error>(())
    /// ```
    pub fn session_id(&self) -> Option<&str> {
        self.builder.get(spark_connect_core::channel::PARAM_SESSION_ID)
    }

    /// `user_agent=` parameter.
    ///
    /// ```
    /// # let url = kindling_spark::RemoteUrl::parse("sc://h/;user_agent=etl")?;
    /// assert_eq!(url.user_agent(), Some("etl"));
    /// # Ok::<(), kindling_spark::Error>(())
    /// ```
    pub fn user_agent(&self) -> Option<&str> {
        self.builder.get(spark_connect_core::channel::PARAM_USER_AGENT)
    }

    /// Extra `key=value` parameters, sent as gRPC headers.
    ///
    /// ```
    /// # let url = kindling_spark::RemoteUrl::parse("sc://h/;x-team=ml")?;
    /// assert_eq!(url.headers(), vec![("x-team".to_string(), "ml".to_string())]);
    /// # Ok::<(), kindling_spark::Error>(())
    /// ```
    pub fn headers(&self) -> Vec<(String, String)> {
        self.builder.metadata()
    }

    pub(crate) fn host(&self) -> &str {
        self.builder.host()
    }

    pub(crate) fn keepalive(&self) -> Option<(std::time::Duration, std::time::Duration)> {
        let ms = |v: i64| std::time::Duration::from_millis(u64::try_from(v).unwrap_or(0));
        self.builder.keepalive_enabled().then(|| {
            (
                ms(self.builder.keepalive_time_ms()),
                ms(self.builder.keepalive_timeout_ms()),
            )
        })
    }
}

impl fmt::Debug for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RemoteUrl").field(&self.redacted).finish()
    }
}

impl fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl std::str::FromStr for RemoteUrl {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

/// The URL with the value of every `token=` parameter replaced by `***`.
fn redact(url: &str) -> String {
    url.split(';')
        .map(|part| match part.split_once('=') {
            Some((key, _)) if key.eq_ignore_ascii_case("token") => format!("{key}=***"),
            _ => part.to_string(),
        })
        .collect::<Vec<_>>()
        .join(";")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_redacted_everywhere() -> Result<()> {
        let url = RemoteUrl::parse("sc://127.0.0.1:15002/;token=abc;user_id=u")?;
        assert_eq!(url.to_string(), "sc://127.0.0.1:15002/;token=***;user_id=u");
        assert!(!format!("{url:?}").contains("abc"));
        Ok(())
    }

    #[test]
    fn token_to_remote_host_requires_tls() {
        let err = RemoteUrl::parse("sc://example.com/;token=abc").err();
        assert!(matches!(err, Some(Error::InvalidUrl { ref url, .. }) if !url.contains("abc")));
    }

    #[test]
    fn rejects_other_schemes() {
        assert!(matches!(
            RemoteUrl::parse("http://h:1"),
            Err(Error::InvalidUrl { .. })
        ));
    }
}
