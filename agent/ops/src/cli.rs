//! Command-line pieces the two server binaries (`kindling-agent`,
//! `kindling-rendezvous`) share: how they take their bearer token and their
//! TLS material, and how they log.

use std::path::PathBuf;

use kindling_schemas::auth::{Token, TokenError};
use kindling_schemas::tls::{Tls, TlsError, TlsFiles};

/// The token flags of a server binary: a file (preferred), the secret itself,
/// or an explicit opt-out for loopback development.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    /// File holding the bearer token (trailing whitespace ignored).
    #[arg(long, env = "KINDLING_TOKEN_FILE", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// The bearer token itself (prefer --token-file; never logged).
    #[arg(long, env = "KINDLING_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Run without authentication (development on loopback only).
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// File holding the *viewer* token: it reads `/metrics` (and, on the
    /// rendezvous, the status page) and nothing else. Give it to Prometheus
    /// and to people watching instead of the operator token.
    #[arg(long, env = "KINDLING_VIEWER_TOKEN_FILE")]
    pub viewer_token_file: Option<PathBuf>,
}

impl TokenArgs {
    /// The viewer token, if a file names one; it must differ from the
    /// operator token.
    pub fn read_viewer(&self, operator: Option<&Token>) -> Result<Option<Token>, TokenError> {
        let Some(path) = &self.viewer_token_file else {
            return Ok(None);
        };
        let viewer = Token::read(Some(path), None)?;
        if let (Some(v), Some(op)) = (&viewer, operator)
            && op.matches(v.expose())
        {
            return Err(TokenError::Invalid(format!(
                "the viewer token in {} is the operator token: a viewer must not be able to do what the \
                 operator does",
                path.display()
            )));
        }
        Ok(viewer)
    }

    /// The token; `None` only with `--allow-unauthenticated`.
    pub fn read(&self) -> Result<Option<Token>, TokenError> {
        let token = Token::read(self.token_file.as_deref(), self.token.as_deref())?;
        if token.is_none() && !self.allow_unauthenticated {
            return Err(TokenError::Missing);
        }
        Ok(token)
    }
}

/// The TLS flags of a server binary (and of its connections to other
/// Kindling servers): PEM files, reloaded when they change.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// Certificate chain this process serves with (and presents as a client
    /// when a server asks): PEM. With it, the server speaks only TLS.
    #[arg(long, env = "KINDLING_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert: PEM.
    #[arg(long, env = "KINDLING_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA bundle that signs the servers this process dials (https:// URLs)
    /// and, with --tls-client-auth, the clients it accepts: PEM.
    #[arg(long, env = "KINDLING_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Accept only clients presenting a certificate signed by --tls-ca
    /// (mutual TLS).
    #[arg(long, env = "KINDLING_TLS_CLIENT_AUTH", requires = "tls_ca")]
    pub tls_client_auth: bool,
    /// Name the certificate of a server dialled by IP address is checked
    /// against (agents are dialled by pod IP and share a certificate for one
    /// DNS name); a server dialled by name is checked against its name.
    #[arg(long, env = "KINDLING_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// Serve without TLS on a non-loopback address while requiring a token,
    /// and send the token in plaintext to other machines: only on a network
    /// you trust (the token can be read off the wire).
    #[arg(long, env = "KINDLING_ALLOW_PLAINTEXT_TOKEN")]
    pub allow_plaintext_token: bool,
}

impl TlsArgs {
    /// The loaded TLS settings; `None` when no file is named.
    pub fn load(&self) -> Result<Option<Tls>, TlsError> {
        Tls::load(TlsFiles {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            ca: self.tls_ca.clone(),
            client_auth: self.tls_client_auth,
            server_name: self.tls_server_name.clone().filter(|n| !n.is_empty()),
        })
    }

    /// Refuses to serve `listen` in plaintext with a `token` callers must send
    /// unless the address is loopback or the operator allowed it.
    pub fn check_plaintext(
        &self,
        listen: std::net::SocketAddr,
        token: bool,
        tls: Option<&Tls>,
    ) -> Result<(), PlaintextToken> {
        let serves_tls = tls.is_some_and(Tls::serves);
        if token && !serves_tls && !listen.ip().is_loopback() && !self.allow_plaintext_token {
            return Err(PlaintextToken { listen });
        }
        Ok(())
    }
}

/// A server that would take its bearer token in plaintext off loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "listening on {listen} without TLS would have callers send the bearer token in \
     plaintext: set --tls-cert and --tls-key (KINDLING_TLS_CERT, KINDLING_TLS_KEY), \
     or --allow-plaintext-token on a network you trust"
)]
pub struct PlaintextToken {
    /// The address it would listen on.
    pub listen: std::net::SocketAddr,
}

/// How a server binary writes its log lines (to stderr).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `target`,
    /// the spans), for a log pipeline.
    Json,
}

/// The log flags of a server binary.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// `text` or `json` (one JSON object per line).
    #[arg(long, env = "KINDLING_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// Sends the process' logs to stderr (stdout stays free), filtered by
/// `filter`, in `format`.
pub fn init_logging(filter: tracing_subscriber::EnvFilter, format: LogFormat) {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
}
