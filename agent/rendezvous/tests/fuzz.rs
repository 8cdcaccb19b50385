//! Property and fuzz tests of the rendezvous' state file, read back at
//! start-up: arbitrary bytes, a real snapshot with bytes flipped, cut or
//! inserted, and snapshots of arbitrary values. The property: a state file
//! is restored as it says or refused naming `state.pb`, never a panic. And
//! of the agent reports heartbeats carry (any bytes, a real report changed,
//! one past the bound): kept whole or refused, the last good one staying,
//! and what is kept read back by a watch's client and the status page. And
//! of the heartbeat and all-gather handlers given any job, attempt, rank,
//! sequence number, agent and report: an answer or an honest refusal at
//! once, and nothing refused changes the job. And of the streaming
//! all-gather over a real connection: for any sequence of gathers, the
//! replies the unary call gives, in order, ending at the first refusal.
//!
//! CI runs 64 cases of each state-file property (each writes, fsyncs and
//! opens a directory), 256 of the reports', 128 of the handlers' and 32 of
//! the streamed gather's (each serves a rendezvous on loopback). A longer run,
//! `PROPTEST_CASES=5000 cargo test -p kindling-rendezvous --test fuzz`, takes
//! seconds to half a minute, as fast as the disk syncs.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kindling_fixtures::fuzz::{JOB_REPORT_JSON, cases, edits, mutate};
use kindling_rendezvous::page::{ReportError, Reports, status};
use kindling_rendezvous::{RendezvousConfig, RendezvousError, RendezvousService, RendezvousState};
use kindling_schemas::pb::rendezvous as pb;
use kindling_schemas::pb::rendezvous::rendezvous_server::Rendezvous;
use kindling_schemas::rendezvous::{
    AgentInfo, AgentReport, JobConfig, JobStatus, MAX_REPORT_BYTES, MemberReport,
};
use proptest::prelude::*;
use prost::Message;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request};

fn agent(id: &str) -> AgentInfo {
    AgentInfo {
        agent_id: id.to_owned(),
        flight_address: format!("http://{id}:50051"),
        collective_address: format!("http://{id}:50052"),
        node_name: format!("node-{id}"),
        capacity: 1,
        has_gpu: false,
        models: vec!["linear".into()],
    }
}

async fn form(s: &RendezvousState, job: &str, attempt: u32, ids: &[&str]) {
    let joins: Vec<_> = ids
        .iter()
        .map(|id| {
            let (s, job, id) = (s.clone(), job.to_owned(), (*id).to_owned());
            tokio::spawn(async move { s.join(&job, attempt, &id).await })
        })
        .collect();
    for j in joins {
        j.await.expect("join task").expect("join");
    }
}

/// A state file the rendezvous wrote: three agents; jobs ganging, running
/// on their second attempt (a formed gang, a failure, a client lease),
/// cancelled, succeeded and failed.
fn snapshot() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let dir = tempfile::tempdir().expect("dir");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let s = RendezvousState::open(RendezvousConfig::default(), Some(dir.path())).expect("open");
            for id in ["a", "b", "c"] {
                s.register_agent(agent(id)).expect("register");
            }
            let run = JobConfig::new("run", 2)
                .with_max_attempts(3)
                .with_spec_summary("mlp [8], adam")
                .with_client_lease(Duration::from_secs(30));
            s.create_job(run).expect("create");
            form(&s, "run", 1, &["a", "b"]).await;
            assert_eq!(s.report_failure("run", 1, "a", "boom").expect("report"), Some(2));
            form(&s, "run", 2, &["b", "c"]).await;
            s.create_job(JobConfig::new("gang", 3)).expect("create");
            s.create_job(JobConfig::new("cancelled", 1)).expect("create");
            s.cancel_job("cancelled", "operator said so").expect("cancel");
            s.create_job(JobConfig::new("done", 1)).expect("create");
            form(&s, "done", 1, &["c"]).await;
            s.complete_job("done", 1).expect("complete");
            s.create_job(JobConfig::new("failed", 1).with_max_attempts(1))
                .expect("create");
            s.report_failure("failed", 1, "a", "bad input").expect("report");
        });
        std::fs::read(dir.path().join("state.pb")).expect("state.pb")
    })
}

/// A snapshot of arbitrary values: ids empty or repeated, any state,
/// attempt, slot count, timeout and time, records without their parts.
fn arbitrary_snapshot() -> impl Strategy<Value = pb::StateSnapshot> {
    let info = ("[a-c]{0,2}", ".{0,8}").prop_map(|(agent_id, flight_address)| pb::AgentInfo {
        agent_id,
        flight_address,
        ..Default::default()
    });
    let failure =
        (0u32..4, "[a-c]{0,1}", ".{0,8}", any::<u64>()).prop_map(|(attempt, agent_id, cause, at)| {
            pb::Failure {
                attempt,
                agent_id,
                cause,
                at_unix_ms: at,
            }
        });
    let status = (
        (
            "[a-z]{0,3}",
            prop_oneof![9 => 1i32..=5, 1 => prop::sample::select(vec![-1, 0, 6, i32::MAX])],
            0u32..4,
            0u32..4,
            0u32..4,
        ),
        prop::collection::vec(failure, 0..3),
        (any::<u64>(), any::<u64>(), ".{0,6}"),
    )
        .prop_map(
            |((job_id, state, attempt, max_attempts, num_slots), failures, (created, updated, reason))| {
                pb::JobStatusResponse {
                    job_id,
                    state,
                    attempt,
                    max_attempts,
                    num_slots,
                    members: Vec::new(),
                    failures,
                    spec_summary: String::new(),
                    created_unix_ms: created,
                    updated_unix_ms: updated,
                    cancel_reason: reason,
                    // 0 half the time: a state file from before incarnations.
                    incarnation: if created % 2 == 0 { 0 } else { updated },
                    detached: updated % 2 == 0,
                }
            },
        );
    let millis = || prop_oneof![Just(0u64), 1u64..100_000, any::<u64>()];
    let config = (
        ("[a-z]{0,3}", 0u32..4, 0u32..4, ".{0,8}"),
        (millis(), millis(), millis()),
    )
        .prop_map(
            |((job_id, num_slots, max_attempts, spec_summary), (gang, barrier, lease))| {
                pb::CreateJobRequest {
                    job_id,
                    num_slots,
                    max_attempts,
                    spec_summary,
                    gang_timeout_ms: gang,
                    barrier_timeout_ms: barrier,
                    client_lease_ms: lease,
                }
            },
        );
    let record = (
        prop::option::weighted(0.95, config),
        prop::option::weighted(0.95, status),
        prop::collection::vec(info.clone(), 0..3),
        prop_oneof![Just(0u64), any::<u64>()],
    )
        .prop_map(|(config, status, members, finished)| pb::JobRecord {
            config,
            status,
            members,
            finished_unix_ms: finished,
        });
    (
        prop_oneof![9 => Just(1u32), 1 => any::<u32>()],
        prop::collection::vec(info, 0..4),
        prop::collection::vec(record, 0..4),
    )
        .prop_map(|(format, agents, jobs)| pb::StateSnapshot { format, agents, jobs })
}

/// What a peer or a broken disk may leave as `state.pb`.
fn state_file() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..512),
        2 => edits().prop_map(|(e, cut, ins)| mutate(snapshot().to_vec(), &e, cut, ins)),
        3 => arbitrary_snapshot().prop_map(|s| s.encode_to_vec()),
    ]
}

fn failed(e: RendezvousError) -> TestCaseError {
    TestCaseError::fail(format!("{e}"))
}

/// A status as the wire (and the state file) spells it: comparable.
fn wire(statuses: &[JobStatus]) -> Vec<pb::JobStatusResponse> {
    statuses.iter().map(pb::JobStatusResponse::from).collect()
}

/// `bytes` written as `<dir>/state.pb` and opened: the rendezvous, or its
/// refusal (which must name the file).
fn open_state_file(bytes: &[u8]) -> Result<Option<(tempfile::TempDir, RendezvousState)>, TestCaseError> {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("state.pb"), bytes).expect("write");
    match RendezvousState::open(RendezvousConfig::default(), Some(dir.path())) {
        Ok(state) => Ok(Some((dir, state))),
        Err(e) => {
            prop_assert!(
                matches!(e, RendezvousError::Storage { .. }) && e.to_string().contains("state.pb"),
                "{e}"
            );
            Ok(None)
        }
    }
}

proptest! {
    #![proptest_config(cases(64))]

    #[test]
    fn state_files_restore_as_they_say_or_are_refused_naming_the_file(bytes in state_file()) {
        let Some((dir, state)) = open_state_file(&bytes)? else { return Ok(()) };
        // What it accepted is a snapshot of this format.
        let snapshot = pb::StateSnapshot::decode(bytes.as_slice())
            .map_err(|e| TestCaseError::fail(format!("accepted, yet no snapshot: {e}")))?;
        prop_assert_eq!(snapshot.format, 1);
        // Every agent is back (a fresh lease), and every job, as its last
        // record says.
        let mut agents: Vec<&str> = snapshot.agents.iter().map(|a| a.agent_id.as_str()).collect();
        agents.sort_unstable();
        agents.dedup();
        let listed = state.list_agents().map_err(failed)?;
        prop_assert_eq!(listed.iter().map(|a| a.agent_id.as_str()).collect::<Vec<_>>(), agents);
        let records: BTreeMap<&str, &pb::JobRecord> = snapshot
            .jobs
            .iter()
            .filter_map(|r| Some((r.config.as_ref()?.job_id.as_str(), r)))
            .collect();
        let jobs = state.list_jobs().map_err(failed)?;
        prop_assert_eq!(jobs.len(), records.len());
        for job in &jobs {
            let record = records.get(job.job_id.as_str()).copied();
            let Some((record, config, status)) =
                record.and_then(|r| Some((r, r.config.as_ref()?, r.status.as_ref()?)))
            else {
                return Err(TestCaseError::fail(format!("job `{}` restored from no whole record", job.job_id)));
            };
            prop_assert_eq!(pb::JobState::from(job.state) as i32, status.state);
            prop_assert_eq!(
                (job.attempt, job.failures.len(), job.max_attempts, job.num_slots),
                (status.attempt, status.failures.len(), config.max_attempts, config.num_slots)
            );
            let members: Vec<&str> = record.members.iter().map(|m| m.agent_id.as_str()).collect();
            prop_assert_eq!(job.members.iter().map(String::as_str).collect::<Vec<_>>(), members);
        }
        // It runs on: a reap, a change written, and a restart reads back
        // what it wrote.
        state.reap();
        state.register_agent(agent("probe")).map_err(failed)?;
        let (jobs, agents) = (state.list_jobs().map_err(failed)?, state.list_agents().map_err(failed)?);
        drop(state);
        let again = RendezvousState::open(RendezvousConfig::default(), Some(dir.path())).map_err(failed)?;
        prop_assert_eq!(wire(&again.list_jobs().map_err(failed)?), wire(&jobs));
        prop_assert_eq!(again.list_agents().map_err(failed)?, agents);
    }

    /// Found by this property (now refused, naming the file): a `state.pb`
    /// of format 1 with one record,
    /// config `{job_id: "j", num_slots: 1, max_attempts: 3}`, status
    /// `{state: GANGING, attempt: 0}`: `open` accepted it, and then
    /// `join("j", 0, ..)` is refused ("attempts are numbered from 1") and
    /// `join("j", 1, ..)` / `report_failure("j", 1, ..)` are `StaleAttempt
    /// { current: 0 }`: the job can never run, and only a cancel ends it.
    /// With `job_id: ""` no call can name the job at all, not even a cancel.
    #[test]
    fn restored_jobs_are_well_formed(bytes in state_file()) {
        let Some((_dir, state)) = open_state_file(&bytes)? else { return Ok(()) };
        for job in state.list_jobs().map_err(failed)? {
            let what = format!("{job:?}");
            prop_assert!(!job.job_id.is_empty(), "a job without an id: {what}");
            prop_assert!(job.attempt >= 1, "attempt 0: {what}");
            prop_assert!(job.attempt <= job.max_attempts, "an attempt past max_attempts: {what}");
            prop_assert!(job.num_slots >= 1, "no slots: {what}");
        }
    }
}

// ---- heartbeat reports -------------------------------------------------------

/// An agent's heartbeat report: its cache and one job.
fn report_json() -> Vec<u8> {
    format!(
        r#"{{"cache_budget_bytes":1073741824,"cache_bytes_memory":1048576,"cache_bytes_disk":0,"jobs":[{JOB_REPORT_JSON}]}}"#
    )
    .into_bytes()
}

/// The job the reports are of, as the rendezvous holds it.
fn job_status() -> JobStatus {
    JobStatus::try_from(pb::JobStatusResponse {
        job_id: "j-1".into(),
        state: pb::JobState::Running as i32,
        attempt: 2,
        max_attempts: 3,
        num_slots: 2,
        members: vec!["a".into(), "b".into()],
        ..Default::default()
    })
    .expect("status")
}

/// What a watch with reports sends of `reports`: agent and job status.
fn kept(reports: &Reports) -> Vec<(String, Vec<u8>)> {
    reports
        .of_job("j-1")
        .into_iter()
        .map(|r| (r.agent_id, r.status_json))
        .collect()
}

proptest! {
    #![proptest_config(cases(256))]

    /// A heartbeat's report (any bytes, a real one changed, one past the
    /// bound) is kept whole or refused naming why, and a refused one
    /// leaves the agent's last good report; what is kept is what a watch
    /// sends and the client reads, and the status page renders it.
    #[test]
    fn heartbeat_reports_are_kept_whole_or_refused_and_the_last_good_one_stays(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        big in prop::sample::select(vec![0usize, MAX_REPORT_BYTES, MAX_REPORT_BYTES + 1]),
        (e, cut, ins) in edits(),
    ) {
        let padded = |n: usize| {
            let mut r = report_json();
            r.resize(n.max(r.len()), b' ');
            r
        };
        for bytes in [bytes, mutate(report_json(), &e, cut, ins), padded(big)] {
            let reports = Reports::default();
            reports.store("a", &report_json()).expect("the unmutated report is kept");
            let before = kept(&reports);
            prop_assert_eq!(before.len(), 1);
            match reports.store("a", &bytes) {
                Ok(()) if bytes.is_empty() => prop_assert_eq!(kept(&reports), before),
                Ok(()) => {
                    prop_assert!(bytes.len() <= MAX_REPORT_BYTES);
                    let report: AgentReport = serde_json::from_slice(&bytes).expect("what was kept parses");
                    let expected: Vec<_> = report
                        .jobs
                        .iter()
                        .find(|j| j.job_id == "j-1")
                        .map(|j| ("a".to_owned(), serde_json::to_vec(j).expect("json")))
                        .into_iter()
                        .collect();
                    prop_assert_eq!(kept(&reports), expected);
                    for r in reports.of_job("j-1") {
                        let m = MemberReport::try_from(r).map_err(|e| TestCaseError::fail(format!("the client refuses a kept report: {e}")))?;
                        prop_assert_eq!(&m.status.job_id, "j-1");
                    }
                    let agents = [agent("a")];
                    let page = status(
                        &[job_status()],
                        &agents,
                        &[("a".to_owned(), (Instant::now(), report))].into_iter().collect(),
                        0,
                    );
                    prop_assert!(serde_json::to_string(&page).is_ok());
                }
                Err(ReportError::TooLarge { bytes: n }) => {
                    prop_assert!(n == bytes.len() && n > MAX_REPORT_BYTES);
                    prop_assert_eq!(kept(&reports), before);
                }
                Err(ReportError::Json(e)) => {
                    prop_assert!(serde_json::from_slice::<AgentReport>(&bytes).is_err(), "{e}");
                    prop_assert_eq!(kept(&reports), before);
                }
            }
        }
    }
}

// ---- the heartbeat and all-gather handlers -----------------------------------

/// A gather a member (or anyone) may send: the job or another, any
/// attempt, rank and sequence number, a payload.
fn gather_request() -> impl Strategy<Value = pb::AllGatherRequest> {
    (
        prop_oneof![3 => Just("j".to_owned()), 1 => "[a-z]{0,2}"],
        prop_oneof![3 => Just(1u32), 1 => any::<u32>()],
        prop_oneof![3 => Just(0u32), 1 => any::<u32>()],
        prop_oneof![3 => 0u64..4, 1 => any::<u64>()],
        prop::collection::vec(any::<u8>(), 0..16),
    )
        .prop_map(|(job_id, attempt, rank, seq, payload)| pb::AllGatherRequest {
            job_id,
            attempt,
            rank,
            seq,
            payload: payload.into(),
        })
}

/// A heartbeat from the member or another id, with any report.
fn heartbeat_request() -> impl Strategy<Value = pb::HeartbeatRequest> {
    (
        prop_oneof![3 => Just("a".to_owned()), 1 => "[a-z]{0,2}"],
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            edits().prop_map(|(e, cut, ins)| mutate(report_json(), &e, cut, ins)),
        ],
    )
        .prop_map(|(agent_id, report)| pb::HeartbeatRequest { agent_id, report })
}

/// A rendezvous whose job `j` has formed its one-member gang (agent `a`,
/// attempt 1).
async fn one_member_job() -> RendezvousService {
    let state = RendezvousState::open(RendezvousConfig::default(), None).expect("open");
    state.register_agent(agent("a")).expect("register");
    assert_eq!(state.create_job(JobConfig::new("j", 1)).expect("create"), 1);
    state.join("j", 1, "a").await.expect("join");
    RendezvousService::new(state, CancellationToken::new())
}

proptest! {
    #![proptest_config(cases(128))]

    /// The handlers answer any gather or heartbeat at once: a gather of the
    /// member's next (or last) sequence number with its payload, anything
    /// else refused with an honest code; a heartbeat of the member renews
    /// its lease whatever its report. Nothing refused changes the job: the
    /// member's next gather still completes.
    #[test]
    fn gathers_and_heartbeats_answer_or_refuse_and_change_nothing_refused(
        calls in prop::collection::vec(prop_oneof![
            3 => gather_request().prop_map(Ok),
            1 => heartbeat_request().prop_map(Err),
        ], 1..8),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let service = one_member_job().await;
            // A one-member gather never waits for another: a bound only so
            // that a call which blocked fails the property instead of hanging.
            let answer = |request| tokio::time::timeout(Duration::from_secs(60), service.all_gather(Request::new(request)));
            let mut next = 0u64;
            for call in calls {
                match call {
                    Ok(request) => {
                        let (member, seq, payload) = (
                            request.job_id == "j" && request.attempt == 1 && request.rank == 0,
                            request.seq,
                            request.payload.clone(),
                        );
                        match answer(request).await.map_err(|_| TestCaseError::fail("a gather blocked"))? {
                            Ok(reply) => {
                                prop_assert!(member && (seq == next || seq.checked_add(1) == Some(next)), "seq {seq}, next {next}");
                                let payloads = reply.into_inner().payloads;
                                if seq == next {
                                    prop_assert_eq!(payloads, [payload].into_iter().filter(|p| !p.is_empty()).collect::<Vec<_>>());
                                    next += 1;
                                }
                            }
                            Err(status) => {
                                prop_assert!(
                                    matches!(
                                        status.code(),
                                        Code::InvalidArgument | Code::NotFound | Code::FailedPrecondition
                                    ),
                                    "{status:?}"
                                );
                                prop_assert!(!status.message().is_empty());
                            }
                        }
                    }
                    Err(heartbeat) => {
                        let member = heartbeat.agent_id == "a";
                        match service.heartbeat(Request::new(heartbeat)).await {
                            Ok(reply) => prop_assert!(member && reply.into_inner().lease_ms > 0),
                            Err(status) => prop_assert!(!member && !status.message().is_empty(), "{status:?}"),
                        }
                    }
                }
            }
            let last = pb::AllGatherRequest { job_id: "j".into(), attempt: 1, rank: 0, seq: next, payload: b"last".to_vec().into() };
            let reply = answer(last).await.map_err(|_| TestCaseError::fail("a gather blocked"))?;
            let payloads = reply.map_err(|s| TestCaseError::fail(format!("the member's next gather failed: {s:?}")))?.into_inner().payloads;
            prop_assert_eq!(payloads, vec![bytes::Bytes::from_static(b"last")]);
            Ok(())
        })?;
    }
}

/// What a member reads of gathers: each reply's payloads, or the code that
/// ended its calls.
type Gathered = Vec<Result<Vec<bytes::Bytes>, Code>>;

/// `requests` answered one by one by the unary handler of a fresh
/// one-member job, up to the first refusal.
async fn gathered_unary(requests: &[pb::AllGatherRequest]) -> Result<Gathered, TestCaseError> {
    let service = one_member_job().await;
    let mut out = Vec::new();
    for r in requests {
        let answer = tokio::time::timeout(
            Duration::from_secs(60),
            service.all_gather(Request::new(r.clone())),
        )
        .await
        .map_err(|_| TestCaseError::fail("a gather blocked"))?;
        match answer {
            Ok(reply) => out.push(Ok(reply.into_inner().payloads)),
            Err(status) => {
                out.push(Err(status.code()));
                break;
            }
        }
    }
    Ok(out)
}

/// `requests` sent on one AllGatherStream call to a fresh one-member job
/// served over loopback, and what came back until the stream ended.
async fn gathered_streamed(requests: Vec<pb::AllGatherRequest>) -> Result<Gathered, TestCaseError> {
    let fail = |e: &dyn std::fmt::Display| TestCaseError::fail(e.to_string());
    let service = one_member_job().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| fail(&e))?;
    let url = format!("http://{}", listener.local_addr().map_err(|e| fail(&e))?);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::rendezvous_server::RendezvousServer::new(service))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let mut client = pb::rendezvous_client::RendezvousClient::connect(url)
        .await
        .map_err(|e| fail(&e))?;
    let mut replies = client
        .all_gather_stream(futures::stream::iter(requests))
        .await
        .map_err(|e| fail(&e))?
        .into_inner();
    let mut out = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(60), replies.message())
            .await
            .map_err(|_| TestCaseError::fail("a streamed gather blocked"))?;
        match next {
            Ok(Some(reply)) => out.push(Ok(reply.payloads)),
            Ok(None) => break,
            Err(status) => {
                out.push(Err(status.code()));
                break;
            }
        }
    }
    server.abort();
    Ok(out)
}

proptest! {
    #![proptest_config(cases(32))]

    /// The streaming all-gather, over a real connection, given any
    /// sequence of gathers (any job, attempt, rank, sequence number and
    /// payload): one reply per request, in order, each what the unary call
    /// answers; the first refusal ends the stream with the unary call's
    /// code; a stream whose requests end, ends.
    #[test]
    fn the_streamed_gather_answers_as_the_unary_one_in_order_and_ends_at_the_first_refusal(
        requests in prop::collection::vec(gather_request(), 1..6),
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let unary = gathered_unary(&requests).await?;
            let streamed = gathered_streamed(requests).await?;
            prop_assert_eq!(streamed, unary);
            Ok(())
        })?;
    }
}
