//! A spill directory that fills up (a 1 MiB tmpfs under the agent's work
//! dir): the job whose batch did not fit fails with RESOURCE_EXHAUSTED naming
//! the spill directory and the bytes it needed, every spill file it wrote is
//! removed, and a second job on the same agent trains to the end. With the
//! free-space floor (`--min-free-disk`) the same batch is refused before a
//! byte of it is written, and its job goes on.
//! Mounting needs root (as CI runs); elsewhere the test says so and passes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling_schemas::action::AgentJobState;
use kindling_schemas::descriptor::Split;
use kindling_tests::cluster::*;

/// A tmpfs of `size` mounted on `dir` until dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    /// `None` (the test is skipped, saying so) where mounting needs a root
    /// this process is not; under CI, which runs as root, a failure.
    fn mount(dir: &Path, size: &str) -> Option<SmallDisk> {
        std::fs::create_dir_all(dir).expect("mount point");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|status| status.success());
        if !mounted {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "CI runs as root and must mount the tmpfs"
            );
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        Some(SmallDisk(dir.to_owned()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let p = e.path();
            if p.is_dir() { files_under(&p) } else { vec![p] }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spill_disk_fails_its_job_frees_its_files_and_spares_the_other_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let work = dir.path().join("small");
    let Some(disk) = SmallDisk::mount(&work, "1m") else {
        return;
    };
    let mut config = LocalClusterConfig::new(&work);
    config.lease = Duration::from_millis(600);
    // Almost everything spills.
    config.memory_budget = 64 << 10;
    // No free-space floor: the write itself meets ENOSPC, as when something
    // else on the volume fills it.
    config.staging.min_free_disk = Some(0);
    let cluster = LocalCluster::start(1, config).await.expect("cluster");
    start_job(&cluster, "big", &linear_spec(1), &[0]).await;
    start_job(&cluster, "small", &linear_spec(2), &[0]).await;
    let agent = agent_client(&cluster, 0);

    // 40 batches of ~40 KB each: past the budget they go to the 1 MiB disk.
    let batches: Vec<_> = (0..40).map(|i| rule_batch(2000, i)).collect();
    let err = put(&agent, "big", Split::Train, "p0", &batches)
        .await
        .expect_err("the disk fills up");
    assert_eq!(err.code(), Some(tonic::Code::ResourceExhausted), "{err}");
    let message = err.to_string();
    let spill_dir = work.join("spill");
    assert!(message.contains(&spill_dir.display().to_string()), "{message}");
    assert!(
        message.contains("is full") && message.contains("bytes needed"),
        "{message}"
    );
    assert!(!err.is_retryable(), "{err}");

    let big = status(&agent, "big").await;
    assert_eq!(big.state, AgentJobState::Failed, "{big:?}");
    assert!(
        big.error.as_deref().is_some_and(|e| e.contains("is full")),
        "{big:?}"
    );
    assert_eq!((big.rows_train, big.cache_bytes_disk), (0, 0), "{big:?}");
    assert_eq!(
        files_under(&spill_dir),
        Vec::<PathBuf>::new(),
        "spill files left behind"
    );

    // The other job on the same agent is untouched and trains to the end.
    let small = put(&agent, "small", Split::Train, "p0", &[rule_batch(600, 99)])
        .await
        .expect("the other job still takes rows");
    assert_eq!(small.rows_committed, 600);
    end_of_data(&agent, "small", Split::Train, Some(600)).await;
    let done = wait_done(&agent, "small").await;
    assert_eq!(done.state, AgentJobState::Succeeded, "{done:?}");
    assert_eq!(done.rows_trained_per_epoch, vec![600, 600]);

    cluster.shutdown().await;
    drop(disk);
}

/// The default free-space floor (1 GiB) on a 1 MiB volume: the first batch
/// past the memory budget is refused before it is written, naming the
/// directory and the flag; no spill file is left, the job has not failed,
/// and batches that fit in memory are still taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spill_that_would_pass_the_free_space_floor_is_refused_before_it_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let work = dir.path().join("small");
    let Some(disk) = SmallDisk::mount(&work, "1m") else {
        return;
    };
    let mut config = LocalClusterConfig::new(&work);
    config.lease = Duration::from_millis(600);
    config.memory_budget = 64 << 10;
    assert_eq!(config.staging.min_free_disk, None, "the default floor");
    let cluster = LocalCluster::start(1, config).await.expect("cluster");
    start_job(&cluster, "job", &linear_spec(1), &[0]).await;
    let agent = agent_client(&cluster, 0);

    let batches: Vec<_> = (0..40).map(|i| rule_batch(2000, i)).collect();
    let err = put(&agent, "job", Split::Train, "p0", &batches)
        .await
        .expect_err("the floor refuses the spill");
    assert_eq!(err.code(), Some(tonic::Code::ResourceExhausted), "{err}");
    let message = err.to_string();
    let spill_dir = work.join("spill");
    assert!(message.contains(&spill_dir.display().to_string()), "{message}");
    assert!(message.contains("--min-free-disk"), "{message}");
    assert_eq!(
        files_under(&spill_dir),
        Vec::<PathBuf>::new(),
        "a refused spill wrote a file"
    );
    let job = status(&agent, "job").await;
    assert_ne!(job.state, AgentJobState::Failed, "{job:?}");
    assert_eq!((job.rows_train, job.cache_bytes_disk), (0, 0), "{job:?}");

    // A batch that fits in memory is still taken.
    let taken = put(&agent, "job", Split::Train, "p1", &[rule_batch(600, 99)])
        .await
        .expect("a batch in memory");
    assert_eq!(taken.rows_committed, 600);

    cluster.shutdown().await;
    drop(disk);
}
