//! `use_gpu` end to end on a real agent over Flight on 127.0.0.1.
//!
//! Built with a GPU feature (`cargo test -p kindling-agent --features gpu-wgsl
//! --test gpu_training`, or `gpu` on a machine with a GPU): the same MLP job
//! trains once on the CPU (`flex`) and once on the wgpu device; the GPU run
//! must learn the rule and match the CPU run (same initial weights, same
//! batches) within float tolerance. CI has no GPU: Mesa's lavapipe
//! (`mesa-vulkan-drivers`) is the Vulkan device there, with the WGSL kernels
//! (`gpu-wgsl`: lavapipe crashes compiling the SPIR-V ones, and a `gpu` agent
//! refuses it, which this test then checks).
//! With `KINDLING_GPU_TESTS=1` a missing adapter fails the test; without it the
//! test checks that the agent refuses the `use_gpu` job instead, and says so.
//!
//! Built without the feature, it checks that `start_job` refuses a `use_gpu`
//! job with an error naming the setting and the feature.

use arrow_flight::flight_service_client::FlightServiceClient;
use futures::StreamExt;
use kindling_agent::{AgentConfig, AgentHandle};
use kindling_rendezvous::{EmbeddedRendezvous, RendezvousConfig};
use kindling_schemas::action::{Action, AgentJobStatus, JobRef, StartJob};
use kindling_schemas::auth::{BearerAttach, Token};
use kindling_schemas::rendezvous::{JobConfig, RendezvousClient};
use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

const TOKEN: &str = "gpu-test-token";

/// An embedded rendezvous and agents registered with it.
struct Local {
    rendezvous: EmbeddedRendezvous,
    agents: Vec<AgentHandle>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Local {
    async fn start() -> Local {
        Local::start_with(false, 1, None).await
    }

    /// `n` agents that keep a GPU job's step on the device with
    /// `step_on_device` and its batches there up to `kept_bytes`
    /// (`--gpu-kept-bytes`; `None`: a quarter of the adapter's memory).
    async fn start_with(step_on_device: bool, n: usize, kept_bytes: Option<u64>) -> Local {
        let token = Some(Token::new(TOKEN));
        let rendezvous = EmbeddedRendezvous::start(RendezvousConfig::default(), token.clone())
            .await
            .expect("rendezvous");
        let (mut agents, mut dirs) = (Vec::new(), Vec::new());
        for i in 0..n {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut config = AgentConfig::local(format!("gpu-agent-{i}"), dir.path());
            config.token = token.clone();
            config.rendezvous = Some(rendezvous.url());
            config.gpu_step_on_device = step_on_device;
            config.gpu_kept_bytes = kept_bytes;
            // Buckets of 16 values: the test MLP's 42 weights go in 4, so a
            // step reads back, rings and writes back as a pipeline.
            config.gpu_bucket_values = 16;
            agents.push(kindling_agent::start(config).await.expect("agent"));
            dirs.push(dir);
        }
        Local {
            rendezvous,
            agents,
            _dirs: dirs,
        }
    }

    fn flight_at(&self, agent: usize) -> FlightServiceClient<InterceptedService<Channel, BearerAttach>> {
        let channel = Endpoint::from_shared(self.agents[agent].url().to_owned())
            .expect("url")
            .connect_lazy();
        let attach = BearerAttach::new(Some(&Token::new(TOKEN))).expect("token");
        FlightServiceClient::with_interceptor(channel, attach)
    }

    #[cfg(not(feature = "wgpu-runtime"))]
    async fn action<T: serde::de::DeserializeOwned>(&self, action: &Action) -> Result<T, tonic::Status> {
        self.action_at(0, action).await
    }

    async fn action_at<T: serde::de::DeserializeOwned>(
        &self,
        agent: usize,
        action: &Action,
    ) -> Result<T, tonic::Status> {
        let mut results = self
            .flight_at(agent)
            .do_action(action.to_flight())
            .await?
            .into_inner();
        let first = results.next().await.expect("a result")?;
        Ok(serde_json::from_slice(&first.body).expect("json"))
    }

    /// Creates the job at the rendezvous and sends `start_job` to each of
    /// its `num_slots` agents.
    async fn start_job(&self, job_id: &str, spec: &JobSpec) -> Result<(), tonic::Status> {
        let rv = RendezvousClient::connect(self.rendezvous.url(), Some(&Token::new(TOKEN)))
            .await
            .expect("rendezvous client");
        rv.create_job(&JobConfig::new(job_id, spec.num_slots))
            .await
            .expect("create job");
        let start = Action::StartJob(StartJob {
            job_id: job_id.into(),
            spec: spec.clone(),
            rendezvous: self.rendezvous.url(),
            initial_weights: None,
        });
        for agent in 0..spec.num_slots as usize {
            self.action_at::<serde_json::Value>(agent, &start).await?;
        }
        Ok(())
    }

    #[cfg(not(feature = "wgpu-runtime"))]
    async fn status(&self, job_id: &str) -> AgentJobStatus {
        self.status_at(0, job_id).await
    }

    async fn status_at(&self, agent: usize, job_id: &str) -> AgentJobStatus {
        let job = Action::JobStatus(JobRef {
            job_id: job_id.into(),
        });
        self.action_at(agent, &job).await.expect("job_status")
    }

    async fn stop(self) {
        for agent in self.agents {
            agent.shutdown_and_wait().await;
        }
        self.rendezvous
            .shutdown_and_wait()
            .await
            .expect("rendezvous stops");
    }
}

/// A two-class MLP on `x1, x2 → y`.
fn mlp(use_gpu: bool) -> JobSpec {
    JobSpec::builder()
        .model(ModelSpec::Mlp { hidden: vec![8] })
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.05))
        .features(["x1", "x2"])
        .label("y")
        .batch_size(32)
        .epochs(6)
        .seed(11)
        .use_gpu(use_gpu)
        .build()
        .expect("spec")
}

#[cfg(not(feature = "wgpu-runtime"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_job_is_refused_by_an_agent_built_without_the_gpu_feature() {
    let local = Local::start().await;
    let err = local.start_job("gpu", &mlp(true)).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    let msg = err.message();
    assert!(
        msg.contains("`use_gpu`") && msg.contains("`gpu` cargo feature"),
        "{msg}"
    );
    // Nothing was started: the job is unknown to the agent.
    let unknown = local
        .action::<AgentJobStatus>(&Action::JobStatus(JobRef { job_id: "gpu".into() }))
        .await
        .expect_err("no such job");
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown}");
    // Mixed precision computes on the GPU only: a job asking for it on the
    // CPU is refused when it starts, naming the option.
    let mixed_on_cpu = JobSpec {
        precision: kindling_schemas::spec::Precision::Bf16,
        ..mlp(false)
    };
    let err = local.start_job("bf16", &mixed_on_cpu).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert!(
        err.message().contains("`precision`") && err.message().contains("use_gpu"),
        "{err}"
    );
    // The same spec without `use_gpu` is accepted and says where it trains.
    local.start_job("cpu", &mlp(false)).await.expect("cpu job");
    assert_eq!(local.status("cpu").await.device, "cpu (flex)");
    local.stop().await;
}

#[cfg(feature = "wgpu-runtime")]
mod on_gpu {
    use std::time::{Duration, Instant};

    use arrow::array::RecordBatch;
    use kindling_agent::models::backend::GpuInfo;
    use kindling_fixtures::{committed_rows, model_weights, pieces, put_messages, rule_batch};
    use kindling_schemas::action::{Action, AgentJobState, AgentJobStatus, EndOfData, EventLevel, JobEvent};
    use kindling_schemas::descriptor::{DataPath, Split};
    use kindling_schemas::spec::{JobSpec, Precision};

    use super::{Local, mlp};

    impl Local {
        /// One producer's DoPut of `batch` in 250-row pieces; returns the rows committed.
        async fn put(&self, job_id: &str, split: Split, batch: &RecordBatch) -> u64 {
            self.put_at(0, job_id, split, batch).await
        }

        /// [`put`](Self::put) to agent `agent`.
        async fn put_at(&self, agent: usize, job_id: &str, split: Split, batch: &RecordBatch) -> u64 {
            let messages = put_messages(
                job_id,
                split,
                "p",
                &batch.schema(),
                pieces(batch, 250).into_iter(),
            );
            let acks = self
                .flight_at(agent)
                .do_put(messages)
                .await
                .expect("do_put")
                .into_inner();
            let rows = committed_rows(acks).await;
            let _: serde_json::Value = self
                .action_at(
                    agent,
                    &Action::EndOfData(EndOfData {
                        job_id: job_id.into(),
                        split,
                        expected_rows: Some(rows),
                    }),
                )
                .await
                .expect("end_of_data");
            rows
        }

        async fn wait_done(&self, job_id: &str) -> AgentJobStatus {
            self.wait_done_at(0, job_id).await
        }

        async fn wait_done_at(&self, agent: usize, job_id: &str) -> AgentJobStatus {
            let deadline = Instant::now() + Duration::from_secs(900);
            loop {
                let s = self.status_at(agent, job_id).await;
                if s.state.is_terminal() {
                    return s;
                }
                assert!(Instant::now() < deadline, "`{job_id}` not done; last: {s:#?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }

        /// The trained model as (name, values) pairs.
        async fn weights(&self, job_id: &str) -> Vec<(String, Vec<f32>)> {
            self.weights_at(0, job_id).await
        }

        async fn weights_at(&self, agent: usize, job_id: &str) -> Vec<(String, Vec<f32>)> {
            let ticket = DataPath::Model {
                job_id: job_id.into(),
            }
            .ticket();
            let stream = self
                .flight_at(agent)
                .do_get(ticket)
                .await
                .expect("do_get")
                .into_inner();
            model_weights(stream).await
        }
    }

    /// Trains `spec` as job `job_id` on 2000 rows, evaluates on 1000 others.
    async fn train(local: &Local, job_id: &str, spec: &JobSpec) -> (AgentJobStatus, Vec<(String, Vec<f32>)>) {
        local.start_job(job_id, spec).await.expect("start_job");
        assert_eq!(local.put(job_id, Split::Eval, &rule_batch(1000, 99)).await, 1000);
        assert_eq!(local.put(job_id, Split::Train, &rule_batch(2000, 1)).await, 2000);
        let started = Instant::now();
        let status = local.wait_done(job_id).await;
        assert_eq!(status.state, AgentJobState::Succeeded, "{status:#?}");
        eprintln!(
            "{job_id}: trained in {:.1?} on {}; accuracy per epoch {:?}",
            started.elapsed(),
            status.device,
            status.history.iter().map(|m| m.eval_accuracy).collect::<Vec<_>>()
        );
        (status, local.weights(job_id).await)
    }

    type Weights = Vec<(String, Vec<f32>)>;

    /// The GPU run learned the rule and agrees with the CPU run (same start,
    /// same batches) up to float rounding, epoch by epoch and weight by
    /// weight. Returns its final eval accuracy.
    fn assert_like_the_cpu(
        gpu: &AgentJobStatus,
        gpu_weights: &Weights,
        cpu: &AgentJobStatus,
        cpu_weights: &Weights,
    ) -> f64 {
        // It learns.
        let accuracy = gpu
            .history
            .last()
            .and_then(|m| m.eval_accuracy)
            .expect("accuracy");
        assert!(accuracy > 0.95, "GPU eval accuracy {accuracy}");
        assert!(gpu.history.last().expect("history").train_loss < gpu.history[0].train_loss);

        // Same start, same batches: per-epoch metrics and weights agree up to float rounding.
        assert_eq!(gpu.history.len(), cpu.history.len());
        // Every step's loss, at its step (a step kept on the device reads its
        // losses every few steps).
        let steps = |s: &AgentJobStatus| {
            s.step_losses
                .iter()
                .map(|p| (p.epoch, p.step))
                .collect::<Vec<_>>()
        };
        assert_eq!(steps(gpu), steps(cpu), "the steps whose losses were kept");
        for (g, c) in gpu.step_losses.iter().zip(&cpu.step_losses) {
            assert!((g.loss - c.loss).abs() < 1e-3 * c.loss.max(0.1), "{g:?} vs {c:?}");
        }
        for (g, c) in gpu.history.iter().zip(&cpu.history) {
            assert_eq!(g.rows, c.rows);
            let loss_diff = (g.train_loss - c.train_loss).abs();
            assert!(
                loss_diff < 1e-3 * c.train_loss.max(0.1),
                "epoch {}: loss {g:?} vs {c:?}",
                g.epoch
            );
            let acc_diff = (g.eval_accuracy.unwrap_or(0.0) - c.eval_accuracy.unwrap_or(0.0)).abs();
            assert!(acc_diff <= 0.005, "epoch {}: accuracy {g:?} vs {c:?}", g.epoch);
        }
        assert_eq!(gpu_weights.len(), cpu_weights.len());
        let mut max_diff = 0f32;
        let mut max_abs = 0f32;
        for ((gn, gv), (cn, cv)) in gpu_weights.iter().zip(cpu_weights) {
            assert_eq!(gn, cn);
            assert_eq!(gv.len(), cv.len(), "{gn}");
            for (g, c) in gv.iter().zip(cv) {
                max_diff = max_diff.max((g - c).abs());
                max_abs = max_abs.max(c.abs());
            }
        }
        eprintln!(
            "GPU vs CPU: final accuracy {accuracy:.4} vs {:.4}, max |Δw| {max_diff:.2e} (max |w| {max_abs:.2})",
            cpu.history
                .last()
                .and_then(|m| m.eval_accuracy)
                .unwrap_or(f64::NAN)
        );
        assert!(max_abs > 0.0);
        assert!(
            max_diff < 1e-3 * max_abs.max(1.0),
            "GPU weights differ from the CPU's by {max_diff} (largest weight {max_abs})"
        );
        accuracy
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_gpu_learns_the_rule_and_matches_the_cpu() {
        let required = std::env::var("KINDLING_GPU_TESTS").is_ok_and(|v| v == "1");
        let local = Local::start().await;
        let info = match kindling_agent::models::backend::gpu() {
            Ok((_, info)) => info,
            Err(e) if required => panic!(
                "KINDLING_GPU_TESTS=1 but the agent has no GPU to train on: {e}\n\
                 install Mesa's software Vulkan driver: KINDLING_GPU_TESTS=1 deploy/local/setup.sh \
                 (apt-get install mesa-vulkan-drivers libvulkan1)"
            ),
            Err(e) => {
                eprintln!(
                    "NOT TRAINED ON A GPU: {e}; checking that the agent refuses `use_gpu` \
                     instead. Set KINDLING_GPU_TESTS=1 to make this a failure."
                );
                let err = local.start_job("gpu", &mlp(true)).await.expect_err("refused");
                assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
                assert!(err.message().contains(&e.to_string()), "{err}");
                local.stop().await;
                return;
            }
        };
        eprintln!("wgpu adapter:\n{}", info.report());
        // The kernels are the ones the build asked for: SPIR-V for `gpu` on
        // a Vulkan adapter, WGSL for `gpu-wgsl`.
        let expected = match cfg!(feature = "gpu") && info.api == "Vulkan" {
            true => "wgpu<spirv>",
            false => "wgpu<wgsl>",
        };
        assert_eq!(info.compiler, expected, "{info}");

        let (gpu, gpu_weights) = train(&local, "gpu", &mlp(true)).await;
        assert_eq!(
            gpu.device,
            format!("gpu (wgpu: {info})"),
            "the job ran on the wgpu device"
        );
        let (cpu, cpu_weights) = train(&local, "cpu", &mlp(false)).await;
        assert_eq!(cpu.device, "cpu (flex)");

        let accuracy = assert_like_the_cpu(&gpu, &gpu_weights, &cpu, &cpu_weights);

        // Mixed precision: half-precision compute (bf16, or f16 where the
        // adapter has no bf16) with f32 master weights and all-reduce.
        let mixed_spec = JobSpec {
            precision: Precision::Bf16,
            ..mlp(true)
        };
        if let Some(half) = half_precision(&info) {
            let (mixed, mixed_weights) = train(&local, "mixed", &mixed_spec).await;
            assert_mixed_like_f32(&info, half, &mixed, &mixed_weights, accuracy, &gpu_weights);
        } else {
            eprintln!(
                "NOT TRAINED IN HALF PRECISION: the adapter has neither bf16 nor f16; checking the refusal"
            );
            let err = local.start_job("mixed", &mixed_spec).await.expect_err("refused");
            assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
            assert!(err.message().contains("supports neither bf16 nor f16"), "{err}");
        }
        local.stop().await;
    }

    /// The events of `status` saying that batches did not fit on the device.
    fn said_not_kept(status: &AgentJobStatus) -> Vec<&JobEvent> {
        let said = |e: &&JobEvent| e.message.contains("--gpu-kept-bytes");
        status.events.iter().filter(said).collect()
    }

    /// Whether there is no adapter to train on: said, and a failure under
    /// `KINDLING_GPU_TESTS=1` (the first test says why there is none).
    fn no_gpu() -> bool {
        if kindling_agent::models::backend::gpu().is_ok() {
            return false;
        }
        assert!(
            !std::env::var("KINDLING_GPU_TESTS").is_ok_and(|v| v == "1"),
            "KINDLING_GPU_TESTS=1 but no GPU"
        );
        eprintln!("NOT TRAINED ON A GPU: no adapter (the first test says why)");
        true
    }

    /// What a mixed-precision job's device label adds on `info`'s adapter:
    /// `None` where it has neither bf16 nor f16 (the job is refused).
    fn half_precision(info: &GpuInfo) -> Option<&'static str> {
        match (info.bf16, info.f16) {
            (true, _) => Some(", bf16 compute"),
            (false, true) => Some(", f16 compute (no bf16 on this adapter)"),
            (false, false) => None,
        }
    }

    /// A mixed-precision run (`mixed`, `mixed_weights`) computed in `half`
    /// on `info`'s adapter and learned the rule as well as the f32 run of
    /// the same job (`accuracy`, `f32_weights`), whose weights it does not
    /// equal bit for bit (it did compute in half).
    fn assert_mixed_like_f32(
        info: &GpuInfo,
        half: &str,
        mixed: &AgentJobStatus,
        mixed_weights: &Weights,
        accuracy: f64,
        f32_weights: &Weights,
    ) {
        assert_eq!(mixed.device, format!("gpu (wgpu: {info}){half}"));
        let mixed_accuracy = mixed
            .history
            .last()
            .and_then(|m| m.eval_accuracy)
            .expect("accuracy");
        assert!(
            mixed_accuracy > 0.95,
            "mixed-precision eval accuracy {mixed_accuracy}"
        );
        assert!(
            (mixed_accuracy - accuracy).abs() <= 0.02,
            "mixed precision {mixed_accuracy} vs f32 {accuracy}"
        );
        let half_diff = mixed_weights
            .iter()
            .zip(f32_weights)
            .flat_map(|((_, m), (_, g))| m.iter().zip(g).map(|(m, g)| (m - g).abs()))
            .fold(0f32, f32::max);
        eprintln!(
            "mixed precision ({half}): final accuracy {mixed_accuracy:.4}, max |Δw| vs f32 {half_diff:.2e}"
        );
        assert!(
            half_diff > 0.0,
            "the mixed-precision weights equal the f32 run's bit for bit"
        );
    }

    /// `--gpu-step-on-device` (the agents' default): the same job with its
    /// optimizer, state and master weights kept on the device gives the
    /// CPU's answer too, and in mixed precision learns the rule as the f32
    /// kept step does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_step_kept_on_the_device_matches_the_cpu() {
        if no_gpu() {
            return;
        }
        // Room for every batch (lavapipe states no memory size, so the
        // default, a quarter of it, would keep none): the epochs after the
        // first gather their batches from the cached batches kept whole.
        let local = Local::start_with(true, 1, Some(64 << 20)).await;
        let (gpu, gpu_weights) = train(&local, "resident", &mlp(true)).await;
        let (cpu, cpu_weights) = train(&local, "cpu", &mlp(false)).await;
        let accuracy = assert_like_the_cpu(&gpu, &gpu_weights, &cpu, &cpu_weights);
        assert!(
            said_not_kept(&gpu).is_empty(),
            "every batch kept: {:#?}",
            gpu.events
        );
        let info = kindling_agent::models::backend::gpu().expect("adapter").1;
        if let Some(half) = half_precision(&info) {
            let mixed_spec = JobSpec {
                precision: Precision::Bf16,
                ..mlp(true)
            };
            let (mixed, mixed_weights) = train(&local, "resident-mixed", &mixed_spec).await;
            assert_mixed_like_f32(&info, half, &mixed, &mixed_weights, accuracy, &gpu_weights);
        }
        local.stop().await;
    }

    /// A dataset larger than the device memory the agent keeps batches in
    /// (`--gpu-kept-bytes` of 4 KiB: the inputs of one of the eight cached
    /// batches of 250 rows the rows arrived in): every epoch gathers the
    /// batches cut from the kept one on the device and uploads the others
    /// as it goes, and gives the CPU's answer; the job's log says so once,
    /// naming the flag.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dataset_larger_than_the_device_memory_kept_trains_like_the_cpu() {
        if no_gpu() {
            return;
        }
        let local = Local::start_with(true, 1, Some(4 << 10)).await;
        let (gpu, gpu_weights) = train(&local, "partly-kept", &mlp(true)).await;
        let (cpu, cpu_weights) = train(&local, "cpu", &mlp(false)).await;
        assert_like_the_cpu(&gpu, &gpu_weights, &cpu, &cpu_weights);
        assert_eq!(said_not_kept(&gpu).len(), 1, "{:#?}", gpu.events);
        let said = said_not_kept(&gpu)[0];
        assert_eq!(said.level, EventLevel::Warn);
        assert!(
            said.message
                .contains("did not fit in the 4.0 KiB of device memory"),
            "{}",
            said.message
        );
        local.stop().await;
    }

    /// Trains `spec` (2 slots) as job `job_id` on two agents, each with half
    /// of the rows of [`train`]; returns rank 0's status and each agent's
    /// model.
    async fn train_pair(local: &Local, job_id: &str, spec: &JobSpec) -> (AgentJobStatus, [Weights; 2]) {
        local.start_job(job_id, spec).await.expect("start_job");
        let (eval, data) = (rule_batch(1000, 99), rule_batch(2000, 1));
        for agent in 0..2 {
            let half = |b: &RecordBatch| b.slice(agent * b.num_rows() / 2, b.num_rows() / 2);
            assert_eq!(local.put_at(agent, job_id, Split::Eval, &half(&eval)).await, 500);
            assert_eq!(
                local.put_at(agent, job_id, Split::Train, &half(&data)).await,
                1000
            );
        }
        let mut statuses = Vec::new();
        for agent in 0..2 {
            let status = local.wait_done_at(agent, job_id).await;
            assert_eq!(
                status.state,
                AgentJobState::Succeeded,
                "agent {agent}: {status:#?}"
            );
            statuses.push(status);
        }
        let weights = [
            local.weights_at(0, job_id).await,
            local.weights_at(1, job_id).await,
        ];
        (statuses.swap_remove(0), weights)
    }

    /// A data-parallel job of two agents on the GPU keeps its step on the
    /// device and all-reduces its gradient sums bucket by bucket: in 4
    /// buckets a step (read back while the ring runs) it gives
    /// the answer of the same two agents on the CPU, step by step, and both
    /// ranks end with the same weights; in mixed precision (half compute,
    /// f32 master weights and all-reduce) too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_data_parallel_job_steps_on_the_device_like_the_cpu() {
        if no_gpu() {
            return;
        }
        let local = Local::start_with(true, 2, None).await;
        let pair = |use_gpu: bool| JobSpec {
            num_slots: 2,
            ..mlp(use_gpu)
        };
        let (gpu, [gpu_weights, gpu_rank1]) = train_pair(&local, "pair-gpu", &pair(true)).await;
        let (cpu, [cpu_weights, _]) = train_pair(&local, "pair-cpu", &pair(false)).await;
        assert_eq!(gpu.history[0].rows, 1000, "each rank trained its half");
        let accuracy = assert_like_the_cpu(&gpu, &gpu_weights, &cpu, &cpu_weights);
        assert_eq!(gpu_weights, gpu_rank1, "the ranks' weights are identical");
        let info = kindling_agent::models::backend::gpu().expect("adapter").1;
        if let Some(half) = half_precision(&info) {
            let mixed_spec = JobSpec {
                precision: Precision::Bf16,
                ..pair(true)
            };
            let (mixed, [mixed_weights, mixed_rank1]) = train_pair(&local, "pair-mixed", &mixed_spec).await;
            assert_mixed_like_f32(&info, half, &mixed, &mixed_weights, accuracy, &gpu_weights);
            assert_eq!(
                mixed_weights, mixed_rank1,
                "the ranks' master weights are identical in mixed precision"
            );
        }
        local.stop().await;
    }
}
