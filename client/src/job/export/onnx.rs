//! The built-in networks (linear, MLP, CNN) as an ONNX graph (opset 17):
//! one input per feature column in spec order, `[N, width]` float32, their
//! concatenation through the same layers as burn's forward pass, and one
//! output, `probabilities` (softmax over the classes) or `values`.
//!
//! burn 0.22 has no graph capture, so the graph is written here from the
//! model's spec, one ONNX node per layer; the protobuf messages are prost's
//! (the subset of `onnx.proto` a graph of these operators needs, the field
//! numbers of the ONNX IR spec), so the file's bytes are prost's encoding.
//! The weights come from the model's weights table (burn's layouts: a
//! `Linear`'s weight `[in, out]`, read by `Gemm` untransposed; a `Conv2d`'s
//! `[out, in, kh, kw]`, as ONNX's `Conv` has it).

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, UInt64Type};
use kindling_schemas::model_serving::ModelInput;
use kindling_schemas::spec::{ModelSpec, Task};
use prost::Message;

use super::JobError;

/// The opset the graph imports.
pub const OPSET: i64 = 17;
/// ONNX IR version 8: what opset 17 came with.
const IR_VERSION: i64 = 8;
/// `TensorProto.DataType`: float32, int64.
const FLOAT: i32 = 1;
const INT64: i32 = 7;
/// `AttributeProto.AttributeType`: int, ints.
const ATTR_INT: i32 = 2;
const ATTR_INTS: i32 = 7;

#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(int64, tag = "1")]
    ir_version: i64,
    #[prost(string, tag = "2")]
    producer_name: String,
    #[prost(string, tag = "3")]
    producer_version: String,
    #[prost(string, tag = "6")]
    doc_string: String,
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "8")]
    opset_import: Vec<OperatorSetIdProto>,
    #[prost(message, repeated, tag = "14")]
    metadata_props: Vec<StringStringEntryProto>,
}

#[derive(Clone, PartialEq, Message)]
struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(int64, tag = "2")]
    version: i64,
}

#[derive(Clone, PartialEq, Message)]
struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    value: String,
}

#[derive(Clone, PartialEq, Message)]
struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(message, repeated, tag = "5")]
    initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    output: Vec<ValueInfoProto>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    output: Vec<String>,
    #[prost(string, tag = "3")]
    name: String,
    #[prost(string, tag = "4")]
    op_type: String,
    #[prost(message, repeated, tag = "5")]
    attribute: Vec<AttributeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct AttributeProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(int64, tag = "3")]
    i: i64,
    #[prost(int64, repeated, tag = "8")]
    ints: Vec<i64>,
    #[prost(int32, tag = "20")]
    r#type: i32,
}

#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    data_type: i32,
    #[prost(string, tag = "8")]
    name: String,
    /// Little-endian values.
    #[prost(bytes = "vec", tag = "9")]
    raw_data: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct ValueInfoProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    r#type: Option<TypeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TypeProto {
    #[prost(message, optional, tag = "1")]
    tensor_type: Option<TensorTypeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorTypeProto {
    #[prost(int32, tag = "1")]
    elem_type: i32,
    #[prost(message, optional, tag = "2")]
    shape: Option<TensorShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    dim: Vec<Dimension>,
}

#[derive(Clone, PartialEq, Message)]
struct Dimension {
    #[prost(int64, optional, tag = "1")]
    dim_value: Option<i64>,
    #[prost(string, optional, tag = "2")]
    dim_param: Option<String>,
}

/// What the graph is built from: the model's spec, its inputs and weights.
pub(super) struct Graph<'a> {
    pub model: &'a ModelSpec,
    pub task: &'a Task,
    pub inputs: &'a [ModelInput],
    pub weights: &'a RecordBatch,
    /// Classes, or regression targets.
    pub outputs: usize,
    pub job_id: &'a str,
}

/// A float tensor `[N, width]`, `N` named `N`.
fn rows_of(name: &str, width: usize) -> ValueInfoProto {
    let dim = |v: Option<i64>, p: Option<&str>| Dimension {
        dim_value: v,
        dim_param: p.map(str::to_owned),
    };
    ValueInfoProto {
        name: name.to_owned(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto {
                elem_type: FLOAT,
                shape: Some(TensorShapeProto {
                    dim: vec![dim(None, Some("N")), dim(Some(width as i64), None)],
                }),
            }),
        }),
    }
}

fn node(op: &str, name: &str, input: &[&str], output: &str, attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: input.iter().map(|s| (*s).to_owned()).collect(),
        output: vec![output.to_owned()],
        name: name.to_owned(),
        op_type: op.to_owned(),
        attribute,
    }
}

fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.to_owned(),
        i,
        ints: Vec::new(),
        r#type: ATTR_INT,
    }
}

fn ints(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.to_owned(),
        i: 0,
        ints: ints.to_vec(),
        r#type: ATTR_INTS,
    }
}

/// A tensor of the weights table: name, shape, values.
type Named = (String, Vec<usize>, Vec<f32>);
/// A tensor's name and shape.
type Shape = (String, Vec<usize>);

/// The weights table's tensors in the model's order.
fn tensors(weights: &RecordBatch) -> Result<Vec<Named>, JobError> {
    let bad = |what: &str| JobError::Export {
        format: "onnx",
        reason: format!("the model's weights table has no {what}"),
    };
    let names = weights
        .column_by_name("name")
        .and_then(|c| c.as_string_opt::<i32>())
        .ok_or_else(|| bad("`name` column"))?;
    let shapes = weights
        .column_by_name("shape")
        .and_then(|c| c.as_list_opt::<i32>())
        .ok_or_else(|| bad("`shape` column"))?;
    let values = weights
        .column_by_name("values")
        .and_then(|c| c.as_list_opt::<i32>())
        .ok_or_else(|| bad("`values` column"))?;
    (0..weights.num_rows())
        .map(|i| {
            let shape = shapes.value(i);
            let shape = shape
                .as_primitive_opt::<UInt64Type>()
                .ok_or_else(|| bad("u64 shapes"))?;
            let v = values.value(i);
            let v = v
                .as_primitive_opt::<Float32Type>()
                .ok_or_else(|| bad("f32 values"))?;
            Ok((
                names.value(i).to_owned(),
                shape.values().iter().map(|d| *d as usize).collect(),
                v.values().to_vec(),
            ))
        })
        .collect()
}

impl Graph<'_> {
    /// The graph's layers: `(weight, bias)` pairs of the convolutions, then
    /// of the dense layers, as burn's module tree orders them.
    fn layers(&self) -> Result<(usize, Vec<[Named; 2]>), JobError> {
        let convs = match self.model {
            ModelSpec::Linear | ModelSpec::Mlp { .. } => 0,
            ModelSpec::Cnn { conv, .. } => conv.len(),
            ModelSpec::Custom { name, .. } => {
                return Err(JobError::Export {
                    format: "onnx",
                    reason: format!(
                        "`{name}` is a model of one's own: ONNX export covers the built-in linear, mlp \
                         and cnn; a model of one's own needs burn 0.23's graph capture (burn-onnx), \
                         which this burn (0.22) lacks. Export it as safetensors"
                    ),
                });
            }
        };
        let mut all = tensors(self.weights)?.into_iter();
        let mut pairs = Vec::new();
        while let (Some(w), Some(b)) = (all.next(), all.next()) {
            if !(w.0.ends_with("weight") && b.0.ends_with("bias")) {
                return Err(JobError::Export {
                    format: "onnx",
                    reason: format!("expected a weight and its bias, found `{}` and `{}`", w.0, b.0),
                });
            }
            pairs.push([w, b]);
        }
        Ok((convs, pairs))
    }

    /// One `[N, width]` float input per feature column, in spec order.
    fn graph_inputs(&self) -> Result<Vec<ValueInfoProto>, JobError> {
        self.inputs
            .iter()
            .map(|i| match i {
                ModelInput::Float { name, width } => Ok(rows_of(name, *width)),
                other => Err(JobError::Export {
                    format: "onnx",
                    reason: format!("the built-in models read float columns only, not {other:?}"),
                }),
            })
            .collect()
    }

    /// The ONNX model's bytes, and each weight's name and shape (burn's
    /// layouts, as the file's initializers have them).
    pub fn encode(&self) -> Result<(Vec<u8>, Vec<Shape>), JobError> {
        let (convs, layers) = self.layers()?;
        let shapes = layers
            .iter()
            .flatten()
            .map(|(name, shape, _)| (name.clone(), shape.clone()))
            .collect();
        let mut nodes = Vec::new();
        let mut initializer = Vec::new();
        let input = self.graph_inputs()?;
        let names: Vec<&str> = input.iter().map(|i| i.name.as_str()).collect();
        nodes.push(node("Concat", "features", &names, "x", vec![int("axis", 1)]));
        let mut x = "x".to_owned();
        if let ModelSpec::Cnn {
            channels,
            height,
            width,
            ..
        } = self.model
        {
            initializer.push(TensorProto {
                dims: vec![4],
                data_type: INT64,
                name: "image_shape".into(),
                raw_data: [-1, *channels as i64, *height as i64, *width as i64]
                    .iter()
                    .flat_map(|d| d.to_le_bytes())
                    .collect(),
            });
            nodes.push(node("Reshape", "image", &["x", "image_shape"], "image", vec![]));
            x = "image".into();
        }
        let dense = layers.len() - convs;
        for (i, [(w_name, w_shape, w), (b_name, b_shape, b)]) in layers.into_iter().enumerate() {
            for (name, shape, values) in [(&w_name, &w_shape, &w), (&b_name, &b_shape, &b)] {
                initializer.push(TensorProto {
                    dims: shape.iter().map(|d| *d as i64).collect(),
                    data_type: FLOAT,
                    name: name.clone(),
                    raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                });
            }
            let out = format!("layer{i}");
            if i < convs {
                let (kh, kw) = (w_shape[2] as i64, w_shape[3] as i64);
                let pads = [kh / 2, kw / 2, kh / 2, kw / 2];
                let conv = vec![ints("kernel_shape", &[kh, kw]), ints("pads", &pads)];
                nodes.push(node("Conv", &out, &[&x, &w_name, &b_name], &out, conv));
                nodes.push(node(
                    "Relu",
                    &format!("{out}.relu"),
                    &[&out],
                    &format!("{out}.relu"),
                    vec![],
                ));
                let pool = vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])];
                let pooled = format!("{out}.pool");
                nodes.push(node("MaxPool", &pooled, &[&format!("{out}.relu")], &pooled, pool));
                x = pooled;
                if i + 1 == convs {
                    nodes.push(node("Flatten", "flatten", &[&x], "flat", vec![int("axis", 1)]));
                    x = "flat".into();
                }
                continue;
            }
            let last = i + 1 == convs + dense;
            let out = match (last, self.task) {
                (true, Task::Regression) => "values".to_owned(),
                (true, Task::Classification { .. }) => "logits".to_owned(),
                (false, _) => out,
            };
            // burn's Linear: y = x W + b with W [in, out], so no transpose.
            nodes.push(node("Gemm", &out, &[&x, &w_name, &b_name], &out, vec![]));
            x = out;
            if !last {
                let relu = format!("{x}.relu");
                nodes.push(node("Relu", &relu, &[&x], &relu, vec![]));
                x = relu;
            }
        }
        let output = match self.task {
            Task::Classification { .. } => {
                nodes.push(node(
                    "Softmax",
                    "softmax",
                    &[&x],
                    "probabilities",
                    vec![int("axis", 1)],
                ));
                "probabilities"
            }
            Task::Regression => "values",
        };
        let model = ModelProto {
            ir_version: IR_VERSION,
            producer_name: "kindling".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            doc_string: format!("Kindling job `{}`, model `{}`", self.job_id, self.model.name()),
            graph: Some(GraphProto {
                node: nodes,
                name: self.model.name().to_owned(),
                initializer,
                input,
                output: vec![rows_of(output, self.outputs)],
            }),
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: OPSET,
            }],
            metadata_props: vec![StringStringEntryProto {
                key: "kindling.job_id".into(),
                value: self.job_id.to_owned(),
            }],
        };
        Ok((model.encode_to_vec(), shapes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_of_one_s_own_is_refused_naming_burn_s_graph_capture() {
        let weights = RecordBatch::new_empty(std::sync::Arc::new(arrow::datatypes::Schema::empty()));
        let model = ModelSpec::Custom {
            name: "tabular-embeddings".into(),
            config: serde_json::json!({}),
        };
        let graph = Graph {
            model: &model,
            task: &Task::Regression,
            inputs: &[],
            weights: &weights,
            outputs: 1,
            job_id: "j",
        };
        let err = graph.encode().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            err.contains("`tabular-embeddings` is a model of one's own"),
            "{err}"
        );
        assert!(err.contains("burn 0.23's graph capture"), "{err}");
        assert!(err.contains("safetensors"), "{err}");
    }
}
