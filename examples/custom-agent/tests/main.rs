//! The custom agent as real processes, in one test binary: a module per
//! scenario, named as its file.

mod common;

mod elastic;
mod restart;
mod wide_and_deep;
