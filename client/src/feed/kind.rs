//! Which way a job's rows reach its agents: relayed by this process, or
//! pushed by Spark's tasks.

use super::ExecutorPush;

/// How the DataFrame's rows reach the agents.
///
/// ```
/// use kindling::job::{ExecutorPush, Feed};
/// let relay = Feed::default();
/// assert_eq!(relay, Feed::DriverRelay);
/// let push = Feed::ExecutorPush(ExecutorPush::new().python_version("3.12"));
/// # let _ = push;
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Feed {
    /// The client executes the DataFrame through Spark Connect and streams its
    /// Arrow batches to the agents (needs nothing on the executors; every row
    /// crosses the client).
    #[default]
    DriverRelay,
    /// Every Spark task pushes its own partition straight to an agent with
    /// `mapInArrow` and the shipped `kindling_client/push.py` (rows never cross the
    /// client; the executors need Python with pyarrow). See docs/executor-push.md.
    ExecutorPush(ExecutorPush),
}
