//! The rendezvous on etcd: its state under one key, and one leader among
//! several replicas, elected through etcd's election API and fenced by its
//! lease (docs/rendezvous.md, "Replicas on etcd").
//!
//! - [`EtcdSettings`]: `--store etcd://host:2379,host:2379[/prefix]`.
//! - [`Candidate`]: a replica's lease, kept alive while the process lives,
//!   and its candidacy: [`Candidate::campaign`] returns a [`Leader`] once
//!   elected, and meanwhile publishes who leads (what followers answer with).
//! - [`EtcdStore`]: the snapshot under `<prefix>/state`, written in a
//!   transaction that compares the create revision of the election key this
//!   replica won with: once that key is gone (the lease lapsed, a newer
//!   leader was elected) a write of the deposed leader changes nothing and
//!   is not acknowledged.
//!
//! A leader answers only while its lease surely holds: etcd confirmed the
//! last renewal sent at `t`, so it keeps the lease until at least `t + TTL`;
//! from `t + TTL − TTL/8` on, [`Leader::lost`] is cancelled and the replica
//! stops answering as the leader (its state is dropped, its blocked calls
//! are woken with UNAVAILABLE) and campaigns again with a fresh lease. No two
//! replicas acknowledge in overlapping terms: a successor is elected only
//! after etcd expired (or the predecessor revoked) that lease.
//!
//! Why by hand on etcd's client: the election and lease API are etcd's own
//! (etcd-client); what is ours is the rule above, which ties a replica's
//! answers to its lease.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, LeaderKey, Txn, TxnOp};
use kindling_schemas::pb::rendezvous as pb;
use prost::Message;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{EtcdSettingsError, RendezvousError, StorageError};
use crate::store::{SnapshotStore, decode};

/// Where a replicated rendezvous keeps its state and elects its leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdSettings {
    /// etcd's client URLs (`http://host:2379`).
    pub endpoints: Vec<String>,
    /// The key prefix of this rendezvous (several may share one etcd).
    pub prefix: String,
    /// The leader's lease (whole seconds, etcd's unit): how long a dead
    /// leader holds the leadership before a replica takes over.
    pub lease: Duration,
    /// The URL clients reach this replica at (followers answer with the leader's).
    pub advertise: String,
    /// TLS to etcd (`None`: plaintext, loopback only unless allowed).
    pub tls: Option<EtcdTls>,
}

/// TLS to etcd: the CA its members' certificates are checked against, and
/// this replica's client certificate (etcd's `--client-cert-auth`).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA (PEM).
    pub ca: Vec<u8>,
    /// The client certificate and key (PEM), if etcd asks for one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("EtcdTls")
            .field("client_certificate", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

/// How often a connection to etcd is pinged when idle.
const ETCD_PING_EVERY: Duration = Duration::from_secs(10);

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "/kindling/rendezvous";

impl EtcdSettings {
    /// Parses `etcd://host:port[,host:port…][/prefix]` (the prefix defaults
    /// to [`DEFAULT_PREFIX`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kindling_rendezvous::error::EtcdSettingsError;
    /// use kindling_rendezvous::etcd::EtcdSettings;
    /// let s = EtcdSettings::parse("etcd://e0:2379,e1:2379/team-a", Duration::from_secs(2), "http://r0:7070").unwrap();
    /// assert_eq!(s.endpoints, ["http://e0:2379", "http://e1:2379"]);
    /// assert_eq!(s.prefix, "/team-a");
    /// assert_eq!(s.check_plaintext(false), Err(EtcdSettingsError::Plaintext { hosts: "e0:2379,e1:2379".into() }));
    /// let local = EtcdSettings::parse("etcd://127.0.0.1:2379", Duration::from_secs(2), "http://r0:7070").unwrap();
    /// assert_eq!(local.prefix, "/kindling/rendezvous");
    /// assert!(local.check_plaintext(false).is_ok());
    /// let none = EtcdSettings::parse("etcd://", Duration::from_secs(2), "http://r0:7070");
    /// assert_eq!(none, Err(EtcdSettingsError::NoEndpoint { store: "etcd://".into() }));
    /// ```
    pub fn parse(store: &str, lease: Duration, advertise: &str) -> Result<Self, EtcdSettingsError> {
        let named = || store.to_owned();
        let rest = store
            .strip_prefix("etcd://")
            .ok_or_else(|| EtcdSettingsError::NotEtcd { store: named() })?;
        let (hosts, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/').to_owned()),
            None => (rest, DEFAULT_PREFIX.to_owned()),
        };
        let endpoints: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| format!("http://{h}"))
            .collect();
        if endpoints.is_empty() {
            return Err(EtcdSettingsError::NoEndpoint { store: named() });
        }
        if prefix.is_empty() {
            return Err(EtcdSettingsError::EmptyPrefix { store: named() });
        }
        if lease.as_secs() == 0 || lease.subsec_nanos() != 0 {
            return Err(EtcdSettingsError::Lease(lease));
        }
        if advertise.is_empty() {
            return Err(EtcdSettingsError::NoAdvertise);
        }
        Ok(EtcdSettings {
            endpoints,
            prefix,
            lease,
            advertise: advertise.to_owned(),
            tls: None,
        })
    }

    /// The same settings over TLS (`https://` to every member).
    pub fn with_tls(mut self, tls: EtcdTls) -> Self {
        self.endpoints = self
            .endpoints
            .iter()
            .map(|e| format!("https://{}", e.trim_start_matches("http://")))
            .collect();
        self.tls = Some(tls);
        self
    }

    /// Refuses plaintext to an etcd off loopback: whoever can reach it could
    /// rewrite every job and agent address (allowed with `allow`, for a
    /// network that is private by other means).
    pub fn check_plaintext(&self, allow: bool) -> Result<(), EtcdSettingsError> {
        if self.tls.is_some() || allow {
            return Ok(());
        }
        let off_loopback: Vec<&str> = self
            .endpoints
            .iter()
            .map(|e| e.trim_start_matches("http://"))
            .filter(|host| {
                let name = host.rsplit_once(':').map_or(*host, |(h, _)| h);
                let name = name.trim_start_matches('[').trim_end_matches(']');
                !(name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()))
            })
            .collect();
        match off_loopback.as_slice() {
            [] => Ok(()),
            hosts => Err(EtcdSettingsError::Plaintext {
                hosts: hosts.join(","),
            }),
        }
    }

    fn election(&self) -> String {
        format!("{}/leader", self.prefix)
    }

    fn state_key(&self) -> String {
        format!("{}/state", self.prefix)
    }

    fn ttl(&self) -> i64 {
        i64::try_from(self.lease.as_secs()).unwrap_or(i64::MAX)
    }

    /// How etcd's errors name the place.
    pub fn place(&self) -> String {
        format!("etcd key `{}` at {}", self.state_key(), self.endpoints.join(","))
    }

    fn error(&self, source: StorageError) -> RendezvousError {
        RendezvousError::Storage {
            place: self.place(),
            source,
        }
    }

    async fn connect(&self) -> Result<Client, RendezvousError> {
        // HTTP/2 pings no more often than etcd's server allows (its
        // --grpc-keepalive-min-time, 5 s: more often and it closes the
        // connection as "too many pings"); the lease's own renewals every
        // quarter lease are what tells a dead etcd quickly.
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.lease)
            .with_keep_alive(ETCD_PING_EVERY, self.lease.max(Duration::from_secs(5)))
            .with_keep_alive_while_idle(true);
        if let Some(tls) = &self.tls {
            let mut config =
                etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(&tls.ca));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(etcd_client::Identity::from_pem(cert, key));
            }
            options = options.with_tls(config);
        }
        Client::connect(&self.endpoints, Some(options))
            .await
            .map_err(|e| self.error(StorageError::Etcd(Arc::new(e))))
    }
}

/// What followers know of the leadership: who leads, or why no one is
/// known to (etcd's error).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hint {
    /// The leader's advertised URL.
    pub leader: Option<String>,
    /// The last error talking to etcd, while there is one.
    pub problem: Option<String>,
}

/// A replica's lease and candidacy.
#[derive(Debug)]
pub struct Candidate {
    settings: EtcdSettings,
    hint: watch::Sender<Hint>,
}

/// An elected replica: its election key and the token cancelled when its
/// lease could have lapsed or a write found it deposed.
pub struct Leader {
    settings: EtcdSettings,
    client: Client,
    key: LeaderKey,
    lost: CancellationToken,
    lease: i64,
}

impl std::fmt::Debug for Leader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leader")
            .field("advertise", &self.settings.advertise)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Candidate {
    /// A candidate with `settings`; who leads is published on [`Candidate::hint`].
    pub fn new(settings: EtcdSettings) -> Self {
        Candidate {
            settings,
            hint: watch::Sender::new(Hint::default()),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &EtcdSettings {
        &self.settings
    }

    /// Who leads, as this replica last saw it.
    pub fn hint(&self) -> watch::Receiver<Hint> {
        self.hint.subscribe()
    }

    /// Campaigns until elected (retrying etcd while it is unreachable) or
    /// `stop` is cancelled (`None`).
    pub async fn campaign(&self, stop: &CancellationToken) -> Option<Leader> {
        let mut delay = Duration::from_millis(100);
        loop {
            let outcome = tokio::select! {
                _ = stop.cancelled() => return None,
                r = self.try_campaign(stop) => r,
            };
            match outcome {
                Ok(Some(leader)) => return Some(leader),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?delay, "campaigning for the rendezvous' leadership");
                    // Whoever led may be gone too: name no one, name etcd.
                    self.hint.send_replace(Hint {
                        leader: None,
                        problem: Some(e.to_string()),
                    });
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(self.settings.lease);
        }
    }

    /// One candidacy: a fresh lease, kept alive, and the campaign on it.
    /// `Ok(None)`: the lease lapsed before the election was won.
    async fn try_campaign(&self, stop: &CancellationToken) -> Result<Option<Leader>, RendezvousError> {
        let s = &self.settings;
        let mut client = s.connect().await?;
        let etcd = |e| s.error(StorageError::Etcd(Arc::new(e)));
        let asked = Instant::now();
        let lease = client.lease_grant(s.ttl(), None).await.map_err(etcd)?.id();
        let lost = stop.child_token();
        let valid = Arc::new(Mutex::new(asked + s.lease - s.lease / 8));
        tokio::spawn(keep_alive(client.clone(), lease, s.lease, valid, lost.clone()));
        tokio::spawn(observe(
            client.clone(),
            s.election(),
            self.hint.clone(),
            lost.clone(),
        ));
        let won = tokio::select! {
            _ = lost.cancelled() => return Ok(None),
            won = client.campaign(s.election(), s.advertise.clone(), lease) => won,
        };
        let key = match won.map(|w| w.leader().cloned()) {
            Ok(Some(key)) => key,
            failed => {
                // An abandoned candidacy must not stay in the election with
                // a live lease: it could be elected and never lead.
                lost.cancel();
                let _ = tokio::time::timeout(s.lease, client.lease_revoke(lease)).await;
                return Err(match failed {
                    Err(e) => etcd(e),
                    Ok(_) => s.error(StorageError::Etcd(Arc::new(etcd_client::Error::ElectError(
                        "the campaign's answer names no leader key".into(),
                    )))),
                });
            }
        };
        tracing::info!(advertise = %s.advertise, lease, "elected the rendezvous' leader");
        Ok(Some(Leader {
            settings: s.clone(),
            client,
            key,
            lost,
            lease,
        }))
    }
}

/// How soon a failed renewal is sent again.
const RENEW_RETRY: Duration = Duration::from_millis(50);

/// Renews the lease every TTL/4 and cancels `lost` once it could have
/// lapsed: TTL − TTL/8 after the last renewal etcd confirmed was sent.
async fn keep_alive(
    mut client: Client,
    lease: i64,
    ttl: Duration,
    valid: Arc<Mutex<Instant>>,
    lost: CancellationToken,
) {
    let margin = ttl / 8;
    let mut stream = None;
    loop {
        let until = *valid.lock().unwrap_or_else(PoisonError::into_inner);
        let sent = Instant::now();
        if sent >= until {
            tracing::error!(lease, "the etcd lease could have lapsed: stepping down");
            lost.cancel();
            return;
        }
        let renewed = tokio::select! {
            _ = lost.cancelled() => return,
            r = tokio::time::timeout(until - sent, renew(&mut client, lease, &mut stream)) => r,
        };
        match renewed {
            Ok(Ok(ttl_left)) if ttl_left > 0 => {
                *valid.lock().unwrap_or_else(PoisonError::into_inner) = sent + ttl - margin;
            }
            Ok(Ok(_)) => {
                tracing::error!(lease, "etcd says the lease expired: stepping down");
                lost.cancel();
                return;
            }
            // A renewal is safe to send again: try soon (a member that
            // died, or an election in etcd), not a quarter lease later.
            Ok(Err(e)) => {
                tracing::warn!(lease, error = %e, "renewing the etcd lease");
                stream = None;
                tokio::select! {
                    _ = lost.cancelled() => return,
                    _ = tokio::time::sleep(RENEW_RETRY) => {}
                }
                continue;
            }
            // No answer before the lease could lapse: step down now.
            Err(_) => {
                tracing::warn!(lease, "etcd did not answer the lease's renewal in time");
                stream = None;
                continue;
            }
        }
        let until = *valid.lock().unwrap_or_else(PoisonError::into_inner);
        tokio::select! {
            _ = lost.cancelled() => return,
            _ = tokio::time::sleep_until((Instant::now() + ttl / 4).min(until)) => {}
        }
    }
}

/// One renewal on the keep-alive stream; the TTL etcd answers (0: the
/// lease is gone). Without a stream, opening one is the renewal: etcd's
/// client sends the first request and reads its answer itself, failing when
/// the lease is gone, so there is no answer left to read (the TTL is then
/// reported as 1: alive).
async fn renew(
    client: &mut Client,
    lease: i64,
    stream: &mut Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)>,
) -> Result<i64, etcd_client::Error> {
    let Some((keeper, answers)) = stream else {
        *stream = Some(client.lease_keep_alive(lease).await?);
        return Ok(1);
    };
    keeper.keep_alive().await?;
    match answers.message().await? {
        Some(answer) => Ok(answer.ttl()),
        None => Err(etcd_client::Error::LeaseKeepAliveError(
            "etcd closed the keep-alive stream".into(),
        )),
    }
}

/// Publishes the current leader's URL on `hint` until `stop`.
async fn observe(mut client: Client, election: String, hint: watch::Sender<Hint>, stop: CancellationToken) {
    loop {
        let watched = async {
            let mut leaders = client.observe(election.clone()).await?;
            while let Some(answer) = leaders.message().await? {
                let leader = answer.kv().and_then(|kv| kv.value_str().ok()).map(str::to_owned);
                hint.send_replace(Hint {
                    leader,
                    problem: None,
                });
            }
            Ok::<(), etcd_client::Error>(())
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            r = watched => if let Err(e) = r {
                tracing::debug!(error = %e, "observing the rendezvous' leader");
            },
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

impl Leader {
    /// Cancelled once this replica may no longer answer as the leader.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Gives the leadership up at once (a clean shutdown): a successor need
    /// not wait out the lease.
    pub async fn resign(mut self) {
        self.lost.cancel();
        match tokio::time::timeout(self.settings.lease, self.client.lease_revoke(self.lease)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "revoking the leader's etcd lease"),
            Err(_) => tracing::warn!(
                "etcd did not answer the revocation of the leader's lease; it lapses on its own"
            ),
        }
    }

    /// The state as etcd holds it, and a store that writes it there while
    /// this replica leads.
    pub async fn open_store(&mut self) -> Result<(EtcdStore, Option<pb::StateSnapshot>), RendezvousError> {
        let s = &self.settings;
        let held = self
            .client
            .get(s.state_key(), None)
            .await
            .map_err(|e| s.error(StorageError::Etcd(Arc::new(e))))?;
        let (snapshot, last) = match held.kvs().first() {
            Some(kv) => (
                Some(decode(kv.value()).map_err(|e| s.error(e))?),
                kv.value().to_vec(),
            ),
            None => (None, Vec::new()),
        };
        let writer = Writer::start(s.clone(), self.key.clone(), self.lost.clone()).await?;
        let store = EtcdStore {
            place: s.place(),
            last,
            writer,
            lost: self.lost.clone(),
        };
        Ok((store, snapshot))
    }
}

type Reply = std::sync::mpsc::SyncSender<Result<(), StorageError>>;

/// The thread that writes to etcd. `save` is called under the state's lock
/// on a runtime worker and must block until etcd answered; the write runs on
/// a runtime of its own, so a blocked worker never starves it.
#[derive(Debug)]
struct Writer {
    writes: std::sync::mpsc::Sender<(Vec<u8>, Reply)>,
}

impl Writer {
    async fn start(
        settings: EtcdSettings,
        key: LeaderKey,
        lost: CancellationToken,
    ) -> Result<Self, RendezvousError> {
        let (writes, queue) = std::sync::mpsc::channel::<(Vec<u8>, Reply)>();
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let place = settings.place();
        std::thread::Builder::new()
            .name("etcd-writer".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ =
                            ready_tx.send(Err(StorageError::Etcd(Arc::new(etcd_client::Error::IoError(e)))));
                        return;
                    }
                };
                let mut client = match runtime.block_on(settings.connect()) {
                    Ok(c) => c,
                    Err(RendezvousError::Storage { source, .. }) => {
                        let _ = ready_tx.send(Err(source));
                        return;
                    }
                    Err(_) => return,
                };
                let _ = ready_tx.send(Ok(()));
                while let Ok((bytes, reply)) = queue.recv() {
                    let outcome = runtime.block_on(write(&mut client, &settings, &key, bytes));
                    if matches!(outcome, Err(StorageError::Deposed)) {
                        lost.cancel();
                    }
                    let _ = reply.send(outcome);
                }
            })
            .map_err(|e| RendezvousError::Storage {
                place: place.clone(),
                source: StorageError::Etcd(Arc::new(etcd_client::Error::IoError(e))),
            })?;
        match ready.await {
            Ok(Ok(())) => Ok(Writer { writes }),
            Ok(Err(source)) => Err(RendezvousError::Storage { place, source }),
            Err(_) => Err(RendezvousError::Storage {
                place,
                source: StorageError::Deposed,
            }),
        }
    }
}

/// One fenced write: the snapshot is put only if this replica's election
/// key is still the one it won with.
async fn write(
    client: &mut Client,
    s: &EtcdSettings,
    key: &LeaderKey,
    bytes: Vec<u8>,
) -> Result<(), StorageError> {
    let fenced = Txn::new()
        .when([Compare::create_revision(key.key(), CompareOp::Equal, key.rev())])
        .and_then([TxnOp::put(s.state_key(), bytes, None)]);
    let deadline = Instant::now() + s.lease;
    loop {
        match tokio::time::timeout_at(deadline, client.txn(fenced.clone())).await {
            Err(_) => return Err(StorageError::EtcdTimeout(s.lease)),
            // The client balances over every member and keeps handing calls
            // to one that died; a member that refused the connection was sent
            // nothing, so the write goes to another (a write that may have
            // been delivered is never sent twice: it could land after a
            // newer one).
            Ok(Err(e)) if refused(&e) && Instant::now() + REFUSED_RETRY < deadline => {
                tracing::debug!(error = %e, "an etcd member refused the write's connection: trying another");
                tokio::time::sleep(REFUSED_RETRY).await;
            }
            Ok(Err(e)) => return Err(StorageError::Etcd(Arc::new(e))),
            Ok(Ok(done)) if done.succeeded() => return Ok(()),
            Ok(Ok(_)) => return Err(StorageError::Deposed),
        }
    }
}

/// How long a write waits before it goes to another member after one
/// refused its connection.
const REFUSED_RETRY: Duration = Duration::from_millis(10);

/// Whether `e` is a member refusing the connection: the call was never sent.
fn refused(e: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) => Some(status),
        etcd_client::Error::TransportError(t) => Some(t),
        _ => None,
    };
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        source = err.source();
    }
    false
}

/// The snapshot in etcd, written by the leader only (see the module's doc).
#[derive(Debug)]
pub struct EtcdStore {
    place: String,
    last: Vec<u8>,
    writer: Writer,
    lost: CancellationToken,
}

impl SnapshotStore for EtcdStore {
    fn place(&self) -> String {
        self.place.clone()
    }

    fn save(&mut self, snapshot: &pb::StateSnapshot) -> Result<(), RendezvousError> {
        let bytes = snapshot.encode_to_vec();
        if bytes == self.last {
            return Ok(());
        }
        let error = |source| RendezvousError::Storage {
            place: self.place.clone(),
            source,
        };
        if self.lost.is_cancelled() {
            return Err(error(StorageError::Deposed));
        }
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        self.writer
            .writes
            .send((bytes.clone(), reply))
            .map_err(|_| error(StorageError::Deposed))?;
        match answer.recv() {
            Ok(Ok(())) => {
                self.last = bytes;
                Ok(())
            }
            Ok(Err(source)) => Err(error(source)),
            Err(_) => Err(error(StorageError::Deposed)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A member that refuses the connection is told apart from every other
    /// failure: only then was nothing sent, and the write may go elsewhere.
    #[tokio::test]
    async fn a_refused_connection_is_the_only_failure_a_write_is_sent_again_for() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
        let err = match Client::connect([format!("http://127.0.0.1:{port}")], Some(options)).await {
            Ok(mut client) => client.get("k", None).await.expect_err("nothing listens"),
            Err(e) => e,
        };
        assert!(refused(&err), "{err:?}");
        let status = tonic::Status::unavailable("etcdserver: leader changed");
        assert!(!refused(&etcd_client::Error::GRpcStatus(status)));
        assert!(!refused(&etcd_client::Error::InvalidArgs("x".into())));
    }
}
