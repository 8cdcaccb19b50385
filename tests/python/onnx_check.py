"""Runs Kindling's exported ONNX file with the readers users have: `onnx`'s
checker and `onnxruntime`, no Kindling code.

One JSON argument: {path, inputs: {column: [[float]]}, expected: [[float]]}.
Checks the model (`onnx.checker`, full check with shape inference), runs it
in onnxruntime on the columns and prints the graph's input and output names,
its opset and the largest absolute difference from `expected` (Kindling's
probabilities or values).
"""

import json
import sys

import numpy as np
import onnx
import onnxruntime as ort


def main():
    args = json.loads(sys.argv[1])
    model = onnx.load(args["path"])
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(args["path"], providers=["CPUExecutionProvider"])
    feeds = {name: np.asarray(rows, dtype=np.float32) for name, rows in args["inputs"].items()}
    (got,) = session.run(None, feeds)
    want = np.asarray(args["expected"], dtype=np.float64).reshape(got.shape)
    print(
        json.dumps(
            {
                "max_diff": float(np.abs(got.astype(np.float64) - want).max()),
                "inputs": [i.name for i in session.get_inputs()],
                "outputs": [o.name for o in session.get_outputs()],
                "opset": [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")],
            }
        )
    )


if __name__ == "__main__":
    main()
