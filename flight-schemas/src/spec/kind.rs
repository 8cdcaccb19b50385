//! [`JobKind`]: what a job does with rows — trains on its own, holds them
//! for others (a search's dataset), or trains on another job's (a trial).

use super::JobSpec;

/// What a job does with rows: on the wire, the spec's `holds_rows` and
/// `rows_from` (a spec setting both is refused by [`JobSpec::validate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind<'a> {
    /// Trains on the rows fed to it.
    Train,
    /// Trains nothing: holds the rows fed to it for the jobs that read them,
    /// until it is cancelled (a search's dataset).
    Dataset,
    /// Trains on the rows the dataset job `dataset` holds on each of its
    /// agents, and takes none of its own (a search's trial).
    Trial {
        /// The dataset's job id.
        dataset: &'a str,
    },
}

impl JobSpec {
    /// What this job does with rows ([`JobKind`]).
    pub fn kind(&self) -> JobKind<'_> {
        match (&self.rows_from, self.holds_rows) {
            (_, true) => JobKind::Dataset,
            (Some(dataset), false) => JobKind::Trial { dataset },
            (None, false) => JobKind::Train,
        }
    }

    /// Makes this job of `kind` (its `holds_rows` and `rows_from`).
    pub fn set_kind(&mut self, kind: JobKind<'_>) {
        (self.holds_rows, self.rows_from) = match kind {
            JobKind::Train => (false, None),
            JobKind::Dataset => (true, None),
            JobKind::Trial { dataset } => (false, Some(dataset.to_owned())),
        };
    }
}
