//! `kindling jobs`, `kindling wait JOB`, `kindling fetch JOB -o DIR`: the
//! jobs a rendezvous knows, and one job (a detached one: `kindling train
//! --detach`) followed to its end and its model fetched, from any machine
//! with the cluster's token.

use std::path::PathBuf;

use anyhow::{Context, Result};
use kindling::job::{JobHandle, ProgressMode};

use super::{ClusterArgs, report_model};

/// `kindling jobs`.
#[derive(Debug, clap::Args)]
pub struct JobsArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `kindling wait JOB`: follows the job to its end; a job submitted with
/// `--max-slots` above `--slots` grows meanwhile by agents that join.
#[derive(Debug, clap::Args)]
pub struct WaitArgs {
    /// The job (`kindling train --detach` printed its id).
    pub job: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Also save the trained model here once the job succeeded.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

/// `kindling fetch JOB -o DIR`.
#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    /// The job; it must have succeeded.
    pub job: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Where to save the trained model.
    #[arg(long, short)]
    pub output: PathBuf,
}

/// Runs `kindling jobs`: one line per job, detached ones marked.
pub async fn jobs(args: JobsArgs) -> Result<()> {
    let rv = args.cluster.connect().await?;
    let jobs = rv.list_jobs().await?;
    println!("{} jobs", jobs.len());
    for j in jobs {
        println!(
            "  {:<24} {:<9} attempt {}/{} members {}{}",
            j.job_id,
            j.state.as_str(),
            j.attempt,
            j.max_attempts,
            j.members.len(),
            if j.detached { "  detached" } else { "" }
        );
        if let Some(cause) = j.first_cause().or(j.cancel_reason.as_deref()) {
            println!("    why: {cause}");
        }
    }
    Ok(())
}

/// Runs `kindling wait`: the job's progress until it ends; fails with the
/// job's error when the job fails or is cancelled.
pub async fn wait(args: WaitArgs) -> Result<()> {
    let handle = args.cluster.handle(&args.job)?.progress(ProgressMode::Auto);
    let last = handle
        .wait()
        .await
        .with_context(|| format!("waiting for job `{}`", args.job))?;
    let loss = last
        .history
        .last()
        .map_or(String::new(), |m| format!(", train loss {:.4}", m.train_loss));
    println!("job {} succeeded: {} epochs{loss}", args.job, last.history.len());
    if let Some(dir) = &args.output {
        save(&handle, dir).await?;
    }
    Ok(())
}

/// Runs `kindling fetch`.
pub async fn fetch(args: FetchArgs) -> Result<()> {
    save(&args.cluster.handle(&args.job)?, &args.output).await
}

async fn save(handle: &JobHandle, dir: &std::path::Path) -> Result<()> {
    let model = handle
        .fetch()
        .await
        .with_context(|| format!("fetching the model of job `{}`", handle.job_id()))?;
    model.save(dir)?;
    report_model(&model);
    println!("model saved to {}", dir.display());
    Ok(())
}
