//! What the agent's benchmark programs share.

// Each program uses part of this module.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{FixedSizeListArray, Float32Array, Int32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
use arrow_flight::{FlightData, SchemaAsIpc};
use kindling_agent::collective::{Inbox, Ring, RingConfig};
use kindling_schemas::auth::{BearerCheck, Token};
use kindling_schemas::descriptor::DataPath;
use kindling_schemas::metadata::BatchMetadata;
use kindling_schemas::tls::{Tls, TlsFiles};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The value after `--name` on the command line, or `default`.
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The comma-separated values after `--name`, or `default`'s.
pub fn list(name: &str, default: &str) -> Vec<String> {
    let args: Vec<String> = std::env::args().collect();
    let value = args
        .iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, String::as_str);
    value.split(',').map(str::to_owned).collect()
}

/// Reads back the losses of steps kept on the device that are not read yet,
/// summed on the device: the wait for every step queued so far.
pub fn read_losses(pending: &mut Vec<burn::tensor::Tensor<1>>) {
    if !pending.is_empty() {
        let sum = burn::tensor::Tensor::cat(std::mem::take(pending), 0).sum();
        std::hint::black_box(sum.into_scalar::<f32>());
    }
}

/// One agent's step kept on the device, as the trainer runs it on a GPU:
/// `model` stepped by `opt` for `steps` timed steps after `warmup`, the
/// next batch staged (and kept, as `pipeline` says) meanwhile, the losses
/// read back every `every` steps and after the last. Samples/s.
pub fn device_steps(
    mut model: Box<dyn kindling_agent::models::kindling_model::AnyModel>,
    opt: &mut kindling_agent::optim::DeviceOptimizer,
    mut pipeline: kindling_agent::models::kindling_model::staged::Pipeline,
    (data, layout, spec, device): (
        &[RecordBatch],
        &kindling_schemas::schema::FeatureLayout,
        &kindling_schemas::spec::JobSpec,
        &burn::tensor::Device,
    ),
    (steps, warmup): (usize, usize),
    every: usize,
) -> anyhow::Result<f64> {
    let mut pending = Vec::new();
    let mut t = std::time::Instant::now();
    for i in 0..warmup + steps {
        if i == warmup {
            read_losses(&mut pending);
            t = std::time::Instant::now();
        }
        let next = (i + 1 < warmup + steps).then(|| &data[(i + 1) % data.len()]);
        let share = pipeline
            .run(&data[i % data.len()], next, layout, spec, device, |b| {
                model.device_gradients(b, opt)
            })
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        model = model.device_step(opt, (1.0 / share.weight) as f32);
        pending.extend(share.loss_sum);
        if (i + 1) % every == 0 {
            read_losses(&mut pending);
        }
    }
    // Reading the losses back is the sync point: every timed step has run.
    read_losses(&mut pending);
    Ok((steps * spec.batch_size) as f64 / t.elapsed().as_secs_f64())
}

/// CPU seconds (user + system) this process has used.
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_comm = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 of the line (utime, stime) are 11 and 12 after the command name.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}

/// `n` batches of `rows` rows: a 784-float feature `x` (a `FixedSizeList`,
/// uniform in [-1, 1)) and a 10-class `y`, the same for a seed every run.
pub fn mlp_batches(n: usize, rows: usize) -> Vec<RecordBatch> {
    use rand::{Rng, SeedableRng};
    const IN: i32 = 784;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let schema = Arc::new(Schema::new(vec![
        Field::new("x", DataType::FixedSizeList(item.clone(), IN), false),
        Field::new("y", DataType::Int32, false),
    ]));
    (0..n)
        .map(|_| {
            let values: Vec<f32> = (0..rows * IN as usize)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let x = FixedSizeListArray::new(item.clone(), IN, Arc::new(Float32Array::from(values)), None);
            let y = Int32Array::from_iter_values((0..rows).map(|_| rng.random_range(0..10)));
            RecordBatch::try_new(schema.clone(), vec![Arc::new(x), Arc::new(y)]).expect("batch")
        })
        .collect()
}

/// `total_mb` MB of 65,536-row batches of 16 `f32` features and an `i32` label.
pub fn ingest_batches(total_mb: usize) -> (Arc<Schema>, Vec<RecordBatch>) {
    let schema = Arc::new(Schema::new(
        (0..16)
            .map(|i| Field::new(format!("f{i}"), DataType::Float32, true))
            .chain([Field::new("y", DataType::Int32, true)])
            .collect::<Vec<_>>(),
    ));
    let rows = 65_536;
    let batch_bytes = rows * 17 * 4;
    let n = (total_mb << 20).div_ceil(batch_bytes);
    let mut cols: Vec<Arc<dyn arrow::array::Array>> = (0..16)
        .map(|i| {
            Arc::new(Float32Array::from_iter_values(
                (0..rows).map(|r| (r * (i + 1)) as f32 * 1e-3),
            )) as _
        })
        .collect();
    cols.push(Arc::new(Int32Array::from_iter_values(
        (0..rows).map(|r| (r % 2) as i32),
    )));
    let batch = RecordBatch::try_new(schema.clone(), cols).expect("batch");
    (schema, vec![batch; n])
}

pub fn encode(schema: &Schema, batches: &[RecordBatch], path: &DataPath) -> Vec<FlightData> {
    let options = IpcWriteOptions::default();
    let mut first: FlightData = SchemaAsIpc::new(schema, &options).into();
    first.flight_descriptor = Some(path.descriptor());
    let mut out = vec![first];
    let generator = IpcDataGenerator::default();
    let mut tracker = DictionaryTracker::new(false);
    for (seq, b) in batches.iter().enumerate() {
        let (_, encoded) = generator
            .encode(b, &mut tracker, &options, &mut Default::default())
            .expect("encode");
        let mut msg: FlightData = encoded.into();
        msg.app_metadata = BatchMetadata {
            producer: "bench".into(),
            seq: seq as u64,
            attempt: 0,
        }
        .encode()
        .into();
        out.push(msg);
    }
    out
}

/// Collective servers for `world` ranks on loopback, serving `tls` if given.
pub async fn collective_servers(
    world: usize,
    token: &Token,
    tls: Option<Tls>,
    stop: &CancellationToken,
) -> anyhow::Result<(Vec<String>, Vec<Arc<Inbox>>)> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut urls = Vec::new();
    let mut inboxes = Vec::new();
    for _ in 0..world {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        urls.push(format!("{scheme}://{}", listener.local_addr()?));
        let inbox = Inbox::new();
        inboxes.push(inbox.clone());
        kindling_agent::collective::listen(
            listener,
            tls.clone(),
            inbox,
            BearerCheck::new(Some(token.clone())),
            stop.clone(),
        );
    }
    Ok((urls, inboxes))
}

/// A server's and a client's TLS settings, both from one test CA.
pub struct Pki {
    pub server: Tls,
    pub client: Tls,
    _dir: tempfile::TempDir,
}

pub fn pki() -> anyhow::Result<Pki> {
    let dir = tempfile::tempdir()?;
    let ca = kindling_fixtures::pki::TestCa::new("bench CA");
    let files = |name: &str, sub: &str| {
        ca.issue(name, &["127.0.0.1"])
            .write(&dir.path().join(sub), ca.pem())
    };
    let (s, c) = (files("bench-server", "server"), files("bench-client", "client"));
    let tls = |f: &kindling_fixtures::pki::Files, client_auth| {
        Tls::new(TlsFiles {
            cert: Some(f.cert.clone()),
            key: Some(f.key.clone()),
            ca: Some(f.ca.clone()),
            client_auth,
            server_name: None,
        })
    };
    Ok(Pki {
        server: tls(&s, true)?,
        client: tls(&c, false)?,
        _dir: dir,
    })
}

/// A Flight client with the bearer token attached.
pub type Client = arrow_flight::flight_service_client::FlightServiceClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        kindling_schemas::auth::BearerAttach,
    >,
>;

/// A Flight client of the agent at `url`.
pub async fn flight(
    url: &str,
    token: &Token,
    channel: &kindling_schemas::channel::ChannelConfig,
) -> anyhow::Result<Client> {
    let connection = channel.dial(url, true)?.connect().await?;
    Ok(
        arrow_flight::flight_service_client::FlightServiceClient::with_interceptor(
            connection,
            kindling_schemas::auth::BearerAttach::new(Some(token))?,
        )
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20),
    )
}

/// Runs `action` to its end.
pub async fn act(client: &mut Client, action: kindling_schemas::action::Action) -> anyhow::Result<()> {
    let mut results = client.do_action(action.to_flight()).await?.into_inner();
    while let Some(r) = futures::StreamExt::next(&mut results).await {
        r?;
    }
    Ok(())
}

/// Rank `rank` of a ring of in-process ranks over the collective servers
/// at `urls` (attempt 1 of job `job`).
pub fn ring(
    job: &str,
    rank: usize,
    urls: &[String],
    token: &Token,
    inbox: &Arc<Inbox>,
) -> anyhow::Result<Ring> {
    inbox.enter_attempt(job, 1);
    Ok(Ring::new(
        RingConfig {
            job_id: job.to_owned(),
            attempt: 1,
            rank: rank as u32,
            peers: urls.to_vec(),
            token: Some(token.clone()),
            timeout: Duration::from_secs(120),
            channel: Default::default(),
        },
        inbox.clone(),
        CancellationToken::new(),
    )?)
}
