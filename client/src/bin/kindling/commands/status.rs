//! `kindling status [JOB]`: the rendezvous' jobs and agents, or one job's
//! attempts, failures and per-epoch history.

use super::ClusterArgs;
use anyhow::{Context, Result};
use kindling_schemas::rendezvous::RendezvousClient;

/// `kindling status [JOB]`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// A job to show in detail: its attempts and their causes, and per
    /// epoch its losses, accuracy and throughput, with a sparkline of the loss.
    pub job: Option<String>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Runs `kindling status`.
pub async fn status(args: StatusArgs) -> Result<()> {
    let token = args.cluster.token()?;
    let channel = args.cluster.channel()?;
    let rv = args.cluster.connect().await?;
    if let Some(job) = &args.job {
        return job_status(&rv, job, token.as_ref(), &channel).await;
    }
    let agents = rv.list_agents().await?;
    println!("{} live agents", agents.len());
    for a in agents {
        println!(
            "  {:<24} {:<32} node {:<16} gpu {:<5} models {}",
            a.agent_id,
            a.flight_address,
            a.node_name,
            a.has_gpu,
            a.models.join(",")
        );
    }
    let jobs = rv.list_jobs().await?;
    println!("{} jobs", jobs.len());
    for j in jobs {
        println!(
            "  {:<24} {:?} attempt {}/{} members {}",
            j.job_id,
            j.state,
            j.attempt,
            j.max_attempts,
            j.members.len()
        );
        if let Some(cause) = j.first_cause() {
            println!("    first failure: {cause}");
        }
    }
    Ok(())
}

/// `kindling status JOB`: the rendezvous' view (state, attempts, every
/// failure's cause), then the per-epoch history one of its agents keeps.
async fn job_status(
    rv: &RendezvousClient,
    job: &str,
    token: Option<&kindling_schemas::auth::Token>,
    channel: &kindling_schemas::channel::ChannelConfig,
) -> Result<()> {
    let j = rv
        .status(job)
        .await
        .with_context(|| format!("job `{job}` at the rendezvous"))?;
    println!(
        "{}: {:?}, attempt {}/{}, {} of {} members",
        j.job_id,
        j.state,
        j.attempt,
        j.max_attempts,
        j.members.len(),
        j.num_slots
    );
    for f in &j.failures {
        println!("  attempt {} failed ({}): {}", f.attempt, f.agent_id, f.cause);
    }
    let agents = rv.list_agents().await?;
    let member = agents.iter().find(|a| j.members.contains(&a.agent_id));
    let Some(member) = member else {
        println!("  no live member agent holds the job's history");
        return Ok(());
    };
    let agent = kindling::feed::AgentClient::connect_with(&member.flight_address, token, channel)?;
    let s = agent
        .job_status(job)
        .await
        .with_context(|| format!("job `{job}` on agent {}", member.agent_id))?;
    println!(
        "  on {}: {:?}, epoch {}/{}, step {}/{}",
        member.agent_id, s.state, s.epoch, s.epochs, s.step, s.steps_per_epoch
    );
    if s.history.is_empty() {
        println!("  no epoch completed yet");
        return Ok(());
    }
    // Every other eval metric an epoch reported, as a column each.
    let names: std::collections::BTreeSet<&String> =
        s.history.iter().flat_map(|h| h.metrics.keys()).collect();
    let extra: String = names
        .iter()
        .map(|n| format!(" {:>12}", n.trim_start_matches("eval_")))
        .collect();
    println!(
        "  epoch  train loss   eval loss   accuracy         lr   samples/s     wall s       rows{extra}"
    );
    for h in &s.history {
        let metrics: String = names
            .iter()
            .map(|n| {
                h.metrics
                    .get(*n)
                    .map_or(format!(" {:>12}", "-"), |v| format!(" {v:>12.4}"))
            })
            .collect();
        let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.4}"));
        // The best epoch of the monitored metric (early stopping) is starred.
        let mark = if s.best_epoch == Some(h.epoch) { "*" } else { " " };
        println!(
            "  {:>5}{mark} {:>10.4}  {:>10}  {:>9}  {:>9}  {:>10.0}  {:>9}  {:>9}{metrics}",
            h.epoch,
            h.train_loss,
            opt(h.eval_loss),
            opt(h.eval_accuracy),
            h.learning_rate.map_or("-".to_owned(), |lr| format!("{lr:.2e}")),
            h.samples_per_sec,
            h.wall_secs.map_or("-".to_owned(), |w| format!("{w:.2}")),
            h.rows
        );
    }
    if let Some(best) = s.best_epoch {
        println!("  best epoch {best} (*)");
    }
    if let Some(epoch) = s.stopped_early {
        println!("  early stopping ended training after epoch {epoch}");
    }
    let losses: Vec<f64> = s.history.iter().map(|h| h.train_loss).collect();
    println!("  train loss {}", sparkline(&losses));
    for e in &s.events {
        println!("  {}", kindling::job::agent_log_line(job, e));
    }
    Ok(())
}

/// `values` as a line of block characters, lowest to highest.
pub fn sparkline(values: &[f64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let finite = values.iter().copied().filter(|v| v.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
        (l.min(v), h.max(v))
    });
    values
        .iter()
        .map(|&v| {
            if !v.is_finite() {
                return '?';
            }
            let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
            BARS[((t * 7.0).round() as usize).min(7)]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::sparkline;

    #[test]
    fn a_sparkline_spans_the_range() {
        assert_eq!(sparkline(&[1.0, 0.5, 0.25, 0.0]), "█▅▃▁");
        assert_eq!(sparkline(&[2.0, 2.0]), "▅▅");
        assert_eq!(sparkline(&[1.0, f64::NAN, 0.0]), "█?▁");
        assert_eq!(sparkline(&[]), "");
    }
}
