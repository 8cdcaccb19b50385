"""The pandas_udf baseline of bench_transform.rs: the same MLP, applied in numpy
inside a PySpark ``pandas_udf`` on the Spark executors (no Kindling in the
data path).

Usage: bench_transform_pandas.py '<json>' with

- ``remote``: the Spark Connect URL;
- ``model_dir``: a directory ``TrainedModel::save`` wrote (``weights.arrow``:
  one row per parameter tensor, ``name``, ``shape``, row-major ``values``);
- ``features``: the feature columns, in the model's order;
- ``arrow_batch_rows`` (optional): ``spark.sql.execution.arrow.maxRecordsPerBatch``
  of the session (bench_transform.rs sets the same in its own);
- ``query``: the SQL of the DataFrame to predict;
- ``mode``: ``check`` — print every row's features and predicted class
  (``{"rows": [[x1, ..., x8, class], ...]}``), for the caller to compare with
  the model; ``bench`` — run ``warmup_query`` once (not timed), then time
  building the DataFrame, the pandas_udf and the aggregate
  ``count(*), sum(prediction)``, check ``count == rows`` and print
  ``{"seconds", "n", "sum"}``.

The weights travel to the executors as constants of the UDF's closure
(pickled with it in the plan): a few KB for this model.
"""

import json
import sys
import time

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import LongType


def load_layers(model_dir, inputs):
    """The dense layers as ``[(W [in, out], b [out])]`` in float32, from the
    weights table (parameters in model order: each layer's weight, then its
    bias; burn's ``Linear`` stores the weight as ``[in, out]``)."""
    with pa.memory_map(f"{model_dir}/weights.arrow") as source:
        table = pa.ipc.open_file(source).read_all()
    names = table.column("name").to_pylist()
    shapes = table.column("shape").to_pylist()
    values = table.column("values").to_pylist()
    layers, width, weight = [], inputs, None
    for name, shape, vals in zip(names, shapes, values):
        array = np.asarray(vals, dtype=np.float32).reshape(shape)
        if len(shape) == 2:
            if weight is not None:
                raise ValueError(f"two weights in a row at {name}")
            if shape[0] != width:
                if shape[1] != width:
                    raise ValueError(f"{name} has shape {shape}, the layer's input is {width} wide")
                array = array.T
            weight = array
        elif len(shape) == 1:
            if weight is None or shape[0] != weight.shape[1]:
                raise ValueError(f"bias {name} of shape {shape} does not follow a matching weight")
            layers.append((np.ascontiguousarray(weight), array))
            width, weight = shape[0], None
        else:
            raise ValueError(f"{name}: unexpected shape {shape}")
    if weight is not None or not layers:
        raise ValueError(f"not an MLP's table: {names}")
    return layers


def make_udf(layers, features):
    """``predict(struct(features...)) -> long``: the MLP's argmax class."""

    @pandas_udf(LongType())
    def predict(x: pd.DataFrame) -> pd.Series:
        h = x[features].to_numpy(dtype=np.float32)
        last = len(layers) - 1
        for i, (w, b) in enumerate(layers):
            h = h @ w + b
            if i < last:
                np.maximum(h, 0.0, out=h)
        return pd.Series(np.argmax(h, axis=1).astype(np.int64))

    return predict


def scored(spark, query, udf, features):
    df = spark.sql(query)
    return df.withColumn("prediction", udf(F.struct(*[F.col(c) for c in features])))


def aggregate(df):
    [row] = df.selectExpr("count(*) AS n", "sum(prediction) AS s").collect()
    return row["n"], row["s"]


def main():
    args = json.loads(sys.argv[1])
    features = args["features"]
    layers = load_layers(args["model_dir"], len(features))
    spark = SparkSession.builder.remote(args["remote"]).getOrCreate()
    if "arrow_batch_rows" in args:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(args["arrow_batch_rows"]))
    udf = make_udf(layers, features)
    try:
        if args["mode"] == "check":
            rows = [[r[c] for c in features] + [r["prediction"]]
                    for r in scored(spark, args["query"], udf, features).collect()]
            print(json.dumps({"rows": rows}))
            return
        # Warm up this session's Python workers (imports of pandas, numpy).
        aggregate(scored(spark, args["warmup_query"], udf, features))
        start = time.perf_counter()
        n, s = aggregate(scored(spark, args["query"], udf, features))
        seconds = time.perf_counter() - start
        if n != args["rows"]:
            raise SystemExit(f"count(*) = {n}, expected {args['rows']}")
        print(json.dumps({"seconds": seconds, "n": n, "sum": s}))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
