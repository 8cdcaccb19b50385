//! A search space over a job's options: each dimension names an option —
//! an alias (`lr`, `optimizer`, `hidden`, …) or a dotted path into the job
//! spec's JSON (`batch_size`, `optimizer.beta1`, `model.config.width`) —
//! and its values: a list (`32|64|128`), a uniform range (`0.1..0.5`,
//! `int:1..8`) or a log-uniform one (`log:1e-4..1e-1`). A space of lists
//! alone is a grid; with a trial count, trials are drawn at random from a
//! seeded generator (the same seed draws the same trials).

use std::collections::BTreeMap;

use kindling_schemas::spec::JobSpec;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::Value;

use crate::job::JobError;

/// Short names for the options searched most, and the spec paths they set.
pub const ALIASES: &[(&str, &str)] = &[
    ("lr", "optimizer.learning_rate"),
    ("learning_rate", "optimizer.learning_rate"),
    ("optimizer", "optimizer.kind"),
    ("weight_decay", "optimizer.weight_decay"),
    ("momentum", "optimizer.momentum"),
    ("hidden", "model.hidden"),
    ("schedule", "schedule.kind"),
    ("warmup_epochs", "schedule.warmup_epochs"),
];

/// Options a search may not vary: they fix the dataset the trials share,
/// or the world the trials train in.
const FIXED: &[&str] = &[
    "features",
    "label",
    "inputs",
    "sample_weight",
    "targets",
    "num_slots",
    "task",
    "rows_from",
    "holds_rows",
    "eval_split",
    "use_gpu",
];

/// The values of one dimension.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// One of these (a grid takes every one).
    Choice(Vec<Value>),
    /// A float drawn uniformly from `[low, high)`.
    Uniform { low: f64, high: f64 },
    /// A float whose logarithm is uniform in `[ln low, ln high)`.
    LogUniform { low: f64, high: f64 },
    /// An integer drawn uniformly from `low..=high`.
    IntUniform { low: i64, high: i64 },
}

/// One option searched and its values.
#[derive(Debug, Clone, PartialEq)]
pub struct Dimension {
    /// As the user wrote it (`lr`, `model.hidden`).
    pub name: String,
    /// The spec path it sets.
    pub path: String,
    /// Its values.
    pub values: Values,
}

/// The options a search varies. Build with [`choice`](Self::choice),
/// [`uniform`](Self::uniform), [`log_uniform`](Self::log_uniform),
/// [`int_uniform`](Self::int_uniform), or parse `kindling tune`'s
/// `name=values` forms with [`parse`](Self::parse).
///
/// ```
/// use kindling::job::SearchSpace;
/// let space = SearchSpace::new()
///     .log_uniform("lr", 1e-4, 1e-1)
///     .choice("batch_size", [32, 64, 128])
///     .choice("hidden", [serde_json::json!([64]), serde_json::json!([128, 64])]);
/// assert_eq!(space.dimensions().len(), 3);
/// let parsed = SearchSpace::parse(["lr=log:1e-4..1e-1", "batch_size=32|64|128"]).unwrap();
/// assert_eq!(parsed.dimensions()[1].values, kindling::job::SpaceValues::Choice(vec![32.into(), 64.into(), 128.into()]));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SearchSpace {
    dims: Vec<Dimension>,
}

fn bad(reason: impl Into<String>) -> JobError {
    JobError::Setting {
        setting: "search space",
        reason: reason.into(),
    }
}

impl SearchSpace {
    /// An empty space.
    pub fn new() -> Self {
        SearchSpace::default()
    }

    fn with(mut self, name: &str, values: Values) -> Self {
        let path = ALIASES
            .iter()
            .find(|(alias, _)| *alias == name)
            .map_or(name, |(_, path)| path)
            .to_owned();
        self.dims.push(Dimension {
            name: name.to_owned(),
            path,
            values,
        });
        self
    }

    /// `name` takes each of `values` (JSON values: numbers, strings, lists).
    pub fn choice<V: Into<Value>>(self, name: &str, values: impl IntoIterator<Item = V>) -> Self {
        self.with(name, Values::Choice(values.into_iter().map(Into::into).collect()))
    }

    /// `name` drawn uniformly from `[low, high)`.
    pub fn uniform(self, name: &str, low: f64, high: f64) -> Self {
        self.with(name, Values::Uniform { low, high })
    }

    /// `name` drawn log-uniformly from `[low, high)` (learning rates, decays).
    pub fn log_uniform(self, name: &str, low: f64, high: f64) -> Self {
        self.with(name, Values::LogUniform { low, high })
    }

    /// `name` an integer drawn uniformly from `low..=high`.
    pub fn int_uniform(self, name: &str, low: i64, high: i64) -> Self {
        self.with(name, Values::IntUniform { low, high })
    }

    /// The dimensions, in the order given.
    pub fn dimensions(&self) -> &[Dimension] {
        &self.dims
    }

    /// Parses `name=values` forms: `a|b|c` (a list; each value JSON, else a
    /// string), `low..high` (uniform), `log:low..high` (log-uniform),
    /// `int:low..high` (integers, both ends included).
    pub fn parse<'a>(forms: impl IntoIterator<Item = &'a str>) -> Result<Self, JobError> {
        let mut space = SearchSpace::new();
        for form in forms {
            let (name, values) = form.split_once('=').ok_or_else(|| {
                bad(format!(
                    "`{form}`: expected `name=values`, e.g. `lr=log:1e-4..1e-1`"
                ))
            })?;
            let (name, values) = (name.trim(), values.trim());
            let number = |s: &str| {
                s.trim()
                    .parse::<f64>()
                    .map_err(|_| bad(format!("`{form}`: `{s}` is not a number")))
            };
            let range = |s: &str| -> Result<(f64, f64), JobError> {
                let (lo, hi) = s
                    .split_once("..")
                    .ok_or_else(|| bad(format!("`{form}`: expected `low..high`")))?;
                Ok((number(lo)?, number(hi)?))
            };
            let parsed = if let Some(r) = values.strip_prefix("log:") {
                let (low, high) = range(r)?;
                Values::LogUniform { low, high }
            } else if let Some(r) = values.strip_prefix("int:") {
                let (low, high) = range(r)?;
                if low.fract() != 0.0 || high.fract() != 0.0 {
                    return Err(bad(format!("`{form}`: integer bounds expected")));
                }
                Values::IntUniform {
                    low: low as i64,
                    high: high as i64,
                }
            } else if values.contains("..") && !values.contains('|') && !values.starts_with('[') {
                let (low, high) = range(values)?;
                Values::Uniform { low, high }
            } else {
                let items = values
                    .split('|')
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(|v| serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_owned())))
                    .collect();
                Values::Choice(items)
            };
            space = space.with(name, parsed);
        }
        Ok(space)
    }

    /// Checks every dimension on its own: a name, values, a range that is
    /// not empty; no option twice, none the trials must share.
    pub fn check(&self) -> Result<(), JobError> {
        if self.dims.is_empty() {
            return Err(bad("no option to search: give at least one"));
        }
        for (i, d) in self.dims.iter().enumerate() {
            let what = &d.name;
            if d.name.is_empty() || d.path.split('.').any(str::is_empty) {
                return Err(bad(format!("`{what}`: not an option name")));
            }
            if self.dims[..i].iter().any(|e| e.path == d.path) {
                return Err(bad(format!("`{what}` is searched twice (it sets `{}`)", d.path)));
            }
            let top = d.path.split('.').next().unwrap_or_default();
            if FIXED.contains(&top) {
                return Err(bad(format!(
                    "`{what}` cannot vary in a search: the trials share one dataset and world"
                )));
            }
            let empty = match &d.values {
                Values::Choice(v) => v.is_empty(),
                Values::Uniform { low, high } => {
                    low.partial_cmp(high) != Some(std::cmp::Ordering::Less)
                        || !low.is_finite()
                        || !high.is_finite()
                }
                Values::LogUniform { low, high } => {
                    low.partial_cmp(high) != Some(std::cmp::Ordering::Less)
                        || *low <= 0.0
                        || !high.is_finite()
                }
                Values::IntUniform { low, high } => low > high,
            };
            if empty {
                let hint = match &d.values {
                    Values::LogUniform { .. } => " (log-uniform needs 0 < low < high)",
                    Values::Choice(_) => " (no value listed)",
                    _ => " (low must be below high)",
                };
                return Err(bad(format!("`{what}`: an empty range{hint}")));
            }
        }
        Ok(())
    }

    /// Trials in a grid (every combination of lists, the first option
    /// varying slowest), or `count` drawn at random with `seed`.
    pub fn trials(&self, count: Option<usize>, seed: u64) -> Result<Vec<BTreeMap<String, Value>>, JobError> {
        self.check()?;
        let Some(count) = count else {
            let mut grid = vec![BTreeMap::new()];
            for d in &self.dims {
                let Values::Choice(values) = &d.values else {
                    return Err(bad(format!(
                        "`{}` is a range: give a number of trials to draw, or list its values",
                        d.name
                    )));
                };
                grid = grid
                    .into_iter()
                    .flat_map(|t| {
                        values.iter().map(move |v| {
                            let mut t = t.clone();
                            t.insert(d.name.clone(), v.clone());
                            t
                        })
                    })
                    .collect();
            }
            return Ok(grid);
        };
        if count == 0 {
            return Err(bad("0 trials: give at least one"));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        Ok((0..count)
            .map(|_| {
                self.dims
                    .iter()
                    .map(|d| (d.name.clone(), draw(&d.values, &mut rng)))
                    .collect()
            })
            .collect())
    }

    /// `base` with a trial's options set, validated; the error names the
    /// option and the value that cannot work.
    pub fn apply(&self, base: &JobSpec, options: &BTreeMap<String, Value>) -> Result<JobSpec, JobError> {
        let mut json = serde_json::to_value(base).map_err(|e| bad(e.to_string()))?;
        for d in &self.dims {
            let Some(value) = options.get(&d.name) else {
                continue;
            };
            set(&mut json, &d.path, value.clone()).map_err(|why| bad(format!("`{}`: {why}", d.name)))?;
        }
        let shown = show(options);
        let spec: JobSpec = serde_json::from_value(json)
            .map_err(|e| bad(format!("the trial {shown} makes no job spec: {e}")))?;
        spec.validate()
            .map_err(|e| bad(format!("the trial {shown}: {e}")))?;
        Ok(spec)
    }

    /// Checks that every dimension sets a field the spec has: its value is
    /// in the spec of at least one of `specs` (a misspelt option is kept by
    /// no spec).
    pub fn check_taken(&self, specs: &[(BTreeMap<String, Value>, JobSpec)]) -> Result<(), JobError> {
        for d in &self.dims {
            let taken = specs.iter().any(|(options, spec)| {
                let json = serde_json::to_value(spec).unwrap_or_default();
                let got = d.path.split('.').try_fold(&json, |v, key| v.get(key));
                match (got, options.get(&d.name)) {
                    (Some(got), Some(want)) => same(got, want),
                    _ => false,
                }
            });
            if !taken {
                return Err(bad(format!(
                    "unknown option `{}`: the job spec has no `{}` (an alias: {}; or a dotted path into the spec, e.g. `model.hidden`)",
                    d.name,
                    d.path,
                    ALIASES.iter().map(|(a, _)| *a).collect::<Vec<_>>().join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// Values equal as the spec keeps them (an `f32` field rounds).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y || ((x - y).abs() <= 1e-6 * x.abs().max(y.abs())),
        _ => a == b,
    }
}

fn draw(values: &Values, rng: &mut StdRng) -> Value {
    match values {
        Values::Choice(v) => v[rng.random_range(0..v.len())].clone(),
        Values::Uniform { low, high } => Value::from(rng.random_range(*low..*high)),
        Values::LogUniform { low, high } => Value::from(rng.random_range(low.ln()..high.ln()).exp()),
        Values::IntUniform { low, high } => Value::from(rng.random_range(*low..=*high)),
    }
}

/// Why an option's dotted path leads nowhere in the spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum PathError {
    #[error("`{path}`: the spec holds no object above `{key}`")]
    NotAnObject { path: String, key: String },
    #[error("the job spec has no `{key}` (in `{path}`): set it on the job first")]
    Missing { path: String, key: String },
}

/// Sets `path` (dotted) in `json`; every part but the last must exist.
fn set(json: &mut Value, path: &str, value: Value) -> Result<(), PathError> {
    let mut at = json;
    let mut parts = path.split('.').peekable();
    while let Some(key) = parts.next() {
        let Value::Object(map) = at else {
            return Err(PathError::NotAnObject {
                path: path.to_owned(),
                key: key.to_owned(),
            });
        };
        if parts.peek().is_none() {
            map.insert(key.to_owned(), value);
            return Ok(());
        }
        at = map.get_mut(key).ok_or_else(|| PathError::Missing {
            path: path.to_owned(),
            key: key.to_owned(),
        })?;
    }
    Ok(())
}

/// `{lr=0.01, batch_size=64}`.
pub fn show(options: &BTreeMap<String, Value>) -> String {
    let parts: Vec<String> = options.iter().map(|(k, v)| format!("{k}={}", short(v))).collect();
    format!("{{{}}}", parts.join(", "))
}

/// A value as a table shows it (floats to 4 significant digits).
pub fn short(v: &Value) -> String {
    match v {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or_default();
            format!("{x:.4e}")
                .parse::<f64>()
                .map_or_else(|_| x.to_string(), |r| format!("{r}"))
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use kindling_schemas::spec::{ModelSpec, Task};

    use super::*;

    fn base() -> JobSpec {
        JobSpec::builder()
            .model(ModelSpec::Mlp { hidden: vec![16] })
            .task(Task::Classification { num_classes: 2 })
            .features(["x"])
            .label("y")
            .epochs(4)
            .build()
            .expect("spec")
    }

    #[test]
    fn a_grid_crosses_every_list_first_option_slowest() {
        let space = SearchSpace::parse(["lr=0.1|0.01", "batch_size=32|64|128"]).expect("space");
        let trials = space.trials(None, 0).expect("grid");
        assert_eq!(trials.len(), 6);
        assert_eq!(trials[0]["lr"], serde_json::json!(0.1));
        assert_eq!(trials[2]["batch_size"], serde_json::json!(128));
        assert_eq!(trials[3]["lr"], serde_json::json!(0.01));
    }

    #[test]
    fn random_draws_stay_in_range_and_repeat_with_the_seed() {
        let space =
            SearchSpace::parse(["lr=log:1e-4..1e-1", "dropout=0.1..0.5", "layers=int:1..3"]).expect("space");
        let a = space.trials(Some(200), 7).expect("draws");
        assert_eq!(a, space.trials(Some(200), 7).expect("again"));
        assert_ne!(a, space.trials(Some(200), 8).expect("other seed"));
        let lrs: Vec<f64> = a.iter().map(|t| t["lr"].as_f64().expect("f64")).collect();
        assert!(lrs.iter().all(|&x| (1e-4..1e-1).contains(&x)));
        // Log-uniform: about as many draws in each decade.
        let below_1e3 = lrs.iter().filter(|&&x| x < 1e-3).count();
        assert!(
            (40..=95).contains(&below_1e3),
            "{below_1e3} of 200 in the first decade"
        );
        assert!(
            a.iter()
                .all(|t| (1..=3).contains(&t["layers"].as_i64().expect("int")))
        );
    }

    #[test]
    fn options_set_the_spec_through_aliases_and_paths() {
        let space = SearchSpace::parse(["lr=0.05", "hidden=[32,8]", "batch_size=16", "optimizer=sgd"])
            .expect("space");
        let trial = &space.trials(None, 0).expect("grid")[0];
        let spec = space.apply(&base(), trial).expect("applies");
        assert_eq!(spec.optimizer.learning_rate(), 0.05);
        assert_eq!(spec.optimizer.name(), "sgd");
        assert_eq!(spec.model, ModelSpec::Mlp { hidden: vec![32, 8] });
        assert_eq!(spec.batch_size, 16);
        space
            .check_taken(&[(trial.clone(), spec)])
            .expect("every option taken");
    }

    #[test]
    fn bad_spaces_are_refused_naming_the_option() {
        let err = |forms: &[&str]| {
            let space = SearchSpace::parse(forms.iter().copied()).and_then(|s| {
                let trials = s.trials(Some(2), 0)?;
                let specs = trials
                    .iter()
                    .map(|t| s.apply(&base(), t).map(|spec| (t.clone(), spec)))
                    .collect::<Result<Vec<_>, _>>()?;
                s.check_taken(&specs)
            });
            space.expect_err("refused").to_string()
        };
        assert!(
            err(&["lr=log:1e-1..1e-4"]).contains("`lr`: an empty range"),
            "{}",
            err(&["lr=log:1e-1..1e-4"])
        );
        assert!(err(&["lr=log:0..1"]).contains("0 < low"));
        assert!(err(&["batch_size="]).contains("no value listed"));
        assert!(err(&["learnin_rate=0.1|0.2"]).contains("unknown option `learnin_rate`"));
        assert!(err(&["optimizer.betta1=0.8|0.9"]).contains("unknown option `optimizer.betta1`"));
        // A path through a field the spec lacks, or through a value that is no object.
        assert!(
            err(&["model.nope.width=1"])
                .contains("`model.nope.width`: the job spec has no `nope` (in `model.nope.width`)"),
            "{}",
            err(&["model.nope.width=1"])
        );
        assert!(
            err(&["batch_size.x=1"])
                .contains("`batch_size.x`: `batch_size.x`: the spec holds no object above `x`"),
            "{}",
            err(&["batch_size.x=1"])
        );
        assert!(err(&["batch_size=0|-3"]).contains("batch_size"));
        assert!(err(&["batch_size=big|small"]).contains("makes no job spec"));
        assert!(err(&["num_slots=1|2"]).contains("cannot vary"));
        assert!(err(&["eval_split.fraction=0.1|0.2"]).contains("cannot vary"));
        assert!(err(&["lr=0.1", "learning_rate=0.2"]).contains("searched twice"));
        assert!(err(&["lr"]).contains("expected `name=values`"));
        assert!(err(&[]).contains("no option to search"));
        let space = SearchSpace::parse(["lr=0.001..0.1"]).expect("space");
        assert!(
            space
                .trials(None, 0)
                .expect_err("range in a grid")
                .to_string()
                .contains("give a number of trials")
        );
    }
}
