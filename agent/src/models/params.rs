//! Moving a model's parameters and gradients in and out of flat buffers:
//! gradients into one `f32` buffer for the all-reduce; weights into one
//! buffer for the optimizer (the `optim` module) and back into the model; and
//! weights into an Arrow table (name, shape, values) that any language can
//! read, and back. Also the lock every model construction holds while it
//! draws its initial weights from burn's process-wide RNG.

use std::sync::{Arc, Mutex, MutexGuard};

use arrow::array::{Array, AsArray, Float32Array, ListArray, RecordBatch, StringArray, UInt64Array};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Float32Type, Schema, UInt64Type};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Tensor, TensorData};

use crate::error::{AgentError, ModelError};

/// burn's CPU backend draws every random tensor from one process-wide RNG.
/// Every model construction holds this lock, so a seeded construction
/// (`ModelRegistry::build_seeded`) cannot have another one (a model built
/// to load weights into, another job's init) draw from the RNG between
/// seeding and building.
static INIT: Mutex<()> = Mutex::new(());

pub(crate) fn init_lock() -> MutexGuard<'static, ()> {
    INIT.lock().unwrap_or_else(|p| p.into_inner())
}

/// Builds burn modules outside the registry (tests) the way the registry
/// does: under the init lock, every parameter drawn before it is released,
/// so they cannot draw from the process-wide RNG while a seeded build runs.
#[cfg(test)]
pub(crate) fn drawn<M: Module>(build: impl FnOnce() -> M) -> M {
    let _guard = init_lock();
    materialized(build())
}

/// burn initialises parameters lazily, on first use; draw them all now,
/// while the caller holds the init lock.
pub(crate) fn materialized<M: Module>(model: M) -> M {
    struct Draw;
    impl ModuleVisitor for Draw {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let _ = param.val();
        }
    }
    model.visit(&mut Draw);
    model
}

struct Flatten<'a> {
    grads: &'a GradientsParams,
    out: Vec<f32>,
}

impl ModuleVisitor for Flatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        // A parameter without a gradient still takes its place (zeros) so
        // every rank lays the buffer out identically.
        let grad = self.grads.get::<D>(param.id);
        append_values(&mut self.out, grad, param.lazy_shape().num_elements(), 0.0);
    }
}

/// Appends `tensor`'s values as `f32` to `out`, or `n` times `fill` when
/// there is no tensor or its values cannot be read as `f32`.
fn append_values<const D: usize>(out: &mut Vec<f32>, tensor: Option<Tensor<D>>, n: usize, fill: f32) {
    let data = tensor.map(|t| t.into_data().convert::<f32>());
    match data.as_ref().map(|d| d.as_slice::<f32>()) {
        Some(Ok(values)) => out.extend_from_slice(values),
        _ => out.extend(std::iter::repeat_n(fill, n)),
    }
}

/// Flattens `grads` of `model` into one buffer in module visit order (the
/// layout of [`flat_weights`]).
pub fn flatten_grads<M: Module>(model: &M, grads: &GradientsParams) -> Vec<f32> {
    let mut v = Flatten {
        grads,
        // Room for the trainer's trailing values too ([rows, loss, flags]):
        // one allocation per step instead of a chain of reallocations.
        out: Vec::with_capacity(model.num_params() + 4),
    };
    model.visit(&mut v);
    v.out
}

/// [`flatten_grads`] with `tail`'s values appended (the step's loss): on a
/// GPU the gradients (zeros for a parameter without one) and `tail` are joined
/// on the device and read back in one transfer — each read back waits for the
/// device, so a step pays one wait instead of one per parameter and one more
/// for the loss. On the CPU the values are copied out one by one, as there
/// joining them first would only add a copy.
pub fn flatten_grads_and<M: Module>(model: &M, grads: &GradientsParams, tail: Tensor<1>) -> Vec<f32> {
    if !crate::models::backend::is_gpu(&tail.device()) {
        let mut out = flatten_grads(model, grads);
        append_values(&mut out, Some(tail.inner()), 1, f32::NAN);
        return out;
    }
    struct Parts<'a> {
        grads: &'a GradientsParams,
        parts: Vec<Tensor<1>>,
    }
    impl ModuleVisitor for Parts<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let n = param.lazy_shape().num_elements();
            let part = match self.grads.get::<D>(param.id) {
                Some(grad) => grad.inner().reshape([n]).cast(DType::F32),
                None => Tensor::zeros([n], &param.val().device().without_autodiff()),
            };
            self.parts.push(part);
        }
    }
    let mut v = Parts {
        grads,
        parts: Vec::new(),
    };
    model.visit(&mut v);
    v.parts.push(tail.inner().reshape([-1]).cast(DType::F32));
    let data = Tensor::cat(v.parts, 0).into_data().convert::<f32>();
    let mut out = data.try_into_vec::<f32>().unwrap_or_default();
    out.reserve(4);
    out
}

/// Zero gradients laid out like `model`'s (for a rank with no rows in a step).
pub fn zero_grads<M: Module>(model: &M) -> Vec<f32> {
    flatten_grads(model, &GradientsParams::new())
}

struct FlatWeights {
    out: Vec<f32>,
}

impl ModuleVisitor for FlatWeights {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let n = param.lazy_shape().num_elements();
        append_values(&mut self.out, Some(param.val()), n, f32::NAN);
    }
}

/// The model's weights in one buffer, laid out like [`flatten_grads`]'s
/// gradients (module visit order, row-major).
pub fn flat_weights<M: Module>(model: &M) -> Vec<f32> {
    let mut v = FlatWeights {
        out: Vec::with_capacity(model.num_params()),
    };
    model.visit(&mut v);
    v.out
}

struct LoadFlat<'a> {
    values: &'a [f32],
    offset: usize,
}

impl ModuleMapper for LoadFlat<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let shape = param.lazy_shape().dims::<D>().to_vec();
        let n: usize = shape.iter().product();
        let values = self.values[self.offset..self.offset + n].to_vec();
        self.offset += n;
        // One upload per parameter: writes are queued without waiting for the
        // device (one buffer sliced on the device instead made each later
        // step far slower on wgpu).
        param.map(|t| {
            let (tracked, dtype) = (t.is_require_grad(), t.dtype());
            let fresh = Tensor::from_data(TensorData::new(values, shape), &t.device());
            // A mixed-precision model's weights stay in its compute dtype.
            retyped(if tracked { fresh.require_grad() } else { fresh }, dtype)
        })
    }
}

/// The dtype of `model`'s first float parameter: the one it computes in
/// (`f32` for a model without float parameters).
pub(crate) fn float_dtype<M: Module>(model: &M) -> DType {
    struct First(Option<DType>);
    impl ModuleVisitor for First {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.get_or_insert_with(|| param.val().dtype());
        }
    }
    let mut first = First(None);
    model.visit(&mut first);
    first.0.unwrap_or(DType::F32)
}

/// `model` with every float parameter in `dtype` (a mixed-precision job's
/// weights on the GPU; loading weights brings them back as `f32`), each
/// keeping its autodiff and gradient tracking. Unchanged where they are.
pub(crate) fn cast<M: Module>(model: M, dtype: DType) -> M {
    struct Cast(DType);
    impl ModuleMapper for Cast {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let dtype = self.0;
            param.map(|t| retyped(t, dtype))
        }
    }
    if float_dtype(&model) == dtype {
        return model;
    }
    model.map(&mut Cast(dtype))
}

/// A parameter's tensor `t` in `dtype`, keeping its autodiff and gradient
/// tracking (a fresh leaf, not a node of a graph); `t` itself where it is.
fn retyped<const D: usize>(t: Tensor<D>, dtype: DType) -> Tensor<D> {
    if t.dtype() == dtype {
        return t;
    }
    let (tracked, autodiff) = (t.is_require_grad(), t.is_autodiff());
    let cast = t.inner().cast(dtype);
    let cast = if autodiff { cast.autodiff() } else { cast };
    if tracked { cast.require_grad() } else { cast }
}

/// Writes `values` (laid out by [`flat_weights`]) into `model`'s parameters,
/// keeping their ids, devices, dtypes and gradient tracking.
///
/// # Panics
/// If `values` is shorter than the model's parameters.
pub fn load_flat<M: Module>(model: M, values: &[f32]) -> M {
    model.map(&mut LoadFlat { values, offset: 0 })
}

#[derive(Default)]
struct Collect {
    path: Vec<String>,
    names: Vec<String>,
    shapes: Vec<Vec<usize>>,
    values: Vec<Vec<f32>>,
}

impl ModuleVisitor for Collect {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let tensor = param.val();
        self.names.push(self.path.join("."));
        self.shapes.push(tensor.dims().to_vec());
        let data = tensor.into_data().convert::<f32>();
        self.values
            .push(data.as_slice::<f32>().map(<[f32]>::to_vec).unwrap_or_default());
    }
}

/// Each parameter's path (module names joined by `.`) and number of
/// values, in the flat buffers' order: what parameter groups select by.
pub fn layout<M: Module>(model: &M) -> Vec<(String, usize)> {
    #[derive(Default)]
    struct Paths {
        path: Vec<String>,
        out: Vec<(String, usize)>,
    }
    impl ModuleVisitor for Paths {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_owned());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.out
                .push((self.path.join("."), param.lazy_shape().num_elements()));
        }
    }
    let mut p = Paths::default();
    model.visit(&mut p);
    p.out
}

/// The schema of a model table.
pub fn model_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new(
            "shape",
            DataType::List(Arc::new(Field::new("item", DataType::UInt64, false))),
            false,
        ),
        Field::new(
            "values",
            DataType::List(Arc::new(Field::new("item", DataType::Float32, false))),
            false,
        ),
    ]))
}

/// The model's weights as an Arrow table: one row per parameter tensor
/// (`name`, `shape`, row-major `values`).
pub fn to_arrow<M: Module>(model: &M) -> Result<RecordBatch, AgentError> {
    let mut c = Collect::default();
    model.visit(&mut c);
    let names = StringArray::from(c.names);
    let shape_values: Vec<u64> = c.shapes.iter().flatten().map(|&d| d as u64).collect();
    let shapes = ListArray::new(
        Arc::new(Field::new("item", DataType::UInt64, false)),
        OffsetBuffer::from_lengths(c.shapes.iter().map(Vec::len)),
        Arc::new(UInt64Array::from(shape_values)),
        None,
    );
    let lengths: Vec<usize> = c.values.iter().map(Vec::len).collect();
    let flat: Vec<f32> = c.values.into_iter().flatten().collect();
    let values = ListArray::new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        OffsetBuffer::from_lengths(lengths),
        Arc::new(Float32Array::from(flat)),
        None,
    );
    RecordBatch::try_new(
        model_schema(),
        vec![Arc::new(names), Arc::new(shapes), Arc::new(values)],
    )
    .map_err(AgentError::arrow)
}

struct Replace {
    tensors: std::vec::IntoIter<(Vec<usize>, Vec<f32>)>,
    error: Option<String>,
}

impl ModuleMapper for Replace {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some((shape, values)) = self.tensors.next() else {
            self.error
                .get_or_insert_with(|| "the table has fewer parameters than the model".into());
            return param;
        };
        let want = param.lazy_shape().dims::<D>().to_vec();
        if shape != want {
            self.error.get_or_insert_with(|| {
                format!("parameter shape {shape:?} does not match the model's {want:?}")
            });
            return param;
        }
        // Keeping the parameter's gradient tracking, as `LoadFlat` does: a
        // model trained from these weights (`init_from`) needs it.
        param.map(|t| {
            let tracked = t.is_require_grad();
            let fresh = Tensor::from_data(TensorData::new(values, shape), &t.device());
            if tracked { fresh.require_grad() } else { fresh }
        })
    }
}

/// Loads weights from a table made by [`to_arrow`] into `model` (same
/// architecture), checking names, count and shapes.
pub fn from_arrow<M: Module>(model: M, table: &RecordBatch) -> Result<M, AgentError> {
    let bad = |reason: String| AgentError::from(ModelError::Table(reason));
    if table.schema().fields() != model_schema().fields() {
        return Err(bad(format!(
            "expected columns name, shape, values; got {:?}",
            table.schema()
        )));
    }
    let mut expected = Collect::default();
    model.visit(&mut expected);
    let names = table.column(0).as_string::<i32>();
    if names.len() != expected.names.len() {
        return Err(bad(format!(
            "{} parameters, the model has {}",
            names.len(),
            expected.names.len()
        )));
    }
    let shapes = table.column(1).as_list::<i32>();
    let values = table.column(2).as_list::<i32>();
    let mut tensors = Vec::with_capacity(names.len());
    for i in 0..names.len() {
        if names.value(i) != expected.names[i] {
            return Err(bad(format!(
                "parameter {i} is `{}`, the model has `{}`",
                names.value(i),
                expected.names[i]
            )));
        }
        let shape: Vec<usize> = shapes
            .value(i)
            .as_primitive::<UInt64Type>()
            .values()
            .iter()
            .map(|&d| d as usize)
            .collect();
        let vals = values.value(i).as_primitive::<Float32Type>().values().to_vec();
        if shape.iter().product::<usize>() != vals.len() {
            return Err(bad(format!(
                "`{}` has {} values for shape {shape:?}",
                names.value(i),
                vals.len()
            )));
        }
        tensors.push((shape, vals));
    }
    let mut r = Replace {
        tensors: tensors.into_iter(),
        error: None,
    };
    let model = model.map(&mut r);
    match r.error {
        Some(e) => Err(bad(e)),
        None => Ok(model),
    }
}

/// Encodes the model as burn record bytes (for broadcast and checkpoints).
pub fn to_record_bytes<M: Module>(model: &M) -> Result<Vec<u8>, AgentError> {
    let bytes = model
        .clone()
        .into_record()
        .into_bytes()
        .map_err(ModelError::Record)?;
    Ok(bytes.to_vec())
}

/// Loads burn record bytes made by [`to_record_bytes`] into `model`.
pub fn from_record_bytes<M: Module>(model: M, bytes: Vec<u8>) -> Result<M, AgentError> {
    let record = burn::store::ModuleRecord::from_bytes(burn::tensor::Bytes::from_bytes_vec(bytes))
        .map_err(ModelError::Record)?;
    Ok(model.try_load_record(record).map_err(ModelError::Record)?)
}
