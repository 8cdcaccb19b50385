//! The credential keys a process signs and verifies with, as an operator
//! rotates them: a key file holds one key per line, the first signs and
//! every line is accepted, so a rotation is three edits of one Secret —
//! prepend the new key (both accepted, the new one signs), wait out the
//! longest credential lifetime, drop the old line. [`CredentialKeys::reload`]
//! re-reads the file when it changed (a Kubernetes Secret volume swaps it
//! in place), so nothing restarts and no running job fails.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::SystemTime;

use super::{Claims, CredentialError, CredentialKey, Role, decode_claims, split};

/// Why a key file cannot be used; the keys in use stay as they were.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file cannot be read.
    #[error("credential key file {}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line is no usable key, or there is none.
    #[error("credential key file {}: {reason}", .path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, and on which line.
        reason: String,
    },
}

/// What identifies one version of the file: a swapped or rewritten file
/// differs in at least one of these.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    Ok(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: meta.ino(),
    })
}

#[derive(Debug)]
struct Ring {
    /// The first signs; all verify.
    keys: Vec<CredentialKey>,
    file: Option<(PathBuf, Stamp)>,
}

/// The keys in use; cheap to clone, all clones see a reload.
#[derive(Clone, Debug)]
pub struct CredentialKeys(Arc<RwLock<Ring>>);

impl From<CredentialKey> for CredentialKeys {
    fn from(key: CredentialKey) -> Self {
        CredentialKeys(Arc::new(RwLock::new(Ring {
            keys: vec![key],
            file: None,
        })))
    }
}

/// The keys in a key file's text: one per line (surrounding whitespace
/// trimmed), blank lines and `#` comments skipped, at least one.
fn parse(path: &Path, text: &[u8]) -> Result<Vec<CredentialKey>, KeyFileError> {
    let invalid = |reason: String| KeyFileError::Invalid {
        path: path.to_owned(),
        reason,
    };
    let mut keys = Vec::new();
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let key = CredentialKey::new(line).map_err(|e| invalid(format!("line {}: {e}", i + 1)))?;
        if keys.iter().any(|k: &CredentialKey| k.id() == key.id()) {
            return Err(invalid(format!("line {}: the same key twice", i + 1)));
        }
        keys.push(key);
    }
    if keys.is_empty() {
        return Err(invalid("no key in it (one key per line, the first signs)".into()));
    }
    Ok(keys)
}

impl CredentialKeys {
    /// The keys in `path` (see the module doc for its format).
    pub fn from_file(path: &Path) -> Result<Self, KeyFileError> {
        let read = |source| KeyFileError::Read {
            path: path.to_owned(),
            source,
        };
        let before = stamp(path).map_err(read)?;
        let keys = parse(path, &std::fs::read(path).map_err(read)?)?;
        Ok(CredentialKeys(Arc::new(RwLock::new(Ring {
            keys,
            file: Some((path.to_owned(), before)),
        }))))
    }

    /// Re-reads the key file if it changed since it was last read. `Ok(true)`
    /// when the keys changed; on an error the keys in use stay (a half-written
    /// file is read again next time).
    pub fn reload(&self) -> Result<bool, KeyFileError> {
        let Some((path, last)) = self.read().file.clone() else {
            return Ok(false);
        };
        let read = |source| KeyFileError::Read {
            path: path.clone(),
            source,
        };
        let now = stamp(&path).map_err(read)?;
        if now == last {
            return Ok(false);
        }
        let keys = parse(&path, &std::fs::read(&path).map_err(read)?)?;
        let mut ring = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let changed = ring
            .keys
            .iter()
            .map(CredentialKey::id)
            .ne(keys.iter().map(CredentialKey::id));
        ring.keys = keys;
        ring.file = Some((path, now));
        Ok(changed)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Ring> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The ids of the keys in use, the signing key's first.
    pub fn ids(&self) -> Vec<String> {
        self.read().keys.iter().map(|k| k.id().to_owned()).collect()
    }

    /// A credential for these claims, signed with the first key.
    pub fn sign(&self, claims: &Claims) -> String {
        self.read().keys[0].sign(claims)
    }

    /// A credential for `role` in incarnation `incarnation` of `job_id`.
    pub fn issue(&self, job_id: &str, role: Role, ttl: std::time::Duration, incarnation: u64) -> String {
        self.sign(&Claims::expiring(job_id, role, ttl).of_incarnation(incarnation))
    }

    /// The claims of `presented` if one of the keys signed it and it has not
    /// expired: the key its `kid` names, else (a credential without one)
    /// each key in turn.
    pub fn verify(&self, presented: &str) -> Result<Claims, CredentialError> {
        let (body, tag) = split(presented)?;
        let kid = decode_claims(body).ok_or(CredentialError::Malformed)?.kid;
        let ring = self.read();
        match kid {
            Some(kid) => match ring.keys.iter().find(|k| k.id() == kid) {
                Some(key) => key.verify_parts(body, &tag),
                None => Err(CredentialError::UnknownKey),
            },
            None => {
                let mut last = CredentialError::BadSignature;
                for key in &ring.keys {
                    match key.verify_parts(body, &tag) {
                        Ok(claims) => return Ok(claims),
                        Err(e) => last = e,
                    }
                }
                Err(last)
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    const OLD: &str = "0123456789abcdef0123456789abcdef-old";
    const NEW: &str = "fedcba9876543210fedcba9876543210-new";

    fn write(path: &Path, text: &str) {
        // As a Secret volume does: a new file renamed over the old.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn a_rotation_accepts_both_keys_then_only_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        write(&path, &format!("{OLD}\n"));
        let keys = CredentialKeys::from_file(&path).unwrap();
        let old = keys.issue("j", Role::Producer, Duration::from_secs(60), 1);
        assert!(!keys.reload().unwrap(), "nothing changed yet");

        // Step 1: the new key first; both accepted, the new one signs.
        write(&path, &format!("# rotated\n{NEW}\n\n{OLD}\n"));
        assert!(keys.reload().unwrap());
        let new = keys.issue("j", Role::Producer, Duration::from_secs(60), 1);
        assert!(keys.verify(&old).is_ok() && keys.verify(&new).is_ok());
        let new_id = CredentialKey::new(NEW.as_bytes()).unwrap().id().to_owned();
        assert_eq!(keys.verify(&new).unwrap().kid.as_deref(), Some(new_id.as_str()));
        assert_eq!(keys.ids()[0], new_id);

        // Step 2: the old key gone; its credentials are refused, naming the key.
        write(&path, &format!("{NEW}\n"));
        assert!(keys.reload().unwrap());
        let err = keys.verify(&old).unwrap_err();
        assert_eq!(err, CredentialError::UnknownKey);
        assert!(keys.verify(&new).is_ok());
    }

    #[test]
    fn an_unverified_key_id_is_not_echoed() {
        // Claims naming a key id of the caller's choosing, signed with a key
        // this process does not hold: the refusal repeats none of it.
        let foreign = CredentialKey::new(NEW.as_bytes()).unwrap();
        let keys = CredentialKeys::from(CredentialKey::new(OLD.as_bytes()).unwrap());
        let claims = Claims {
            kid: Some("<script>evil</script>\nforged log line".into()),
            ..Claims::expiring("j", Role::Reader, Duration::from_secs(60))
        };
        let body = super::super::hex(&serde_json::to_vec(&claims).unwrap());
        let tag = ring::hmac::sign(&foreign.key, body.as_bytes());
        let presented = format!(
            "{}{body}.{}",
            super::super::PREFIX,
            super::super::hex(tag.as_ref())
        );
        let err = keys.verify(&presented).unwrap_err();
        assert_eq!(err, CredentialError::UnknownKey);
        let said = err.to_string();
        assert!(!said.contains("evil") && !said.contains("forged"), "{said}");
    }

    #[test]
    fn a_bad_file_is_refused_naming_the_line_and_a_bad_reload_keeps_the_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        for (text, says) in [
            ("", "no key in it"),
            ("# only a comment\n", "no key in it"),
            (
                &*format!("{OLD}\nshort\n"),
                "line 2: a credential key needs at least",
            ),
            (&*format!("{OLD}\n{OLD}\n"), "line 2: the same key twice"),
        ] {
            write(&path, text);
            let err = CredentialKeys::from_file(&path).unwrap_err().to_string();
            assert!(err.contains(says) && err.contains("key"), "{text:?}: {err}");
        }
        write(&path, OLD);
        let keys = CredentialKeys::from_file(&path).unwrap();
        let cred = keys.issue("j", Role::Reader, Duration::from_secs(60), 1);
        write(&path, "short");
        assert!(keys.reload().is_err());
        assert!(keys.verify(&cred).is_ok(), "a bad file replaced the keys in use");
        let missing = CredentialKeys::from_file(&dir.path().join("nope")).unwrap_err();
        assert!(missing.to_string().contains("nope"), "{missing}");
    }

    #[test]
    fn a_credential_without_a_key_id_is_tried_against_every_key() {
        let old = CredentialKey::new(OLD.as_bytes()).unwrap();
        let new = CredentialKey::new(NEW.as_bytes()).unwrap();
        // As signed before key ids: the claims carry none.
        let claims = Claims::expiring("j", Role::Peer, Duration::from_secs(60));
        let body = super::super::hex(&serde_json::to_vec(&claims).unwrap());
        let tag = ring::hmac::sign(&old.key, body.as_bytes());
        let legacy = format!(
            "{}{body}.{}",
            super::super::PREFIX,
            super::super::hex(tag.as_ref())
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        write(&path, &format!("{NEW}\n{OLD}\n"));
        let keys = CredentialKeys::from_file(&path).unwrap();
        assert_eq!(keys.verify(&legacy).unwrap().kid, None);
        assert_eq!(
            CredentialKeys::from(new).verify(&legacy),
            Err(CredentialError::BadSignature)
        );
    }
}
