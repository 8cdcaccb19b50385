//! Elastic resize: a ganging attempt shrinks, a running one grows.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_ganging_attempt_shrinks_and_forms_with_the_survivors_from_then_on() {
    let dir = tempfile::tempdir().unwrap();
    let s = durable(dir.path());
    for id in ["a", "b", "c"] {
        s.register_agent(agent(id)).unwrap();
    }
    s.create_job(JobConfig::new("j", 3).with_max_attempts(3)).unwrap();
    form(&s, "j", 1, &["a", "b", "c"]).await;
    // Shrinking a formed attempt, past the service's bound, or to nothing is
    // refused unchanged.
    let running = s.resize_job("j", 1, 2).unwrap_err();
    assert!(
        running.to_string().contains("only a ganging attempt can shrink"),
        "{running}"
    );
    assert_eq!(s.report_failure("j", 1, "b", "lost").unwrap(), Some(2));
    let grow = s.resize_job("j", 2, 70_000).unwrap_err();
    assert!(
        grow.to_string()
            .contains("num_slots must be in 1..=65536, got 70000"),
        "{grow}"
    );
    assert!(s.resize_job("j", 2, 0).is_err());
    assert!(matches!(
        s.resize_job("j", 1, 2),
        Err(RendezvousError::StaleAttempt { current: 2, .. })
    ));
    assert_eq!(s.job_status("j").unwrap().num_slots, 3);

    // The survivors wait in the gang of attempt 2; the shrink releases them.
    let joins: Vec<_> = ["a", "c"]
        .iter()
        .map(|id| {
            let (s, id) = (s.clone(), id.to_string());
            tokio::spawn(async move { s.join("j", 2, &id).await })
        })
        .collect();
    while s.job_status("j").unwrap().members.len() < 2 {
        tokio::task::yield_now().await;
    }
    let too_small = s.resize_job("j", 2, 1).unwrap_err();
    assert!(
        too_small
            .to_string()
            .contains("2 members already joined attempt 2"),
        "{too_small}"
    );
    assert_eq!(s.resize_job("j", 2, 2).unwrap(), 2);
    let mut ranks = Vec::new();
    for j in joins {
        let m = j.await.unwrap().unwrap();
        assert_eq!((m.attempt, m.world_size), (2, 2));
        ranks.push((m.rank, m.peers[m.rank as usize].agent_id.clone()));
    }
    assert_eq!(ranks, vec![(0, "a".to_owned()), (1, "c".to_owned())]);
    let status = s.job_status("j").unwrap();
    assert_eq!((status.state, status.num_slots), (JobState::Running, 2));
    // A retried shrink is a no-op; the size survives a restart and holds for
    // the next attempt.
    assert_eq!(s.resize_job("j", 2, 2).unwrap(), 2);
    drop(s);
    let s = durable(dir.path());
    assert_eq!(s.job_status("j").unwrap().num_slots, 2);
    assert_eq!(s.report_failure("j", 2, "a", "again").unwrap(), Some(3));
    let members = form(&s, "j", 3, &["c", "a"]).await;
    assert!(members.iter().all(|m| m.world_size == 2));
}

#[tokio::test(start_paused = true)]
async fn a_running_attempt_grows_into_the_next_which_forms_with_the_newcomer_at_no_attempts_cost() {
    let dir = tempfile::tempdir().unwrap();
    let s = durable(dir.path());
    for id in ["a", "b", "c"] {
        s.register_agent(agent(id)).unwrap();
    }
    s.create_job(JobConfig::new("j", 2).with_max_attempts(1)).unwrap();
    form(&s, "j", 1, &["a", "b"]).await;
    // A running attempt ends; the next waits for three members.
    assert_eq!(s.resize_job("j", 1, 3).unwrap(), 3);
    let status = s.job_status("j").unwrap();
    assert_eq!(
        (
            status.state,
            status.attempt,
            status.num_slots,
            status.max_attempts
        ),
        (JobState::Ganging, 2, 3, 2),
        "the growth gave its attempt back"
    );
    let cause = &status.failures.last().unwrap().cause;
    assert!(cause.contains("the gang grows from 2 to 3 members"), "{cause}");
    // A retry changes nothing; the old attempt is fenced off.
    assert_eq!(s.resize_job("j", 2, 3).unwrap(), 3);
    assert!(matches!(
        s.resize_job("j", 1, 3),
        Err(RendezvousError::StaleAttempt { current: 2, .. })
    ));
    let members = form(&s, "j", 2, &["a", "b", "c"]).await;
    assert!(members.iter().all(|m| (m.attempt, m.world_size) == (2, 3)));
    // The size survives a restart; a failure now still fails the job (its
    // one attempt of its own was never used up by the growth).
    drop(s);
    let s = durable(dir.path());
    assert_eq!(s.job_status("j").unwrap().num_slots, 3);
    assert_eq!(s.report_failure("j", 2, "c", "lost").unwrap(), None);
    assert_eq!(s.job_status("j").unwrap().state, JobState::Failed);
}
