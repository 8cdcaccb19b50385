"""Executor push through Spark Connect: mapInArrow streams each partition into
its agent (partition p -> agents[p % n]).

Usage: push_spark.py '<json>' with remote, agents, token, job_id, rows,
partitions, batch_rows, package (the kindling_client folder, shipped to the
executors as a zip). Prints one JSON object.
"""

import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from ship import ship_package


def main():
    args = json.loads(sys.argv[1])
    spark = SparkSession.builder.remote(args["remote"]).getOrCreate()
    # Executors import kindling_client.push from the session's artifacts.
    ship_package(spark, args["package"])
    from kindling_client.push import SUMMARY_DDL, push_partition_fn

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(args["batch_rows"]))
    n, parts = args["rows"], args["partitions"]
    df = spark.range(0, n, 1, parts).select(
        (((F.col("id") * 7919) % 1000) / 500.0 - 1.0).alias("x1"),
        ((((F.col("id") * 104729) % 997) / 498.5 - 1.0).cast("float")).alias("x2"),
    ).withColumn("y", (F.col("x1") + 2 * F.col("x2") > 0.1).cast("int"))

    fn = push_partition_fn(args["job_id"], token=args["token"], agents=args["agents"])
    first = [r.asDict() for r in df.mapInArrow(fn, SUMMARY_DDL).collect()]
    # The same plan again: every partition is a committed producer already.
    again = [r.asDict() for r in df.mapInArrow(fn, SUMMARY_DDL).collect()]
    print(json.dumps({"first": first, "again": again}))


if __name__ == "__main__":
    main()
