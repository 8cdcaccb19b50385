"""scikit-learn's metrics for predictions a test hands over in a JSON file.

Argument: {"file": path}. The file holds {"task": "classes" | "values",
"y": [...], "w": [...] or null, and "proba": [[...], ...] (classes, float32
as Kindling computes them) or "pred": [[...], ...] (values), "top_k": k}.
Prints one JSON object: each metric by Kindling's name.
"""

import json
import sys

import numpy as np
from sklearn import metrics


def main():
    args = json.loads(sys.argv[1])
    with open(args["file"]) as f:
        d = json.load(f)
    w = None if d.get("w") is None else np.asarray(d["w"], dtype=np.float32).astype(np.float64)
    out = {}
    if d["task"] == "classes":
        y = np.asarray(d["y"], dtype=np.int64)
        proba = np.asarray(d["proba"], dtype=np.float32)
        classes = proba.shape[1]
        pred = proba.argmax(axis=1)
        labels = list(range(classes))
        out["eval_accuracy"] = metrics.accuracy_score(y, pred, sample_weight=w)
        out["eval_log_loss"] = metrics.log_loss(y, proba, sample_weight=w, labels=labels)
        for avg in ("macro", "micro"):
            out[f"eval_f1_{avg}"] = metrics.f1_score(y, pred, average=avg, sample_weight=w, zero_division=0)
        out["eval_precision_macro"] = metrics.precision_score(
            y, pred, average="macro", sample_weight=w, zero_division=0
        )
        out["eval_recall_macro"] = metrics.recall_score(y, pred, average="macro", sample_weight=w, zero_division=0)
        k = d.get("top_k", 5)
        if k < classes:
            out["eval_top_k_accuracy"] = metrics.top_k_accuracy_score(y, proba, k=k, sample_weight=w, labels=labels)
        if classes == 2:
            out["eval_auc_roc"] = metrics.roc_auc_score(y, proba[:, 1], sample_weight=w)
            out["eval_pr_auc"] = metrics.average_precision_score(y, proba[:, 1], sample_weight=w)
        out["confusion"] = metrics.confusion_matrix(y, pred, labels=labels, sample_weight=w).tolist()
    else:
        y = np.asarray(d["y"], dtype=np.float32).astype(np.float64)
        pred = np.asarray(d["pred"], dtype=np.float32).astype(np.float64)
        out["eval_rmse"] = metrics.root_mean_squared_error(y, pred, sample_weight=w)
        out["eval_mae"] = metrics.mean_absolute_error(y, pred, sample_weight=w)
        out["eval_r2"] = metrics.r2_score(y, pred, sample_weight=w)
        out["eval_mape"] = metrics.mean_absolute_percentage_error(y, pred, sample_weight=w)
    print(json.dumps({k: (float(v) if not isinstance(v, list) else v) for k, v in out.items()}))


if __name__ == "__main__":
    main()
