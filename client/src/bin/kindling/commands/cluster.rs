//! The flags the commands that reach a cluster or Spark share: where the
//! input rows come from ([`Input`]), and how to reach a cluster's
//! rendezvous and agents ([`ClusterArgs`]: its URL, the token file, TLS).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use kindling::job::JobHandle;
use kindling::spark::{DataFrame, SparkSession};
use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::rendezvous::RendezvousClient;
use kindling_schemas::tls::{Tls, TlsFiles};

/// Where the input rows come from.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct Input {
    /// A Spark SQL query.
    #[arg(long)]
    pub sql: Option<String>,
    /// A table or view name.
    #[arg(long)]
    pub table: Option<String>,
    /// A CSV file or directory (header row, schema inferred).
    #[arg(long)]
    pub csv: Option<String>,
    /// A Parquet file or directory.
    #[arg(long)]
    pub parquet: Option<String>,
}

impl Input {
    pub(super) async fn dataframe(&self, spark: &SparkSession) -> Result<DataFrame> {
        Ok(if let Some(q) = &self.sql {
            spark.sql(q).await.context("running the query")?
        } else if let Some(t) = &self.table {
            spark.table(t)
        } else if let Some(p) = &self.csv {
            spark
                .read()
                .option("header", "true")
                .option("inferSchema", "true")
                .csv([p])
        } else if let Some(p) = &self.parquet {
            spark.read().parquet([p])
        } else {
            bail!("give one of --sql, --table, --csv, --parquet")
        })
    }
}

/// How a command reaches a cluster: its rendezvous, the bearer token, TLS.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// The cluster's rendezvous URL (`http(s)://host:port`). `train` without
    /// it runs a local cluster in this process; `predict` without it runs the
    /// model here; `status` defaults to http://127.0.0.1:7070.
    #[arg(long, env = "KINDLING_RENDEZVOUS")]
    pub rendezvous: Option<String>,
    /// File holding the cluster's bearer token.
    #[arg(long, env = "KINDLING_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// The rendezvous the commands that only ask one (`status`, `jobs`, `wait`,
/// `fetch`) ask without `--rendezvous`.
pub const DEFAULT_RENDEZVOUS: &str = "http://127.0.0.1:7070";

impl ClusterArgs {
    /// `--rendezvous`, or [`DEFAULT_RENDEZVOUS`].
    pub fn rendezvous_or_default(&self) -> &str {
        self.rendezvous.as_deref().unwrap_or(DEFAULT_RENDEZVOUS)
    }

    /// A client of the rendezvous ([`Self::rendezvous_or_default`]).
    pub async fn connect(&self) -> Result<RendezvousClient> {
        let url = self.rendezvous_or_default();
        RendezvousClient::connect_with(url.to_owned(), self.token()?.as_ref(), &self.channel()?)
            .await
            .with_context(|| format!("connecting to the rendezvous at {url}"))
    }

    /// A handle on `job` at this cluster ([`Self::rendezvous_or_default`]).
    pub fn handle(&self, job: &str) -> Result<JobHandle> {
        let mut handle =
            JobHandle::new(job, self.rendezvous_or_default().to_owned()).channel(self.channel()?);
        if let Some(token) = self.token()? {
            handle = handle.token(token);
        }
        Ok(handle)
    }

    /// The token in `--token-file` (trailing whitespace ignored), if given.
    pub fn token(&self) -> Result<Option<Token>> {
        Ok(Token::read(self.token_file.as_deref(), None)?)
    }

    /// Channel settings with the TLS material of the flags.
    pub fn channel(&self) -> Result<ChannelConfig> {
        self.tls.channel()
    }
}

/// How the CLI dials a cluster's rendezvous and agents over TLS.
#[derive(Debug, Clone, clap::Args)]
pub struct TlsArgs {
    /// CA bundle that signs the rendezvous' and agents' certificates (PEM);
    /// needed for https:// URLs.
    #[arg(long, env = "KINDLING_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate for clusters that require one (mutual TLS): PEM.
    #[arg(long, env = "KINDLING_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert: PEM.
    #[arg(long, env = "KINDLING_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Name the certificate of a server dialled by IP address is checked
    /// against (the agents' shared certificate); a server dialled by name is
    /// checked against its name.
    #[arg(long, env = "KINDLING_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// Send the token over plaintext http:// to other machines (a network you trust only).
    #[arg(long, env = "KINDLING_ALLOW_PLAINTEXT_TOKEN")]
    pub allow_plaintext_token: bool,
}

impl TlsArgs {
    /// Channel settings with this TLS material.
    pub fn channel(&self) -> Result<ChannelConfig> {
        let tls = Tls::load(TlsFiles {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            ca: self.tls_ca.clone(),
            client_auth: false,
            server_name: self.tls_server_name.clone().filter(|n| !n.is_empty()),
        })?;
        Ok(ChannelConfig::default()
            .with_tls(tls)
            .with_plaintext_token(self.allow_plaintext_token))
    }
}
