"""Predicting inside Spark from PySpark: serve a saved model on agents that
did not train it (kindling_client.predict.serve_model), then mapInArrow with
kindling_client.predict.transform_fn; each task asks an agent over DoExchange.

Usage: transform_spark.py '<json>' with remote, agents, token, model_dir,
package (the kindling_client folder, shipped to the executors as a zip),
rows. Prints one JSON object: the model id and every row's
features and predictions.
"""

import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from ship import ship_package


def main():
    args = json.loads(sys.argv[1])
    spark = SparkSession.builder.remote(args["remote"]).getOrCreate()
    ship_package(spark, args["package"])
    from kindling_client.predict import output_ddl, serve_model, transform_fn

    ids = {serve_model(a, args["model_dir"], token=args["token"]) for a in args["agents"]}
    assert len(ids) == 1, ids
    model_id = ids.pop()
    df = spark.range(0, args["rows"], 1, 4).select(
        (((F.col("id") * 7919) % 1000) / 500.0 - 1.0).alias("x1"),
        ((((F.col("id") * 104729) % 997) / 498.5 - 1.0).cast("float")).alias("x2"),
    )
    fn = transform_fn(model_id, columns=["x1", "x2"], token=args["token"], agents=args["agents"])
    scored = df.mapInArrow(fn, output_ddl(df.schema.simpleString(), "classification"))
    rows = [[r.x1, r.x2, r.prediction, list(r.probabilities)] for r in scored.collect()]
    print(json.dumps({"model_id": model_id, "columns": scored.columns, "rows": rows}))


if __name__ == "__main__":
    main()
