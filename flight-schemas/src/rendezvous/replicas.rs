//! Following the leader of a replicated rendezvous: a client given several
//! URLs (`http://r0:7070,http://r1:7070`) sends each call to the replica it
//! last found leading; a replica that does not answer, or answers
//! UNAVAILABLE, moves it on — to the leader the refusal names
//! ([`LEADER_METADATA`](super::LEADER_METADATA)) when that is one of the
//! client's own URLs (a token is never sent anywhere else), otherwise to
//! the next URL. With one URL nothing moves.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::error::ClientError;

/// The replicas' URLs and one client of each, and which one leads as far as
/// this client knows.
#[derive(Debug)]
pub(crate) struct Replicas<C> {
    urls: Vec<String>,
    clients: Vec<C>,
    current: AtomicUsize,
}

/// How a URL is compared: without a trailing slash.
fn norm(url: &str) -> &str {
    url.trim().trim_end_matches('/')
}

/// The URLs of a comma-separated list (one URL: itself).
pub(crate) fn split(urls: &str) -> Vec<String> {
    urls.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

impl<C: Clone> Replicas<C> {
    pub(crate) fn new(urls: Vec<String>, clients: Vec<C>, current: usize) -> Self {
        debug_assert_eq!(urls.len(), clients.len());
        Replicas {
            urls,
            clients,
            current: AtomicUsize::new(current),
        }
    }

    /// The client of the replica calls go to now.
    pub(crate) fn current(&self) -> C {
        let i = self.current.load(Ordering::Relaxed) % self.clients.len();
        self.clients[i].clone()
    }

    /// The URL calls go to now.
    pub(crate) fn current_url(&self) -> &str {
        &self.urls[self.current.load(Ordering::Relaxed) % self.urls.len()]
    }

    /// After `err`: moves to the leader it names (`true`: try again at
    /// once), or to the next replica when it is transient.
    pub(crate) fn follow(&self, err: &ClientError) -> bool {
        let n = self.urls.len();
        if n < 2 || !err.is_transient() {
            return false;
        }
        let now = self.current.load(Ordering::Relaxed) % n;
        if let Some(hint) = err.leader_hint()
            && let Some(i) = self.urls.iter().position(|u| norm(u) == norm(hint))
            && i != now
        {
            self.current.store(i, Ordering::Relaxed);
            tracing::info!(leader = %self.urls[i], "following the rendezvous' leader");
            return true;
        }
        // Others may have moved it already: move on from where this call was.
        let _ = self
            .current
            .compare_exchange(now, (now + 1) % n, Ordering::Relaxed, Ordering::Relaxed);
        false
    }

    /// How many replicas there are.
    pub(crate) fn len(&self) -> usize {
        self.urls.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn refused(leader: Option<&str>) -> ClientError {
        let mut status = tonic::Status::unavailable("not the leader");
        if let Some(l) = leader {
            status
                .metadata_mut()
                .insert(super::super::LEADER_METADATA, l.parse().unwrap());
        }
        ClientError::Rpc {
            op: "status",
            source: status,
        }
    }

    #[test]
    fn a_named_leader_of_ours_is_followed_a_stranger_is_not_and_answers_move_nothing() {
        let r = Replicas::new(split("http://a:1, http://b:1/,http://c:1"), vec![0, 1, 2], 0);
        assert_eq!(r.len(), 3);
        assert!(r.follow(&refused(Some("http://c:1/"))));
        assert_eq!((r.current(), r.current_url()), (2, "http://c:1"));
        // A leader not in the list: the token is not sent there; next URL instead.
        assert!(!r.follow(&refused(Some("http://evil:1"))));
        assert_eq!(r.current(), 0);
        assert!(!r.follow(&refused(None)));
        assert_eq!(r.current(), 1);
        let not_found = ClientError::Rpc {
            op: "status",
            source: tonic::Status::not_found("no such job"),
        };
        assert!(!r.follow(&not_found));
        assert_eq!(r.current(), 1, "an answer moves nothing");
        let one = Replicas::new(split("http://a:1"), vec![7], 0);
        assert!(!one.follow(&refused(Some("http://a:1"))));
        assert_eq!(one.current(), 7);
    }
}
