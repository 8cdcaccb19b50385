//! What a job spec says about *how* it steps: the optimizer and its weight
//! decay ([`OptimizerSpec`]) and parameter groups ([`path_matches`]),
//! gradient clipping ([`GradientClip`]), and the checks of every training
//! option against the job ([`check`], naming the offending field); the
//! schedule and early stopping are in `schedule`.

use serde::{Deserialize, Serialize};

use super::SpecError;

/// The optimizer and its hyper-parameters. Every rule steps all ranks'
/// replicas identically; each is burn 0.22's update rule, operation for
/// operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OptimizerSpec {
    /// Stochastic gradient descent, with optional (Nesterov) momentum and
    /// L2 weight decay added to the gradient (`torch.optim.SGD`).
    Sgd {
        /// Step size.
        learning_rate: f64,
        /// Momentum (0 disables), without dampening.
        #[serde(default)]
        momentum: f64,
        /// Nesterov momentum (needs `momentum > 0`).
        #[serde(default, skip_serializing_if = "is_false")]
        nesterov: bool,
        /// L2 penalty added to the gradient: `g + weight_decay · w`.
        #[serde(default, skip_serializing_if = "is_zero")]
        weight_decay: f64,
    },
    /// Adam (burn's form: ε inside the bias correction), with optional L2
    /// weight decay added to the gradient (`torch.optim.Adam`).
    Adam {
        /// Step size.
        learning_rate: f64,
        /// β₁.
        #[serde(default = "default_beta1")]
        beta1: f32,
        /// β₂.
        #[serde(default = "default_beta2")]
        beta2: f32,
        /// ε (burn's default 1e-5).
        #[serde(default = "default_epsilon", skip_serializing_if = "is_default_epsilon")]
        epsilon: f32,
        /// L2 penalty added to the gradient: `g + weight_decay · w`.
        #[serde(default, skip_serializing_if = "is_zero")]
        weight_decay: f64,
    },
    /// AdamW: Adam with weight decay decoupled from the gradient,
    /// `w ← w · (1 − lr · weight_decay) − lr · update` (Loshchilov & Hutter;
    /// `torch.optim.AdamW`, Keras' `AdamW`).
    #[serde(rename = "adamw")]
    AdamW {
        /// Step size.
        learning_rate: f64,
        /// β₁.
        #[serde(default = "default_beta1")]
        beta1: f32,
        /// β₂.
        #[serde(default = "default_beta2")]
        beta2: f32,
        /// ε (burn's default 1e-5).
        #[serde(default = "default_epsilon", skip_serializing_if = "is_default_epsilon")]
        epsilon: f32,
        /// Decoupled weight decay (default 0.01, as PyTorch's).
        #[serde(default = "default_adamw_decay")]
        weight_decay: f64,
    },
    /// RMSprop (`torch.optim.RMSprop`), optionally centered and with
    /// momentum; L2 weight decay added to the gradient.
    #[serde(rename = "rmsprop")]
    RmsProp {
        /// Step size.
        learning_rate: f64,
        /// Smoothing constant of the squared-gradient average.
        #[serde(default = "default_alpha")]
        alpha: f32,
        /// ε added to the root (burn's default 1e-5).
        #[serde(default = "default_epsilon", skip_serializing_if = "is_default_epsilon")]
        epsilon: f32,
        /// Momentum (0 disables).
        #[serde(default, skip_serializing_if = "is_zero32")]
        momentum: f32,
        /// Normalise by the variance estimate instead of the second moment.
        #[serde(default, skip_serializing_if = "is_false")]
        centered: bool,
        /// L2 penalty added to the gradient: `g + weight_decay · w`.
        #[serde(default, skip_serializing_if = "is_zero")]
        weight_decay: f64,
    },
}

fn default_beta1() -> f32 {
    0.9
}
fn default_beta2() -> f32 {
    0.999
}
fn default_epsilon() -> f32 {
    1e-5
}
fn is_default_epsilon(e: &f32) -> bool {
    *e == default_epsilon()
}
fn default_adamw_decay() -> f64 {
    0.01
}
fn default_alpha() -> f32 {
    0.99
}
fn is_false(b: &bool) -> bool {
    !*b
}
fn is_zero(x: &f64) -> bool {
    *x == 0.0
}
fn is_zero32(x: &f32) -> bool {
    *x == 0.0
}

impl OptimizerSpec {
    /// Adam with the usual betas.
    pub fn adam(learning_rate: f64) -> Self {
        OptimizerSpec::Adam {
            learning_rate,
            beta1: default_beta1(),
            beta2: default_beta2(),
            epsilon: default_epsilon(),
            weight_decay: 0.0,
        }
    }

    /// AdamW with the usual betas and `weight_decay`.
    pub fn adamw(learning_rate: f64, weight_decay: f64) -> Self {
        OptimizerSpec::AdamW {
            learning_rate,
            beta1: default_beta1(),
            beta2: default_beta2(),
            epsilon: default_epsilon(),
            weight_decay,
        }
    }

    /// Plain SGD.
    pub fn sgd(learning_rate: f64) -> Self {
        Self::sgd_momentum(learning_rate, 0.0)
    }

    /// SGD with (heavy-ball) momentum.
    pub fn sgd_momentum(learning_rate: f64, momentum: f64) -> Self {
        OptimizerSpec::Sgd {
            learning_rate,
            momentum,
            nesterov: false,
            weight_decay: 0.0,
        }
    }

    /// RMSprop with burn's defaults (α 0.99, no momentum, not centered).
    pub fn rmsprop(learning_rate: f64) -> Self {
        OptimizerSpec::RmsProp {
            learning_rate,
            alpha: default_alpha(),
            epsilon: default_epsilon(),
            momentum: 0.0,
            centered: false,
            weight_decay: 0.0,
        }
    }

    /// The same optimizer with `momentum` (SGD and RMSprop; the others
    /// have none and are returned as they are).
    pub fn with_momentum(mut self, value: f64) -> Self {
        match &mut self {
            OptimizerSpec::Sgd { momentum, .. } => *momentum = value,
            OptimizerSpec::RmsProp { momentum, .. } => *momentum = value as f32,
            OptimizerSpec::Adam { .. } | OptimizerSpec::AdamW { .. } => {}
        }
        self
    }

    /// The same optimizer with `weight_decay` (decoupled for AdamW, an L2
    /// term on the gradient for the others).
    pub fn with_weight_decay(mut self, decay: f64) -> Self {
        match &mut self {
            OptimizerSpec::Sgd { weight_decay, .. }
            | OptimizerSpec::Adam { weight_decay, .. }
            | OptimizerSpec::AdamW { weight_decay, .. }
            | OptimizerSpec::RmsProp { weight_decay, .. } => *weight_decay = decay,
        }
        self
    }

    /// The base learning rate (a schedule scales it per step).
    pub fn learning_rate(&self) -> f64 {
        match self {
            OptimizerSpec::Sgd { learning_rate, .. }
            | OptimizerSpec::Adam { learning_rate, .. }
            | OptimizerSpec::AdamW { learning_rate, .. }
            | OptimizerSpec::RmsProp { learning_rate, .. } => *learning_rate,
        }
    }

    /// The weight decay (0: none).
    pub fn weight_decay(&self) -> f64 {
        match self {
            OptimizerSpec::Sgd { weight_decay, .. }
            | OptimizerSpec::Adam { weight_decay, .. }
            | OptimizerSpec::AdamW { weight_decay, .. }
            | OptimizerSpec::RmsProp { weight_decay, .. } => *weight_decay,
        }
    }

    /// The rule's name as the CLI and the docs write it.
    pub fn name(&self) -> &'static str {
        match self {
            OptimizerSpec::Sgd { .. } => "sgd",
            OptimizerSpec::Adam { .. } => "adam",
            OptimizerSpec::AdamW { .. } => "adamw",
            OptimizerSpec::RmsProp { .. } => "rmsprop",
        }
    }

    fn check(&self) -> Result<(), SpecError> {
        let lr = self.learning_rate();
        if !(lr.is_finite() && lr > 0.0) {
            return Err(SpecError::new(
                "optimizer.learning_rate",
                "must be a finite number > 0",
            ));
        }
        let decay = self.weight_decay();
        if !(decay.is_finite() && decay >= 0.0) {
            return Err(SpecError::new(
                "optimizer.weight_decay",
                format!("must be a finite number ≥ 0, got {decay}"),
            ));
        }
        let unit = |field: &str, x: f64| match (0.0..1.0).contains(&x) {
            true => Ok(()),
            false => Err(SpecError::new(
                format!("optimizer.{field}"),
                format!("must be in [0, 1), got {x}"),
            )),
        };
        let positive = |field: &str, x: f32| match x.is_finite() && x > 0.0 {
            true => Ok(()),
            false => Err(SpecError::new(
                format!("optimizer.{field}"),
                format!("must be a finite number > 0, got {x}"),
            )),
        };
        match *self {
            OptimizerSpec::Sgd {
                momentum, nesterov, ..
            } => {
                unit("momentum", momentum)?;
                if nesterov && momentum == 0.0 {
                    return Err(SpecError::new(
                        "optimizer.nesterov",
                        "Nesterov momentum needs momentum > 0",
                    ));
                }
            }
            OptimizerSpec::Adam {
                beta1,
                beta2,
                epsilon,
                ..
            }
            | OptimizerSpec::AdamW {
                beta1,
                beta2,
                epsilon,
                ..
            } => {
                unit("beta1", beta1 as f64)?;
                unit("beta2", beta2 as f64)?;
                positive("epsilon", epsilon)?;
            }
            OptimizerSpec::RmsProp {
                alpha,
                epsilon,
                momentum,
                ..
            } => {
                unit("momentum", momentum as f64)?;
                positive("epsilon", epsilon)?;
                if !(alpha > 0.0 && alpha < 1.0) {
                    return Err(SpecError::new(
                        "optimizer.alpha",
                        format!("must be in (0, 1), got {alpha}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Gradient clipping, on the all-reduced mean gradient (so the same on
/// every rank), before the optimizer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GradientClip {
    /// Scales the whole gradient down when its global L2 norm passes
    /// `max_norm` (`clip_grad_norm_`, Keras' `global_clipnorm`).
    Norm {
        /// The largest norm let through.
        max_norm: f64,
    },
    /// Clamps every gradient value into `[-max_value, max_value]`
    /// (`clip_grad_value_`, Keras' `clipvalue`).
    Value {
        /// The largest magnitude let through.
        max_value: f64,
    },
}

impl GradientClip {
    fn check(&self) -> Result<(), SpecError> {
        let (field, x) = match *self {
            GradientClip::Norm { max_norm } => ("clip.max_norm", max_norm),
            GradientClip::Value { max_value } => ("clip.max_value", max_value),
        };
        match x.is_finite() && x > 0.0 {
            true => Ok(()),
            false => Err(SpecError::new(
                field,
                format!("must be a finite number > 0, got {x}"),
            )),
        }
    }
}

/// Most parameter-path patterns a job may exempt from weight decay.
pub const MAX_NO_DECAY: usize = 64;

/// Checks the training options of a spec against its task and length.
pub(crate) fn check(spec: &super::JobSpec) -> Result<(), SpecError> {
    spec.optimizer.check()?;
    if spec.no_weight_decay.len() > MAX_NO_DECAY {
        return Err(SpecError::new(
            "no_weight_decay",
            format!("at most {MAX_NO_DECAY} patterns"),
        ));
    }
    for (i, p) in spec.no_weight_decay.iter().enumerate() {
        if p.trim().is_empty() || p.len() > 256 {
            return Err(SpecError::new(
                format!("no_weight_decay[{i}]"),
                "must be a parameter path pattern of 1 to 256 characters",
            ));
        }
    }
    if !spec.no_weight_decay.is_empty() && spec.optimizer.weight_decay() == 0.0 {
        return Err(SpecError::new(
            "no_weight_decay",
            format!(
                "the {} optimizer has no weight decay to exempt parameters from",
                spec.optimizer.name()
            ),
        ));
    }
    spec.schedule.check(spec.epochs, spec.task, spec.top_k)?;
    if let Some(clip) = &spec.clip {
        clip.check()?;
    }
    if !(1..=MAX_ACCUMULATE).contains(&spec.accumulate) {
        return Err(SpecError::new(
            "accumulate",
            format!("must be in 1..={MAX_ACCUMULATE}"),
        ));
    }
    if let Some(stop) = &spec.early_stopping {
        stop.check(spec.task, spec.top_k)?;
    }
    check_weights(spec)
}

/// Most classes a job may give class weights for (the spec's own bound).
const MAX_CLASS_WEIGHTS: usize = 1 << 20;

fn check_weights(spec: &super::JobSpec) -> Result<(), SpecError> {
    use super::Task;
    if let Some(weights) = &spec.class_weights {
        let Task::Classification { num_classes } = spec.task else {
            return Err(SpecError::new(
                "class_weights",
                "class weights need a classification task; weight a regression job's rows with `sample_weight`",
            ));
        };
        if weights.len() != num_classes || weights.len() > MAX_CLASS_WEIGHTS {
            return Err(SpecError::new(
                "class_weights",
                format!("needs one weight per class: {num_classes}, got {}", weights.len()),
            ));
        }
        if let Some((i, w)) = weights
            .iter()
            .enumerate()
            .find(|(_, w)| !(w.is_finite() && **w > 0.0))
        {
            return Err(SpecError::new(
                format!("class_weights[{i}]"),
                format!("must be a finite number > 0, got {w}"),
            ));
        }
    }
    if let Some(column) = &spec.sample_weight {
        if column.trim().is_empty() {
            return Err(SpecError::new("sample_weight", "empty column name"));
        }
        if *column == spec.label || spec.features.contains(column) {
            return Err(SpecError::new(
                "sample_weight",
                format!("`{column}` is also a feature or the label"),
            ));
        }
    }
    if spec.top_k == 0 {
        return Err(SpecError::new("top_k", "must be at least 1"));
    }
    Ok(())
}

/// A job spec in one readable line, for status pages and logs: model,
/// task, optimizer and its options, length.
pub(crate) fn summary(spec: &super::JobSpec) -> String {
    use super::{ModelSpec, Task};

    if spec.kind() == super::JobKind::Dataset {
        return format!(
            "a dataset: holds its rows ({} and `{}`) on {} slot(s) for the jobs that read them",
            spec.features.join(", "),
            spec.label,
            spec.num_slots
        );
    }

    let model = match &spec.model {
        ModelSpec::Linear => "linear".to_owned(),
        ModelSpec::Mlp { hidden } => format!("mlp {hidden:?}"),
        ModelSpec::Cnn { conv, dense, .. } => format!("cnn conv {conv:?} dense {dense}"),
        ModelSpec::Custom { name, .. } => name.clone(),
    };
    let task = match spec.task {
        Task::Classification { num_classes } => format!("{num_classes}-class"),
        Task::Regression => "regression".to_owned(),
    };
    let o = &spec.optimizer;
    let mut parts = vec![
        format!("{model}, {task}"),
        format!("{} lr {}", o.name(), o.learning_rate()),
    ];
    if o.weight_decay() > 0.0 {
        let exempt = match spec.no_weight_decay.is_empty() {
            true => String::new(),
            false => format!(" (not {})", spec.no_weight_decay.join(", ")),
        };
        parts.push(format!("weight decay {}{exempt}", o.weight_decay()));
    }
    if !spec.schedule.is_constant() {
        let warmup = spec.schedule.warmup_epochs();
        match warmup > 0.0 {
            true => parts.push(format!("{} after {warmup} warmup epochs", spec.schedule.name())),
            false => parts.push(format!("{} schedule", spec.schedule.name())),
        }
    }
    match spec.clip {
        Some(GradientClip::Norm { max_norm }) => parts.push(format!("clip norm {max_norm}")),
        Some(GradientClip::Value { max_value }) => parts.push(format!("clip value {max_value}")),
        None => {}
    }
    let accumulate = match spec.accumulate {
        1 => String::new(),
        k => format!(" × {k} accumulated"),
    };
    parts.push(format!(
        "{} epochs of batch {}{accumulate} on {} slot(s)",
        spec.epochs, spec.batch_size, spec.num_slots
    ));
    if let Some(column) = &spec.sample_weight {
        parts.push(format!("rows weighted by `{column}`"));
    }
    if spec.class_weights.is_some() {
        parts.push("class weights".to_owned());
    }
    if let Some(stop) = &spec.early_stopping {
        parts.push(format!(
            "early stopping on {} (patience {})",
            stop.monitor.name(),
            stop.patience
        ));
    }
    if let super::JobKind::Trial { dataset } = spec.kind() {
        parts.push(format!("on the rows of dataset `{dataset}`"));
    }
    parts.join(" · ")
}

/// Most micro-batches a step may accumulate.
pub const MAX_ACCUMULATE: u32 = 1024;

/// Whether parameter `path` (module names joined by `.`, e.g.
/// `hidden.0.bias`) matches `pattern`: a glob over the whole path (`*`
/// any run of characters), or, without a `*`, one of the path's segments
/// or a run of them (`bias`, `norm.gamma`).
pub fn path_matches(pattern: &str, path: &str) -> bool {
    if pattern.contains('*') {
        return glob(pattern.as_bytes(), path.as_bytes());
    }
    let segments: Vec<&str> = path.split('.').collect();
    let wanted: Vec<&str> = pattern.split('.').collect();
    segments.windows(wanted.len()).any(|w| w == wanted.as_slice())
}

/// `*`-only glob matching, iterative with one backtrack point.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Schedule;

    #[test]
    fn patterns_match_segments_or_globs() {
        assert!(path_matches("bias", "hidden.0.bias"));
        assert!(!path_matches("bias", "hidden.0.biases"));
        assert!(path_matches("norm.gamma", "block.norm.gamma"));
        assert!(!path_matches("norm.gamma", "block.norm.beta"));
        assert!(path_matches("*norm*", "block.layer_norm.gamma"));
        assert!(path_matches("embed*", "embedding.weight"));
        assert!(!path_matches("embed*", "wide.embedding.weight"));
        assert!(path_matches("*.weight", "wide.embedding.weight"));
        assert!(!path_matches("*.weight", "output.bias"));
    }

    #[test]
    fn serde_names_are_the_documented_ones() {
        let json = serde_json::to_value(OptimizerSpec::adamw(1e-3, 0.05)).expect("json");
        assert_eq!(json["kind"], "adamw");
        let json = serde_json::to_value(OptimizerSpec::rmsprop(1e-3)).expect("json");
        assert_eq!(json["kind"], "rmsprop");
        let s: Schedule = serde_json::from_str(r#"{"kind":"cosine","warmup_epochs":1}"#).expect("cosine");
        assert_eq!(
            s,
            Schedule::Cosine {
                warmup_epochs: 1.0,
                min_factor: 0.0
            }
        );
        let s: Schedule = serde_json::from_str(r#"{"kind":"one_cycle"}"#).expect("one cycle");
        assert!(matches!(s, Schedule::OneCycle { pct_start, .. } if pct_start == 0.3));
        // A spec written before these options parses as before.
        let old: OptimizerSpec =
            serde_json::from_str(r#"{"kind":"sgd","learning_rate":0.1,"momentum":0.9}"#).expect("old sgd");
        assert_eq!(old, OptimizerSpec::sgd_momentum(0.1, 0.9));
    }
}
