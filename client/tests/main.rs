//! The `kindling` binary as a real process, in one test binary: a module per
//! command, named as its file.

mod common;

mod cli_client_lease;
mod cli_detach;
mod cli_evaluate;
mod cli_export;
mod cli_predict;
mod cli_status;
mod cli_train;
