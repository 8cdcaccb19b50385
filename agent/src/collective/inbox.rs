//! The receiving side of the ring data plane: ring connections are
//! accepted here ([`serve`]), checked (credential, job, attempt) before any
//! value is read, answer with heartbeats, and wait in the [`Inbox`] until
//! the ring of their job attempt takes them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kindling_schemas::auth::BearerCheck;
use kindling_schemas::credential::Role;
use kindling_schemas::ring::{self, HEARTBEAT, Hello};
use kindling_schemas::tls::Conn;
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_rustls::rustls::client::verify_server_name;
use tokio_rustls::rustls::pki_types::{InvalidDnsNameError, ServerName};
use tokio_rustls::rustls::server::ParsedCertificate;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::Status;

use crate::error::RingRefusal;
use kindling_ops::listen::{PeerSlot, PeerSlots};

/// Most ring connections held for jobs this agent is not in (yet): a peer's
/// gang may form, and connect, before this agent enters the attempt. One
/// more is refused with RESOURCE_EXHAUSTED naming the cap.
pub const UNJOINED_LINKS: usize = 64;
/// How long a ring connection for a job this agent is not in is kept.
pub const UNJOINED_LINK_TTL: Duration = Duration::from_secs(60);
/// How long a connection may take to send its hello, from when the ring
/// takes it: a peer writes its hello as soon as it connects, so the bytes
/// are there already; a silent connection holds its place no longer.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(1);
/// How long writing a refusal, a goodbye or a close may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The bounds on the heartbeat interval a sender may ask for.
const HEARTBEAT_BOUNDS: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(60));

/// A ring connection from the previous rank, for the ring to read frames
/// from. Dropping it stops its heartbeats and closes the connection.
#[derive(Debug)]
pub struct Inbound {
    /// Where frames come from.
    pub(super) read: ReadHalf<Conn>,
    /// Cancelled when this agent fences the connection's attempt (or stops).
    pub(super) fence: CancellationToken,
    /// Why the ring that holds it failed, for the sender to hear when it closes.
    pub(super) goodbye: Arc<Mutex<Option<String>>>,
    _heartbeats: DropGuard,
}

/// What an admitted connection's heartbeat task holds: when to stop, and
/// the reason the ring that took it may leave for the sender.
struct Admitted {
    stop: CancellationToken,
    goodbye: Arc<Mutex<Option<String>>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    job_id: String,
    attempt: u32,
    from_rank: u32,
}

#[derive(Debug)]
enum Slot {
    /// The ring is waiting for this connection.
    Waiting(oneshot::Sender<Inbound>),
    /// The connection is here; the ring has not asked yet.
    Arrived(Inbound, Instant),
    /// The ring took it: another connection for the same key is a duplicate.
    Taken,
}

/// Ring connections that arrived, or rings waiting for them, per job attempt.
#[derive(Debug, Default)]
pub struct Inbox {
    inner: Mutex<InboxState>,
    /// Cancelled when the agent stops serving: every ring connection ends.
    closed: CancellationToken,
}

#[derive(Debug, Default)]
struct InboxState {
    links: HashMap<Key, Slot>,
    /// The attempt each job is on; older attempts are fenced.
    attempts: HashMap<String, u32>,
    /// The incarnation of each job started here: a peer credential must name it.
    incarnations: HashMap<String, u64>,
    /// Per job attempt with connections: cancelled when it is fenced.
    fences: HashMap<(String, u32), CancellationToken>,
    /// Connections of rings this agent cancelled, kept open until the job
    /// moves on or the agent stops (see [`Inbox::park`]).
    parked: Vec<(String, u32, super::Links)>,
}

impl InboxState {
    /// Drops connections of jobs not joined within [`UNJOINED_LINK_TTL`];
    /// returns how many such connections are left.
    fn expire_unjoined(&mut self, now: Instant) -> usize {
        let attempts = &self.attempts;
        self.links.retain(|k, slot| match slot {
            Slot::Arrived(_, at) if !attempts.contains_key(&k.job_id) => {
                now.duration_since(*at) < UNJOINED_LINK_TTL
            }
            _ => true,
        });
        self.links
            .iter()
            .filter(|(k, s)| matches!(s, Slot::Arrived(..)) && !self.attempts.contains_key(&k.job_id))
            .count()
    }
}

impl Inbox {
    /// A new, empty inbox.
    pub fn new() -> Arc<Self> {
        Arc::new(Inbox::default())
    }

    /// `incarnation` of `job_id` starts on this agent: peer credentials must
    /// name it from now on, and any connection for the id that arrived
    /// before (none of this incarnation can: its peers dial only once the
    /// gang formed, which this agent joins after this) is dropped.
    pub fn set_incarnation(&self, job_id: &str, incarnation: u64) {
        let mut s = self.lock();
        s.incarnations.insert(job_id.to_owned(), incarnation);
        s.links
            .retain(|k, slot| k.job_id != job_id || !matches!(slot, Slot::Arrived(..)));
    }

    /// The job's incarnation on this agent, if it was started here.
    pub fn incarnation(&self, job_id: &str) -> Option<u64> {
        self.lock().incarnations.get(job_id).copied()
    }

    /// Forgets `incarnation` of `job_id` (its job was removed), unless a
    /// newer one replaced it.
    pub fn drop_incarnation(&self, job_id: &str, incarnation: u64) {
        let mut s = self.lock();
        if s.incarnations.get(job_id) == Some(&incarnation) {
            s.incarnations.remove(job_id);
        }
    }

    /// Moves `job_id` to `attempt`: connections of older attempts are closed,
    /// and new ones for them refused.
    pub fn enter_attempt(&self, job_id: &str, attempt: u32) {
        let mut s = self.lock();
        s.attempts.insert(job_id.to_owned(), attempt);
        s.parked.retain(|(job, a, _)| job != job_id || *a >= attempt);
        s.links.retain(|k, _| k.job_id != job_id || k.attempt >= attempt);
        s.fences.retain(|(job, a), fence| {
            let stale = job == job_id && *a < attempt;
            if stale {
                fence.cancel();
            }
            !stale
        });
    }

    /// Ends every ring connection into this agent and refuses new ones: the
    /// agent is shutting down (the senders' rings fail at once).
    pub fn close(&self) {
        self.closed.cancel();
        let mut s = self.lock();
        s.links.clear();
        s.parked.clear();
    }

    /// Keeps the connections of a ring this agent cancelled open until the
    /// job moves to a newer attempt, is forgotten, or the agent stops: its
    /// peers then learn why the attempt ended from the rendezvous (an agent
    /// leaving reports first) instead of from a closed connection.
    pub(super) fn park(&self, job_id: &str, attempt: u32, links: super::Links) {
        if self.closed.is_cancelled() {
            return;
        }
        self.lock().parked.push((job_id.to_owned(), attempt, links));
    }

    /// Whether [`close`](Self::close) was called.
    pub(super) fn closed(&self) -> &CancellationToken {
        &self.closed
    }

    /// Forgets a job (its connections close).
    pub fn forget(&self, job_id: &str) {
        let mut s = self.lock();
        s.attempts.remove(job_id);
        s.parked.retain(|(job, ..)| job != job_id);
        s.links.retain(|k, _| k.job_id != job_id);
        s.fences.retain(|(job, _), fence| {
            if job == job_id {
                fence.cancel();
            }
            job != job_id
        });
    }

    /// Why a connection of `job_id`'s `attempt` is being closed by this
    /// agent, if it is for a reason the sender should hear.
    fn closing_reason(&self, job_id: &str, attempt: u32) -> Option<String> {
        if self.closed.is_cancelled() {
            return Some("the receiving agent is shutting down".into());
        }
        match self.lock().attempts.get(job_id) {
            Some(&current) if current > attempt => Some(format!(
                "attempt {attempt} of job `{job_id}` was fenced: the job is on attempt {current}"
            )),
            _ => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, InboxState> {
        // A poisoned lock only means another thread panicked mid-update of a map
        // that stays structurally valid.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a checked connection in (or refuses it, saying why). An
    /// admitted one gets its attempt's fence (made on the first).
    fn admit(&self, hello: &Hello, read: ReadHalf<Conn>) -> Result<Admitted, RingRefusal> {
        let mut s = self.lock();
        // Checked under the lock `close` clears the links under, after it
        // cancels: a connection admitted before that is cleared with them.
        if self.closed.is_cancelled() {
            return Err(RingRefusal::ShuttingDown {
                job_id: hello.job_id.clone(),
            });
        }
        match s.attempts.get(&hello.job_id) {
            Some(&current) if hello.attempt < current => {
                return Err(RingRefusal::Fenced {
                    job_id: hello.job_id.clone(),
                    attempt: hello.attempt,
                    current,
                });
            }
            Some(_) => {}
            None => {
                let held = s.expire_unjoined(Instant::now());
                if held >= UNJOINED_LINKS {
                    return Err(RingRefusal::TooManyUnjoined {
                        job_id: hello.job_id.clone(),
                        held,
                        cap: UNJOINED_LINKS,
                        ttl: UNJOINED_LINK_TTL,
                    });
                }
            }
        }
        let key = Key {
            job_id: hello.job_id.clone(),
            attempt: hello.attempt,
            from_rank: hello.from_rank,
        };
        if matches!(s.links.get(&key), Some(Slot::Arrived(..) | Slot::Taken)) {
            return Err(RingRefusal::AlreadyOpen {
                from_rank: hello.from_rank,
                job_id: hello.job_id.clone(),
                attempt: hello.attempt,
            });
        }
        let closed = &self.closed;
        let fence = s
            .fences
            .entry((hello.job_id.clone(), hello.attempt))
            .or_insert_with(|| closed.child_token())
            .clone();
        let admitted = Admitted {
            stop: fence.child_token(),
            goodbye: Arc::default(),
        };
        let inbound = Inbound {
            read,
            fence,
            goodbye: admitted.goodbye.clone(),
            _heartbeats: admitted.stop.clone().drop_guard(),
        };
        match s.links.remove(&key) {
            Some(Slot::Waiting(tx)) => {
                s.links.insert(key, Slot::Taken);
                // The ring may have given up (timeout, cancel): the connection closes.
                let _ = tx.send(inbound);
            }
            _ => {
                s.links.insert(key, Slot::Arrived(inbound, Instant::now()));
            }
        }
        Ok(admitted)
    }

    /// The connection from `from_rank` for a job attempt, now or once it arrives.
    pub(super) fn take_or_wait(
        &self,
        job_id: &str,
        attempt: u32,
        from_rank: u32,
    ) -> Result<Inbound, oneshot::Receiver<Inbound>> {
        let key = Key {
            job_id: job_id.to_owned(),
            attempt,
            from_rank,
        };
        let mut s = self.lock();
        match s.links.insert(key.clone(), Slot::Taken) {
            Some(Slot::Arrived(inbound, _)) => Ok(inbound),
            _ => {
                let (tx, rx) = oneshot::channel();
                s.links.insert(key, Slot::Waiting(tx));
                Err(rx)
            }
        }
    }
}

/// Ring connections an agent holds at once, answered or not: a ring has one
/// into each agent per job attempt, so this is far above any real load; one
/// more is closed at once.
pub const MAX_RING_CONNECTIONS: usize = 1024;

/// Of those, connections that have not sent their hello yet (each waits at
/// most [`HELLO_TIMEOUT`]): a flood of silent connections holds no more.
pub const MAX_RING_HELLOS: usize = 64;

/// Of those, connections from one address: a peer agent opens one per job
/// attempt it shares with this agent, and says hello at once, so one
/// address's silent connections leave the others' hellos room.
pub const MAX_RING_HELLOS_PER_ADDRESS: usize = 8;

/// Who may open ring connections to this agent, checked before a hello is
/// read: over mutual TLS, only the agents' own identity — a client
/// certificate valid for the name agents check each other's certificates
/// against — so a certificate the same CA signed for clients or executors
/// holds no ring connection, and none of the [`MAX_RING_HELLOS`].
#[derive(Clone, Debug, Default)]
pub struct RingPeers {
    agent_name: Option<ServerName<'static>>,
}

impl RingPeers {
    /// Any caller the port admitted (plaintext, or TLS that asks for no
    /// client certificate): the hello's credential is the only check.
    pub fn anyone() -> Self {
        RingPeers::default()
    }

    /// Over TLS, only callers whose client certificate is valid for `name`
    /// (a DNS name or an IP address).
    pub fn agents_named(name: &str) -> Result<Self, InvalidDnsNameError> {
        Ok(RingPeers {
            agent_name: Some(ServerName::try_from(name.to_owned())?),
        })
    }

    /// Why `conn` may not open a ring connection, if it may not.
    fn refusal(&self, conn: &Conn) -> Option<RingRefusal> {
        let (Some(name), Conn::Tls(stream)) = (&self.agent_name, conn) else {
            return None;
        };
        let presented = stream.get_ref().1.peer_certificates().and_then(|c| c.first());
        let valid = presented.is_some_and(|cert| {
            ParsedCertificate::try_from(cert).is_ok_and(|parsed| verify_server_name(&parsed, name).is_ok())
        });
        (!valid).then(|| RingRefusal::NotAnAgent {
            agent_name: name.to_str().into_owned(),
        })
    }
}

/// Serves the ring connections an agent's listener routes here
/// ([`kindling_ops::listen::incoming_routed`]), each on a task of its own,
/// at most [`MAX_RING_CONNECTIONS`] (and [`MAX_RING_HELLOS`] before their
/// hello, [`MAX_RING_HELLOS_PER_ADDRESS`] of one address) at once; a caller
/// that is not one of `peers` is answered its refusal and closed before it
/// takes a hello's place.
pub async fn serve(inbox: Arc<Inbox>, check: BearerCheck, peers: RingPeers, mut conns: mpsc::Receiver<Conn>) {
    use tonic::transport::server::Connected;
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_RING_CONNECTIONS));
    let hellos = Arc::new(tokio::sync::Semaphore::new(MAX_RING_HELLOS));
    let per_address = PeerSlots::new(MAX_RING_HELLOS_PER_ADDRESS);
    loop {
        let conn = tokio::select! {
            _ = inbox.closed.cancelled() => return,
            conn = conns.recv() => match conn {
                Some(c) => c,
                None => return,
            },
        };
        if let Some(refusal) = peers.refusal(&conn) {
            let Ok(held) = open.clone().try_acquire_owned() else {
                continue;
            };
            tokio::spawn(async move {
                refuse(conn, refusal).await;
                drop(held);
            });
            continue;
        }
        let address = conn.connect_info().remote_addr().map(|a| a.ip());
        let Some(of_address) = address.map_or(Some(None), |ip| per_address.take(ip).map(Some)) else {
            tracing::info!(
                ?address,
                "ring connection refused: its address holds {MAX_RING_HELLOS_PER_ADDRESS} without a hello"
            );
            continue;
        };
        let (Ok(held), Ok(hello)) = (
            open.clone().try_acquire_owned(),
            hellos.clone().try_acquire_owned(),
        ) else {
            tracing::info!(
                open = MAX_RING_CONNECTIONS - open.available_permits(),
                "ring connection refused: at the cap of open or not-yet-answered connections"
            );
            continue;
        };
        let hello = (hello, of_address);
        let (inbox, check) = (inbox.clone(), check.clone());
        tokio::spawn(async move {
            accept(inbox, check, conn, hello).await;
            drop(held);
        });
    }
}

/// Answers `refusal` to a caller that may not open ring connections, and
/// closes its connection (each step within [`WRITE_TIMEOUT`]).
async fn refuse(mut conn: Conn, refusal: RingRefusal) {
    use tonic::transport::server::Connected;
    let peer = conn.connect_info().remote_addr();
    tracing::info!(?peer, error = %refusal, "ring connection refused");
    let answer = Err(Status::from(refusal));
    let _ = tokio::time::timeout(WRITE_TIMEOUT, ring::write_reply(&mut conn, &answer)).await;
    let _ = tokio::time::timeout(WRITE_TIMEOUT, conn.shutdown()).await;
}

/// One ring connection: hello, checks, reply; then heartbeats until the ring
/// that took it drops it (or the agent stops).
async fn accept(
    inbox: Arc<Inbox>,
    check: BearerCheck,
    mut conn: Conn,
    hello_slot: (tokio::sync::OwnedSemaphorePermit, Option<PeerSlot>),
) {
    use tonic::transport::server::Connected;
    let peer = conn
        .connect_info()
        .remote_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|| "an unknown address".into());
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, ring::read_hello(&mut conn)).await {
        Ok(Ok(hello)) => hello,
        Ok(Err(status)) => {
            tracing::info!(%peer, error = %status.message(), "ring connection refused");
            let _ = ring::write_reply(&mut conn, &Err(status)).await;
            return;
        }
        Err(_) => return tracing::info!(%peer, "a ring connection sent no hello in time"),
    };
    drop(hello_slot);
    let checked = check.caller_of(hello.token.as_deref()).and_then(|caller| {
        caller.allow(&hello.job_id, &[Role::Peer], "send collective traffic")?;
        match (&caller, inbox.incarnation(&hello.job_id)) {
            (kindling_schemas::auth::Caller::Job(_), None) => Err(RingRefusal::JobNotHere {
                job_id: hello.job_id.clone(),
            }
            .into()),
            (_, Some(incarnation)) => caller.allow_incarnation(incarnation),
            (_, None) => Ok(()),
        }
    });
    if let Err(status) = checked {
        tracing::info!(%peer, job = %hello.job_id, error = %status.message(), "ring connection refused");
        let _ = ring::write_reply(&mut conn, &Err(status)).await;
        return;
    }
    let (read, mut write) = tokio::io::split(conn);
    let admitted = inbox.admit(&hello, read);
    let answer = admitted
        .as_ref()
        .map(|_| ())
        .map_err(|refusal| Status::from(refusal.clone()));
    if let Err(e) = ring::write_reply(&mut write, &answer).await {
        return tracing::debug!(%peer, error = %e, "answering a ring connection");
    }
    let Ok(Admitted { stop, goodbye }) = admitted else {
        return;
    };
    let every = Duration::from_millis(hello.heartbeat_ms).clamp(HEARTBEAT_BOUNDS.0, HEARTBEAT_BOUNDS.1);
    heartbeats(&mut write, every, &stop).await;
    let ring_failed = goodbye.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(reason) = ring_failed.or_else(|| inbox.closing_reason(&hello.job_id, hello.attempt)) {
        let goodbye = ring::closing(&reason);
        let _ = tokio::time::timeout(WRITE_TIMEOUT, write.write_all(&goodbye)).await;
    }
    let _ = tokio::time::timeout(WRITE_TIMEOUT, write.shutdown()).await;
}

async fn heartbeats(write: &mut WriteHalf<Conn>, every: Duration, stop: &CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                if write.write_all(&[HEARTBEAT]).await.is_err() || write.flush().await.is_err() {
                    break;
                }
            }
        }
    }
}
