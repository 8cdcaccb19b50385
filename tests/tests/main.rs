//! The end-to-end tests of the workspace, in one test binary (one link of
//! arrow, tonic and burn instead of one per file): a module per area and
//! topic, named as its file. Each test still starts the processes, ports and
//! directories it needs; run one area with `cargo test -p kindling-tests --test
//! e2e <module>::`.

mod python_common;
mod rendezvous_common;

mod agent_collective;
mod agent_ingest;
mod agent_spill_full;
mod agent_training;
mod bad_input;
mod cpp_flight;
mod credentials;
mod evaluation;
mod executor_push;
mod grpc_reflection;
mod house_rules;
mod job_eval_split;
mod job_fit;
mod job_fit_arrow;
mod job_relay_slices;
mod job_replacement;
mod long_jobs;
mod metrics_prometheus;
mod mlflow_tracking;
mod model_examples;
mod model_interchange;
mod net_silent_peer;
mod netns_nodes;
mod python_flight;
mod python_package;
mod python_push;
mod rendezvous_auth;
mod rendezvous_failure;
mod rendezvous_gang;
mod rendezvous_replicas;
mod search;
mod search_faults;
mod soak;
mod spark_authenticate;
mod spark_create_dataframe;
mod spark_dataframe;
mod spark_errors;
mod spark_netns;
mod spark_read;
mod spark_reattach;
mod spark_session;
mod spark_standalone;
mod spark_stream;
mod spark_write;
mod status_page;
mod tls_cluster;
mod training_options;
mod transform;
