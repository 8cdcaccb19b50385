//! Pretrained weights in (`init_from`): the spec records the file (its path,
//! format and SHA-256) when the job is built; when it runs, the file is
//! checked against the model the job builds — every tensor by name, shape
//! and dtype — before anything starts on the agents, and its weights travel
//! to them as a weights table in `start_job`.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use kindling_schemas::schema::FeatureLayout;
use kindling_schemas::spec::JobSpec;
#[cfg(feature = "local")]
use kindling_schemas::spec::Pretrained;
use sha2::{Digest, Sha256};

use super::{JobError, TrainingJob};

/// The SHA-256 of the file at `path`, lower-case hex (read in pieces).
fn sha256(path: &Path) -> Result<String, JobError> {
    let io = |e| JobError::Io {
        context: format!("init_from: read {}", path.display()),
        source: e,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// `spec` recording that its initial weights come from the file at `path`.
pub(super) fn recorded(spec: JobSpec, path: &Path) -> Result<JobSpec, JobError> {
    #[cfg(not(feature = "local"))]
    {
        let _ = (spec, path);
        Err(JobError::Setting {
            setting: "init_from",
            reason: "this build of kindling cannot read weights files (the `local` feature is off)".into(),
        })
    }
    #[cfg(feature = "local")]
    {
        kindling_agent::models::interchange::check_format(path)?;
        // Recorded whole, so the record names the file wherever it is read.
        let path = &std::fs::canonicalize(path).map_err(|e| JobError::Io {
            context: format!("init_from: {}", path.display()),
            source: e,
        })?;
        let spec = JobSpec {
            init_from: Some(Pretrained {
                file: path.display().to_string(),
                format: "safetensors".into(),
                sha256: sha256(path)?,
            }),
            ..spec
        };
        spec.validate()?;
        Ok(spec)
    }
}

impl TrainingJob {
    /// The weights the job starts from, as `start_job` carries them: the
    /// `init_from` file loaded into the model the spec builds for `layout`
    /// (refused, naming the tensor, unless every one fits); `None` without
    /// `init_from`.
    pub(super) fn initial_weights(&self, layout: &FeatureLayout) -> Result<Option<Arc<str>>, JobError> {
        let Some(pretrained) = &self.spec.init_from else {
            return Ok(None);
        };
        let path = Path::new(&pretrained.file);
        let now = sha256(path)?;
        if now != pretrained.sha256 {
            return Err(JobError::InitFromChanged {
                file: pretrained.file.clone(),
                now,
                recorded: pretrained.sha256.clone(),
            });
        }
        #[cfg(feature = "local")]
        {
            let net = super::trained::empty_net(&self.placement.models, &self.spec, layout)?
                .load_safetensors(path)?;
            let table = net.to_arrow()?;
            Ok(Some(Arc::from(kindling_schemas::model_serving::encode_weights(
                &table,
            )?)))
        }
        #[cfg(not(feature = "local"))]
        {
            let _ = layout;
            Err(JobError::Setting {
                setting: "init_from",
                reason: "this build of kindling cannot read weights files (the `local` feature is off)"
                    .into(),
            })
        }
    }
}
