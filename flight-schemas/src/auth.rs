//! Bearer-token authentication, shared by every Kindling gRPC server and client.
//!
//! Callers send `authorization: Bearer <token>`. Servers check it in one
//! interceptor ([`BearerCheck`]) rather than in each handler; clients attach it
//! with [`BearerAttach`].

use std::fmt;
use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::credential::{Claims, CredentialError, CredentialKeys, Role};

/// The metadata key carrying the token.
pub const AUTHORIZATION: &str = "authorization";

/// A shared secret. Its `Debug` output never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<str>);

impl Token {
    /// Wraps a secret.
    ///
    /// ```
    /// let t = kindling_schemas::auth::Token::new("s3cret");
    /// assert_eq!(format!("{t:?}"), "Token(<redacted>)");
    /// ```
    pub fn new(secret: impl Into<String>) -> Self {
        Token(Arc::from(secret.into()))
    }

    /// The secret itself; only for building the header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The full header value, `Bearer <token>`.
    pub fn header_value(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether `presented` is this token, compared in constant time.
    pub fn matches(&self, presented: &str) -> bool {
        constant_time_eq(self.0.as_bytes(), presented.as_bytes())
    }
}

/// A token that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token file could not be read.
    #[error("reading the token file {}: {source}", .path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No token was given and running without one was not asked for.
    #[error("no token: pass --token-file or KINDLING_TOKEN (or --allow-unauthenticated)")]
    Missing,
    /// The token file holds nothing but whitespace.
    #[error("the token file {} is empty", .path.display())]
    Empty {
        /// The file.
        path: std::path::PathBuf,
    },
    /// A token that must not be used as given (the message says why).
    #[error("{0}")]
    Invalid(String),
}

impl Token {
    /// The token every Kindling process reads: from `file` (trailing
    /// whitespace ignored) when given, else `inline` (`--token`,
    /// `KINDLING_TOKEN`) when not empty; `None` when neither is given.
    ///
    /// ```
    /// use kindling_schemas::auth::Token;
    /// assert_eq!(Token::read(None, Some("abc")).unwrap(), Some(Token::new("abc")));
    /// assert_eq!(Token::read(None, Some("")).unwrap(), None);
    /// ```
    pub fn read(file: Option<&std::path::Path>, inline: Option<&str>) -> Result<Option<Token>, TokenError> {
        match (file, inline) {
            (Some(path), _) => {
                let raw = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                let secret = raw.trim_end();
                if secret.is_empty() {
                    return Err(TokenError::Empty {
                        path: path.to_owned(),
                    });
                }
                Ok(Some(Token::new(secret)))
            }
            (None, Some(secret)) if !secret.is_empty() => Ok(Some(Token::new(secret))),
            _ => Ok(None),
        }
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Who a request comes from, as [`BearerCheck`] found it (a request
/// extension every handler can read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The operator token (or a server without one): everything.
    Operator,
    /// A job credential: its claims only.
    Job(Claims),
}

impl Caller {
    /// The caller of `request` (a request that passed no [`BearerCheck`] is
    /// treated as the operator's: only servers without a token skip it).
    pub fn of<T>(request: &Request<T>) -> Caller {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or(Caller::Operator)
    }

    /// Allows the operator, or a credential of one of `roles` for `job_id`;
    /// else `PERMISSION_DENIED` saying what was refused.
    pub fn allow(&self, job_id: &str, roles: &[Role], what: &str) -> Result<(), Status> {
        match self {
            Caller::Operator => Ok(()),
            Caller::Job(c) if c.job_id == job_id && roles.contains(&c.role) => Ok(()),
            Caller::Job(c) => Err(Status::permission_denied(format!(
                "a {} credential for job `{}` cannot {what} (job `{job_id}`)",
                c.role, c.job_id
            ))),
        }
    }

    /// Allows the operator, or a credential issued for `incarnation` of the
    /// job (or served model version) it names: a job created again under an
    /// old id refuses the old job's credentials, and a credential that names
    /// no incarnation is refused everywhere.
    pub fn allow_incarnation(&self, incarnation: u64) -> Result<(), Status> {
        match self {
            Caller::Job(c) if c.incarnation != Some(incarnation) => Err(Status::permission_denied(format!(
                "this {} credential was issued for {} of job `{}`, not the job under that id now (incarnation {incarnation}): ask for a new one",
                c.role,
                c.incarnation
                    .map_or_else(|| "no incarnation".to_owned(), |i| format!("incarnation {i}")),
                c.job_id,
            ))),
            _ => Ok(()),
        }
    }

    /// Allows the operator only.
    pub fn operator_only(&self, what: &str) -> Result<(), Status> {
        match self {
            Caller::Operator => Ok(()),
            Caller::Job(c) => Err(Status::permission_denied(format!(
                "a {} credential for job `{}` cannot {what}: that takes the operator token",
                c.role, c.job_id
            ))),
        }
    }
}

/// Server-side interceptor: refuses calls without the right bearer token with
/// `Unauthenticated`. With no token configured every call is allowed. With a
/// credential key it also takes job credentials, and records the
/// [`Caller`] in the request's extensions for the handlers to authorize.
#[derive(Clone, Debug)]
pub struct BearerCheck {
    expected: Option<Token>,
    credentials: Option<CredentialKeys>,
}

impl BearerCheck {
    /// Checks for `token`; `None` disables the check (loopback development only).
    pub fn new(token: Option<Token>) -> Self {
        BearerCheck {
            expected: token,
            credentials: None,
        }
    }

    /// Also takes job credentials signed with one of `keys`.
    pub fn with_credentials(mut self, keys: Option<CredentialKeys>) -> Self {
        self.credentials = keys;
        self
    }

    /// Checks one request's metadata.
    pub fn check(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        self.caller(metadata).map(|_| ())
    }

    /// Checks one request's metadata and says who sent it.
    pub fn caller(&self, metadata: &tonic::metadata::MetadataMap) -> Result<Caller, Status> {
        if self.expected.is_none() {
            return Ok(Caller::Operator);
        }
        let Some(value) = metadata.get(AUTHORIZATION) else {
            return Err(Status::unauthenticated(
                "missing bearer token: send `authorization: Bearer <token>`",
            ));
        };
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                Status::unauthenticated("malformed authorization header: expected `Bearer <token>`")
            })?;
        self.caller_of(Some(presented))
    }

    /// Says who presents `token` (the operator token or a job credential),
    /// outside gRPC metadata (the ring's hello).
    pub fn caller_of(&self, token: Option<&str>) -> Result<Caller, Status> {
        let Some(expected) = &self.expected else {
            return Ok(Caller::Operator);
        };
        let Some(presented) = token else {
            return Err(Status::unauthenticated("missing bearer token"));
        };
        if expected.matches(presented) {
            return Ok(Caller::Operator);
        }
        match &self.credentials {
            Some(key) => match key.verify(presented) {
                Ok(claims) => Ok(Caller::Job(claims)),
                Err(CredentialError::NotACredential) => Err(Status::unauthenticated("invalid bearer token")),
                Err(e) => Err(Status::unauthenticated(e.to_string())),
            },
            None => Err(Status::unauthenticated("invalid bearer token")),
        }
    }
}

impl Interceptor for BearerCheck {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let caller = self.caller(request.metadata())?;
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}

/// Client-side interceptor: attaches the bearer token to every call, and
/// the trace context of the task making it ([`crate::trace`]).
#[derive(Clone, Debug)]
pub struct BearerAttach {
    header: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl BearerAttach {
    /// Attaches `token` (nothing when `None`).
    ///
    /// Returns `Err` when the token contains characters not allowed in a header.
    pub fn new(token: Option<&Token>) -> Result<Self, InvalidToken> {
        let header = token
            .map(|t| t.header_value().parse().map_err(|_| InvalidToken))
            .transpose()?;
        Ok(BearerAttach { header })
    }
}

impl Interceptor for BearerAttach {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(h) = &self.header {
            request.metadata_mut().insert(AUTHORIZATION, h.clone());
        }
        // Inside a traced task (a `fit`, an agent's job), the call carries
        // a child of its trace context.
        if let Some(trace) = crate::trace::TraceContext::current()
            && let Ok(value) = trace.child().header().parse()
        {
            request.metadata_mut().insert(crate::trace::METADATA_KEY, value);
        }
        Ok(request)
    }
}

/// The token cannot be sent as an HTTP header value.
#[derive(Debug, thiserror::Error)]
#[error("the token contains characters that are not valid in an HTTP header")]
pub struct InvalidToken;

/// Whether `given` equals `expected`, in time that depends on neither
/// where they differ nor how long `expected` is relative to `given`: every
/// byte of `expected` is compared (against a byte that cannot match past the
/// end of `given`) with `subtle`'s constant-time operations, with no early
/// return, and a length difference is one more bit of the difference.
fn constant_time_eq(expected: &[u8], given: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    let mut equal = expected.len().ct_eq(&given.len());
    for (i, e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!e);
        equal &= e.ct_eq(&g);
    }
    equal.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_equal_only_byte_for_byte_and_length_for_length() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"secret", b"secret!"));
        assert!(!constant_time_eq(b"secret", b""));
        assert!(!constant_time_eq(b"", b"x"));
        // A prefix padded with what `given` lacks is still different.
        assert!(!constant_time_eq(b"ab\0", b"ab"));
    }

    fn req_with(header: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(h) = header {
            r.metadata_mut()
                .insert(AUTHORIZATION, h.parse().expect("ascii header"));
        }
        r
    }

    #[test]
    fn check_accepts_right_token_and_refuses_others() {
        let mut check = BearerCheck::new(Some(Token::new("abc")));
        assert!(check.call(req_with(Some("Bearer abc"))).is_ok());
        for bad in [None, Some("Bearer abd"), Some("abc"), Some("Bearer ")] {
            let err = check.call(req_with(bad)).expect_err("must refuse");
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
    }

    #[test]
    fn attach_then_check_round_trips() {
        let token = Token::new("xyz");
        let mut attach = BearerAttach::new(Some(&token)).expect("valid token");
        let req = attach.call(Request::new(())).expect("attach");
        assert!(BearerCheck::new(Some(token)).check(req.metadata()).is_ok());
    }
}
