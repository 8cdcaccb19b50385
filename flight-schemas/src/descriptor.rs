//! Flight path descriptors and tickets.
//!
//! Every Kindling Flight resource is named by a **path** so that any Flight
//! client, in any language, can address it:
//!
//! | path | used with | what |
//! |---|---|---|
//! | `[job_id, "train"]` | `DoPut` | training rows of a job |
//! | `[job_id, "eval"]` | `DoPut` | evaluation rows of a job |
//! | `[job_id, "predict"]` | `DoExchange` | features in, predictions out |
//! | `[job_id, "model"]` | `GetFlightInfo` / `DoGet` | trained weights as an Arrow table |
//! | `[job_id, "checkpoint"]` | `GetFlightInfo` / `DoGet` | latest checkpoint's weights |
//! | `[job_id, "train" \| "eval", producer]` | `DoGet` (operator) | the rows `producer` committed here, in its order: a growing gang's hand-over |
//!
//! A ticket is the same path joined with `/` (job ids cannot contain `/`).

use arrow_flight::{FlightDescriptor, Ticket, flight_descriptor::DescriptorType};

/// Which part of a job's data a batch belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Rows to train on.
    Train,
    /// Held-out rows, evaluated after each epoch.
    Eval,
}

impl Split {
    /// The path segment, `train` or `eval`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Eval => "eval",
        }
    }
}

/// A Kindling Flight resource.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DataPath {
    /// `[job_id, "train" | "eval"]`: rows streamed in with `DoPut`.
    Data {
        /// The job.
        job_id: String,
        /// Train or eval.
        split: Split,
    },
    /// `[job_id, "predict"]`: `DoExchange` features → predictions.
    Predict {
        /// The job whose model predicts.
        job_id: String,
    },
    /// `[job_id, "model"]`: the trained weights.
    Model {
        /// The job.
        job_id: String,
    },
    /// `[job_id, "checkpoint"]`: the latest checkpoint's weights.
    Checkpoint {
        /// The job.
        job_id: String,
    },
    /// `[job_id, "train" | "eval", producer]`: `DoGet` of the rows one
    /// producer committed to a split here, in its sequence order (the
    /// client moving them to an agent that joined a growing gang).
    Rows {
        /// The job.
        job_id: String,
        /// Train or eval.
        split: Split,
        /// The producer whose rows.
        producer: String,
    },
}

/// A descriptor, ticket or job id that does not follow the contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Only path descriptors are used.
    #[error("expected a PATH flight descriptor, got a CMD descriptor")]
    NotAPath,
    /// Wrong number of segments or unknown resource.
    #[error(
        "unknown flight path {0:?}: expected [job_id, train|eval|predict|model|checkpoint] or [job_id, train|eval, producer]"
    )]
    UnknownPath(Vec<String>),
    /// The job id has characters outside `[A-Za-z0-9._-]`, does not start
    /// with a letter or digit (`.`, `..` and hidden names are refused before
    /// any path is built from them), or has a bad length.
    #[error(
        "invalid job id {0:?}: use 1 to 128 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"
    )]
    InvalidJobId(String),
    /// A producer name outside the job id's alphabet (it is a path segment).
    #[error(
        "invalid producer {0:?}: use 1 to 128 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"
    )]
    InvalidProducer(String),
    /// A ticket that is not UTF-8.
    #[error("ticket is not UTF-8")]
    TicketNotUtf8,
}

/// Checks a job id: 1..=128 characters of `[A-Za-z0-9._-]`.
///
/// ```
/// assert!(kindling_schemas::descriptor::check_job_id("digits-2026.1").is_ok());
/// assert!(kindling_schemas::descriptor::check_job_id("a/b").is_err());
/// assert!(kindling_schemas::descriptor::check_job_id("..").is_err());
/// ```
pub fn check_job_id(job_id: &str) -> Result<(), PathError> {
    let ok = job_id.len() <= 128
        && job_id.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && job_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(PathError::InvalidJobId(job_id.to_owned()))
    }
}

impl DataPath {
    /// Training or eval data of a job.
    pub fn data(job_id: impl Into<String>, split: Split) -> Self {
        DataPath::Data {
            job_id: job_id.into(),
            split,
        }
    }

    /// The job the path belongs to.
    pub fn job_id(&self) -> &str {
        match self {
            DataPath::Data { job_id, .. }
            | DataPath::Predict { job_id }
            | DataPath::Model { job_id }
            | DataPath::Checkpoint { job_id }
            | DataPath::Rows { job_id, .. } => job_id,
        }
    }

    /// The path segments.
    pub fn segments(&self) -> Vec<String> {
        let kind = match self {
            DataPath::Data { split, .. } => split.as_str(),
            DataPath::Predict { .. } => "predict",
            DataPath::Model { .. } => "model",
            DataPath::Checkpoint { .. } => "checkpoint",
            DataPath::Rows {
                job_id,
                split,
                producer,
            } => {
                return vec![job_id.clone(), split.as_str().to_owned(), producer.clone()];
            }
        };
        vec![self.job_id().to_owned(), kind.to_owned()]
    }

    /// The Flight path descriptor.
    ///
    /// ```
    /// use kindling_schemas::descriptor::{DataPath, Split};
    /// let d = DataPath::data("job1", Split::Train).descriptor();
    /// assert_eq!(d.path, vec!["job1".to_string(), "train".to_string()]);
    /// assert_eq!(DataPath::from_descriptor(&d).unwrap(), DataPath::data("job1", Split::Train));
    /// ```
    pub fn descriptor(&self) -> FlightDescriptor {
        FlightDescriptor::new_path(self.segments())
    }

    /// The ticket (`job_id/kind`).
    pub fn ticket(&self) -> Ticket {
        Ticket::new(self.segments().join("/"))
    }

    /// Parses path segments.
    pub fn from_segments(segments: &[String]) -> Result<Self, PathError> {
        if let [job_id, split, producer] = segments {
            let split = match split.as_str() {
                "train" => Split::Train,
                "eval" => Split::Eval,
                _ => return Err(PathError::UnknownPath(segments.to_vec())),
            };
            check_job_id(job_id)?;
            check_job_id(producer).map_err(|_| PathError::InvalidProducer(producer.clone()))?;
            return Ok(DataPath::Rows {
                job_id: job_id.clone(),
                split,
                producer: producer.clone(),
            });
        }
        let [job_id, kind] = segments else {
            return Err(PathError::UnknownPath(segments.to_vec()));
        };
        check_job_id(job_id)?;
        let job_id = job_id.clone();
        Ok(match kind.as_str() {
            "train" => DataPath::Data {
                job_id,
                split: Split::Train,
            },
            "eval" => DataPath::Data {
                job_id,
                split: Split::Eval,
            },
            "predict" => DataPath::Predict { job_id },
            "model" => DataPath::Model { job_id },
            "checkpoint" => DataPath::Checkpoint { job_id },
            _ => return Err(PathError::UnknownPath(segments.to_vec())),
        })
    }

    /// Parses a Flight descriptor.
    pub fn from_descriptor(descriptor: &FlightDescriptor) -> Result<Self, PathError> {
        if descriptor.r#type != DescriptorType::Path as i32 {
            return Err(PathError::NotAPath);
        }
        Self::from_segments(&descriptor.path)
    }

    /// Parses a ticket.
    pub fn from_ticket(ticket: &Ticket) -> Result<Self, PathError> {
        let s = std::str::from_utf8(&ticket.ticket).map_err(|_| PathError::TicketNotUtf8)?;
        let segments: Vec<String> = s.split('/').map(str::to_owned).collect();
        Self::from_segments(&segments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_round_trips_through_descriptor_and_ticket() {
        let paths = [
            DataPath::data("j", Split::Train),
            DataPath::data("j", Split::Eval),
            DataPath::Predict { job_id: "j-2".into() },
            DataPath::Model { job_id: "j.3".into() },
            DataPath::Checkpoint { job_id: "J_4".into() },
            DataPath::Rows {
                job_id: "j".into(),
                split: Split::Eval,
                producer: "partition-17".into(),
            },
        ];
        for p in paths {
            assert_eq!(DataPath::from_descriptor(&p.descriptor()), Ok(p.clone()));
            assert_eq!(DataPath::from_ticket(&p.ticket()), Ok(p.clone()));
        }
    }

    #[test]
    fn malformed_paths_are_refused() {
        let cmd = FlightDescriptor::new_cmd("x");
        assert_eq!(DataPath::from_descriptor(&cmd), Err(PathError::NotAPath));
        for bad in [
            vec!["j"],
            vec!["j", "weights"],
            vec!["j", "model", "x"],
            vec!["j", "train", "x", "y"],
        ] {
            let d = FlightDescriptor::new_path(bad.iter().map(|s| s.to_string()).collect());
            assert!(matches!(
                DataPath::from_descriptor(&d),
                Err(PathError::UnknownPath(_))
            ));
        }
        // Ids that would name another directory, or none, once joined into
        // the spill and checkpoint paths, are refused with the rest.
        for job in [
            "a b",
            ".",
            "..",
            ".hidden",
            "-x",
            "_x",
            "a/b",
            "",
            &"x".repeat(129),
        ] {
            let d = FlightDescriptor::new_path(vec![job.to_owned(), "train".into()]);
            assert!(
                matches!(DataPath::from_descriptor(&d), Err(PathError::InvalidJobId(_))),
                "{job:?}"
            );
        }
        for job in ["j", "J9", "digits-2026.1", "a_b", &"x".repeat(128)] {
            assert!(check_job_id(job).is_ok(), "{job:?}");
        }
        for producer in ["", "..", "a b", "-x"] {
            let d = FlightDescriptor::new_path(vec!["j".into(), "train".into(), producer.to_owned()]);
            assert_eq!(
                DataPath::from_descriptor(&d),
                Err(PathError::InvalidProducer(producer.to_owned()))
            );
        }
        assert_eq!(
            DataPath::from_ticket(&Ticket::new(vec![0xff, 0xfe])),
            Err(PathError::TicketNotUtf8)
        );
    }
}
