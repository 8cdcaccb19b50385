//! Job-scoped credentials: signed, expiring bearer tokens that let their
//! holder do one thing for one job. The operator token stays for
//! administration; a Spark executor gets a *producer* credential that can
//! `DoPut` into its job's shards and nothing else, an agent's ring peers a
//! *peer* credential for that job's collective traffic, a reader a *reader*
//! credential for its model and predictions.
//!
//! A credential is `kc1.<claims>.<signature>`: the claims (job, role, expiry
//! in Unix seconds) as hex-encoded JSON and their HMAC-SHA256 under the
//! cluster's credential key (a Secret of its own, not the operator token:
//! rotating the token leaves running jobs' credentials valid). Agents hold
//! the key, issue credentials (the operator-only `issue_credential` action)
//! and verify them; a tampered or expired one is `UNAUTHENTICATED`, one used
//! outside its job or role `PERMISSION_DENIED`.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

mod keys;

pub use keys::{CredentialKeys, KeyFileError};

const PREFIX: &str = "kc1.";

/// What a credential allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `DoPut` into the job's splits (and `job_status` of it).
    Producer,
    /// The job's collective (ring) traffic between agents.
    Peer,
    /// The job's model, checkpoint and predictions (and `job_status`).
    Reader,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Producer => "producer",
            Role::Peer => "peer",
            Role::Reader => "reader",
        })
    }
}

/// What a valid credential says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The one job it is for.
    pub job_id: String,
    /// What it allows there.
    pub role: Role,
    /// Unix seconds after which it is refused.
    pub expires: u64,
    /// Which incarnation of `job_id`: the random one the rendezvous drew
    /// when it created the job (`JobStatus::incarnation`), or a served
    /// model's version (`model_serving::model_incarnation`). A job created
    /// again under the same id after this one ended refuses it; a
    /// credential with `None` is refused by every check of an incarnation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u64>,
    /// The id of the key that signed it ([`CredentialKey::id`]), so that
    /// during a rotation the verifier picks the right one of its keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kid: Option<String>,
}

impl Claims {
    /// `role` in `job_id` for `ttl` from now (any incarnation; see
    /// [`Claims::of_incarnation`]).
    pub fn expiring(job_id: &str, role: Role, ttl: Duration) -> Claims {
        Claims {
            job_id: job_id.to_owned(),
            role,
            expires: now().saturating_add(ttl.as_secs()),
            incarnation: None,
            kid: None,
        }
    }

    /// The same claims, for `incarnation` of the job only.
    pub fn of_incarnation(mut self, incarnation: u64) -> Claims {
        self.incarnation = Some(incarnation);
        self
    }
}

/// Why a presented credential is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialError {
    /// Not a Kindling credential at all.
    #[error("not a job credential")]
    NotACredential,
    /// The signature does not match the claims (tampered, or another key).
    #[error("job credential signature does not verify (tampered, or signed with another key)")]
    BadSignature,
    /// The claims do not decode.
    #[error("job credential claims do not decode")]
    Malformed,
    /// Signed with a key this process does not hold (rotated out, or
    /// another cluster's). The key id the credential names is not repeated:
    /// nothing of a credential is echoed before its signature verifies, and
    /// this one's cannot.
    #[error(
        "job credential signed with a key which this process does not hold (rotated out, or another cluster's)"
    )]
    UnknownKey,
    /// Past its expiry.
    #[error("job credential for `{job_id}` expired at {expires} (Unix seconds)")]
    Expired {
        /// Its job.
        job_id: String,
        /// When it expired.
        expires: u64,
    },
}

/// The cluster's credential key. Its `Debug` output never shows it.
#[derive(Clone)]
pub struct CredentialKey {
    key: ring::hmac::Key,
    id: String,
}

impl fmt::Debug for CredentialKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CredentialKey(<redacted>, id {})", self.id)
    }
}

/// A key's public id: 8 bytes of a SHA-256 over a label and the secret
/// (the secret cannot be recovered from it; two keys have distinct ids).
fn key_id(secret: &[u8]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"kindling credential key id\0");
    ctx.update(secret);
    hex(&ctx.finish().as_ref()[..8])
}

/// Fewest bytes of key material accepted.
pub const MIN_KEY_BYTES: usize = 32;

/// Key material shorter than [`MIN_KEY_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a credential key needs at least {MIN_KEY_BYTES} bytes, got {bytes} (e.g. `openssl rand -hex 32`)")]
pub struct KeyTooShort {
    /// How many bytes it had (surrounding whitespace not counted).
    pub bytes: usize,
}

impl CredentialKey {
    /// A key from secret bytes (at least [`MIN_KEY_BYTES`]; surrounding
    /// whitespace of a key file is not part of it).
    pub fn new(secret: &[u8]) -> Result<CredentialKey, KeyTooShort> {
        let secret = secret.trim_ascii();
        if secret.len() < MIN_KEY_BYTES {
            return Err(KeyTooShort { bytes: secret.len() });
        }
        Ok(CredentialKey {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret),
            id: key_id(secret),
        })
    }

    /// The key's public id, carried in the credentials it signs.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A random key (local mode: the process is the whole cluster).
    pub fn generate() -> CredentialKey {
        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .expect("the operating system's random number generator");
        CredentialKey {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret),
            id: key_id(&secret),
        }
    }

    /// A credential for `role` in `job_id`, valid for `ttl` (send it as a
    /// bearer token).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kindling_schemas::credential::{CredentialKey, Role};
    /// let key = CredentialKey::new(b"0123456789abcdef0123456789abcdef").unwrap();
    /// let cred = key.issue("job-a", Role::Producer, Duration::from_secs(60));
    /// let claims = key.verify(&cred).unwrap();
    /// assert_eq!((claims.job_id.as_str(), claims.role), ("job-a", Role::Producer));
    /// let other = CredentialKey::new(b"another key of thirty-two bytes!").unwrap();
    /// assert!(other.verify(&cred).is_err());
    /// ```
    pub fn issue(&self, job_id: &str, role: Role, ttl: Duration) -> String {
        self.sign(&Claims::expiring(job_id, role, ttl))
    }

    /// The credential for these claims, stamped with this key's id.
    pub fn sign(&self, claims: &Claims) -> String {
        let claims = Claims {
            kid: Some(self.id.clone()),
            ..claims.clone()
        };
        let body = hex(&serde_json::to_vec(&claims).unwrap_or_default());
        let tag = ring::hmac::sign(&self.key, body.as_bytes());
        format!("{PREFIX}{body}.{}", hex(tag.as_ref()))
    }

    /// The claims of `presented` if it is a credential this key signed and
    /// it has not expired (the signature is checked in constant time).
    pub fn verify(&self, presented: &str) -> Result<Claims, CredentialError> {
        let (body, tag) = split(presented)?;
        self.verify_parts(body, &tag)
    }

    fn verify_parts(&self, body: &str, tag: &[u8]) -> Result<Claims, CredentialError> {
        ring::hmac::verify(&self.key, body.as_bytes(), tag).map_err(|_| CredentialError::BadSignature)?;
        let claims = decode_claims(body).ok_or(CredentialError::Malformed)?;
        if now() >= claims.expires {
            return Err(CredentialError::Expired {
                job_id: claims.job_id,
                expires: claims.expires,
            });
        }
        Ok(claims)
    }
}

/// A credential's claims part (hex) and its signature's bytes.
fn split(presented: &str) -> Result<(&str, Vec<u8>), CredentialError> {
    let rest = presented
        .strip_prefix(PREFIX)
        .ok_or(CredentialError::NotACredential)?;
    let (body, tag) = rest.split_once('.').ok_or(CredentialError::NotACredential)?;
    let tag = unhex(tag).ok_or(CredentialError::BadSignature)?;
    Ok((body, tag))
}

/// The claims in a credential's hex body, not yet verified.
fn decode_claims(body: &str) -> Option<Claims> {
    unhex(body).and_then(|json| serde_json::from_slice(&json).ok())
}

/// Whether `presented` has a job credential's shape (`kc1.<claims>.<tag>`),
/// verified or not: a port that holds no key still tells a credential
/// it cannot be used there (403) instead of calling it unknown (401).
pub fn looks_like_credential(presented: &str) -> bool {
    presented
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split_once('.'))
        .is_some_and(|(body, tag)| unhex(body).is_some() && unhex(tag).is_some())
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `bytes` as lower-case hex (credentials' claims; the status page's cookie).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of a hex string of at most 8 KiB; `None` when it is not one.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 8192 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key() -> CredentialKey {
        CredentialKey::new(b"0123456789abcdef0123456789abcdef").unwrap()
    }

    #[test]
    fn tampered_expired_and_foreign_credentials_are_refused() {
        let k = key();
        let cred = k.issue("a", Role::Producer, Duration::from_secs(600));
        let text = cred.as_str();
        assert!(k.verify(text).is_ok());
        // The claims changed (job a → b) without a new signature.
        let (body, tag) = text[PREFIX.len()..].split_once('.').unwrap();
        let forged_claims = hex(&serde_json::to_vec(&Claims {
            job_id: "b".into(),
            expires: u64::MAX,
            ..Claims::expiring("a", Role::Producer, Duration::ZERO)
        })
        .unwrap());
        assert_eq!(
            k.verify(&format!("{PREFIX}{forged_claims}.{tag}")),
            Err(CredentialError::BadSignature)
        );
        // One flipped character of the signature.
        let mut flipped = tag.to_owned().into_bytes();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(
            k.verify(&format!("{PREFIX}{body}.{flipped}")),
            Err(CredentialError::BadSignature)
        );
        // Expired.
        let old = k.sign(&Claims {
            expires: 1,
            ..Claims::expiring("a", Role::Reader, Duration::ZERO)
        });
        assert!(matches!(k.verify(&old), Err(CredentialError::Expired { .. })));
        // Not a credential; a short key.
        assert_eq!(k.verify("s3cret"), Err(CredentialError::NotACredential));
        let short = CredentialKey::new(b" short\n").expect_err("a 5-byte key is refused");
        assert_eq!(short, KeyTooShort { bytes: 5 });
        assert!(short.to_string().contains("at least 32 bytes, got 5"), "{short}");
        assert_eq!(
            format!("{k:?}"),
            format!("CredentialKey(<redacted>, id {})", k.id())
        );
        // A credential names the key that signed it, and keeps its incarnation.
        let bound =
            k.verify(&k.sign(&Claims::expiring("a", Role::Peer, Duration::from_secs(9)).of_incarnation(7)));
        let bound = bound.unwrap();
        assert_eq!((bound.kid.as_deref(), bound.incarnation), (Some(k.id()), Some(7)));
        assert_eq!(k.id().len(), 16);
        assert_ne!(k.id(), CredentialKey::generate().id());
    }
}
