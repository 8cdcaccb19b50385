//! Command-line pieces the two server binaries (`kindling-agent`,
//! `kindling-rendezvous`) share: how they take their bearer token.

use std::path::PathBuf;

use kindling_schemas::auth::{Token, TokenError};

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
}

impl TokenArgs {
    /// The token; `None` only with `--allow-unauthenticated`.
    pub fn read(&self) -> Result<Option<Token>, TokenError> {
        let token = Token::read(self.token_file.as_deref(), self.token.as_deref())?;
        if token.is_none() && !self.allow_unauthenticated {
            return Err(TokenError::Missing);
        }
        Ok(token)
    }
}
