//! One ring rank in a process of its own, for tests that kill it: serves
//! the ring data plane on a loopback port, prints `url=<its url>`, reads
//! the ring's URLs (comma-separated, in rank order) from stdin, then
//! all-reduces `--floats` ones over and over, printing `op <n>` after each.
//!
//! `ring_rank --token T --job J --rank R --floats N`

use std::io::BufRead;
use std::time::Duration;

use kindling_agent::collective::{Inbox, Ring, RingConfig};
use kindling_schemas::auth::{BearerCheck, Token};
use tokio_util::sync::CancellationToken;

fn arg(name: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| panic!("{name} is required"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let token = Token::new(arg("--token"));
    let job = arg("--job");
    let rank: u32 = arg("--rank").parse()?;
    let floats: usize = arg("--floats").parse()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("url=http://{}", listener.local_addr()?);
    let inbox = Inbox::new();
    let stop = CancellationToken::new();
    kindling_agent::collective::listen(
        listener,
        None,
        inbox.clone(),
        BearerCheck::new(Some(token.clone())),
        stop,
    );
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map(|_| line)
    })
    .await??;
    let peers: Vec<String> = line.trim().split(',').map(str::to_owned).collect();
    inbox.enter_attempt(&job, 1);
    let mut ring = Ring::new(
        RingConfig {
            job_id: job,
            attempt: 1,
            rank,
            peers,
            token: Some(token),
            timeout: Duration::from_secs(20),
            channel: Default::default(),
        },
        inbox,
        CancellationToken::new(),
    )?;
    let mut buf = vec![1.0f32; floats];
    for op in 1.. {
        ring.all_reduce_sum(&mut buf).await?;
        println!("op {op}");
    }
    Ok(())
}
