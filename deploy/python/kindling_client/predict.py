"""Predicting inside Spark: each task sends its partition to the agent on its node.

Use with ``DataFrame.mapInArrow`` after serving the model on the agents
(``serve_model``; the Rust client's ``TrainedModel::transform`` does both)::

    from kindling_client.predict import transform_fn, output_ddl
    fn = transform_fn(MODEL_ID, columns=["x1", "x2"], token=READER_CREDENTIAL)
    scored = df.mapInArrow(fn, output_ddl(df.schema.simpleString(), "classification"))

Every Spark task opens one ``DoExchange`` on ``[model_id, predict]`` with the
agent at ``KINDLING_AGENT_ADDRESS`` (its node's agent: the DaemonSet's
node-local Service on Kubernetes), sends the partition's feature columns
batch by batch and appends the agent's prediction columns to each batch. The
agent loads a model version once and every task shares it; no row leaves the
node and none reaches the driver.

Needs only pyarrow: ship the ``kindling_client`` package as a zip with
``spark.addArtifacts(path, pyfile=True)`` or ``--py-files`` (the Rust client
does so itself).
"""

import base64
import json
import os

import pyarrow as pa
import pyarrow.flight as fl

from .errors import KindlingError
from .push import _agent, _task_info

__all__ = ["PredictError", "choose_agent", "output_ddl", "predict_batches", "serve_model", "transform_fn",
           "udf_command"]

#: The prediction columns by task, as Spark DDL (appended to the input's).
PREDICTION_DDL = {
    "classification": "prediction long, probabilities array<float>",
    "regression": "prediction float",
    "regression_multi": "prediction array<float>",
}


class PredictError(RuntimeError):
    """A partition could not be predicted; the task fails and Spark may retry it."""


def output_ddl(input_ddl, task):
    """The output schema of :func:`transform_fn` for an input of ``input_ddl``
    (``df.schema.simpleString()``'s ``struct<...>`` or ``a int, b float``) and
    ``task`` (a key of :data:`PREDICTION_DDL`)."""
    inner = input_ddl[len("struct<"):-1] if input_ddl.startswith("struct<") else input_ddl
    inner = inner.replace(":", " ") if input_ddl.startswith("struct<") else inner
    return f"{inner}, {PREDICTION_DDL[task]}"


def choose_agent(partition_id, agents, *, require_node_local=False):
    """The agent partition ``partition_id`` is predicted by.

    ``KINDLING_AGENT_ADDRESS`` (the executor's node's agent) when it is set.
    Otherwise, unless ``require_node_local``, ``agents[partition_id %
    len(agents)]`` — rows then cross the network to another node. With
    ``require_node_local`` (or no ``agents``) an executor whose node has no
    agent fails its task with an error naming the node.
    """
    local = os.environ.get("KINDLING_AGENT_ADDRESS")
    if local:
        return local
    node = os.environ.get("KINDLING_NODE_NAME") or os.uname().nodename
    if agents and not require_node_local:
        return agents[partition_id % len(agents)]
    raise PredictError(
        f"no Kindling agent on this executor's node `{node}` (KINDLING_AGENT_ADDRESS is not set) for "
        f"partition {partition_id}: run the agent DaemonSet on every executor node and set "
        "KINDLING_AGENT_ADDRESS in the executor pod template, or allow predicting on another node "
        "(require_node_local=False with agents=[...])"
    )


def predict_batches(address, model_id, batches, *, columns, token=None, timeout=60.0):
    """Yields each of ``batches`` with the model's prediction columns appended,
    predicted by the agent at ``address`` over one ``DoExchange``."""
    agent = writer = None
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            features = batch.select(columns)
            if writer is None:
                agent = _agent(address, token, timeout, PredictError)
                descriptor = fl.FlightDescriptor.for_path(model_id, "predict")
                writer, reader = agent.client.do_exchange(descriptor, options=agent.options)
                writer.begin(features.schema)
            writer.write_batch(features)
            # The agent may answer one batch in several messages (its
            # encoder splits large ones): read until every row is back.
            parts, got = [], 0
            while got < batch.num_rows:
                chunk = reader.read_chunk()
                if chunk.data is None:
                    raise PredictError(
                        f"agent {address} ended the stream after {got} of a batch's {batch.num_rows} rows"
                    )
                parts.append(chunk.data)
                got += chunk.data.num_rows
            if got != batch.num_rows:
                raise PredictError(f"agent {address} answered {got} rows for a batch of {batch.num_rows}")
            schema = parts[0].schema
            extra = schema.names[features.num_columns:]
            arrays = list(batch.columns) + [
                pa.concat_arrays([p.column(n) for p in parts]) for n in extra
            ]
            fields = list(batch.schema) + [schema.field(n) for n in extra]
            yield pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
        if writer is not None:
            writer.done_writing()
            for _ in reader:  # the end of the agent's stream
                pass
    except fl.FlightError as e:
        raise PredictError(f"predicting with `{model_id}` at {address} failed: {e}") from e
    finally:
        if writer is not None:
            writer.close()
        if agent is not None:
            agent.close()


def transform_fn(model_id, *, columns, token=None, agents=None, require_node_local=False, timeout=60.0,
                 task_info=None):
    """A ``mapInArrow`` function appending the predictions of model ``model_id``
    (served on the agents) to every row.

    - ``columns``: the model's feature columns (sent to the agent; every input
      column is kept in the output).
    - ``token``: a reader credential of the model (or the cluster's token;
      else env ``KINDLING_TOKEN``).
    - ``agents``, ``require_node_local``: see :func:`choose_agent`.
    """
    agents = list(agents) if agents else None

    def transform(iterator):
        partition_id, _attempt = (task_info or _task_info)()
        secret = token or os.environ.get("KINDLING_TOKEN")
        address = choose_agent(partition_id, agents, require_node_local=require_node_local)
        yield from predict_batches(address, model_id, iterator, columns=columns, token=secret,
                                   timeout=timeout)

    return transform


def serve_model(address, model_dir, *, token=None, timeout=60.0):
    """Serves the model saved in ``model_dir`` (``TrainedModel::save``:
    ``spec.json``, ``model.json``, ``weights.arrow``) on the agent at
    ``address``; returns its model id. Needs the operator token."""
    with open(os.path.join(model_dir, "spec.json"), "rb") as f:
        spec = json.load(f)
    with open(os.path.join(model_dir, "model.json"), "rb") as f:
        meta = json.load(f)
    with pa.memory_map(os.path.join(model_dir, "weights.arrow")) as source:
        table = pa.ipc.open_file(source).read_all()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    weights = base64.b64encode(sink.getvalue().to_pybytes()).decode()
    body = {"model_id": "", "spec": spec, "input_dim": meta["input_dim"],
            "inputs": meta["inputs"], "weights": weights}
    agent = _agent(address, token, timeout, PredictError)
    try:
        return agent.action("serve_model", body)["model_id"]
    except KindlingError as e:
        raise PredictError(f"serve_model at {address} failed: {e}") from e
    finally:
        agent.close()


def udf_command(config):
    """``(transform_fn, output_ddl)`` from a JSON config (the Rust client's
    MapPartitions relation pickles the call ``udf_command("<json>")``):
    ``model_id``, ``columns``, ``output`` (the output DDL) and optionally
    ``token``, ``agents``, ``require_node_local``, ``timeout``."""
    if isinstance(config, (str, bytes)):
        config = json.loads(config)
    allowed = {"model_id", "columns", "output", "token", "agents", "require_node_local", "timeout"}
    unknown = set(config) - allowed
    if unknown:
        raise PredictError(f"udf_command: unknown option(s) {sorted(unknown)}; known: {sorted(allowed)}")
    missing = {"model_id", "columns", "output"} - set(config)
    if missing:
        raise PredictError(f"udf_command: {sorted(missing)} required")
    kwargs = {k: v for k, v in config.items() if k not in ("model_id", "output")}
    return transform_fn(config["model_id"], **kwargs), config["output"]
