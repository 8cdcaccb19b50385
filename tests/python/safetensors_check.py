"""Reads Kindling's exported models and writes state dicts with the readers
and writers users have: the `safetensors` package and numpy, no Kindling code.

One JSON argument with `mode`:
- `forward`: {dir, rows: [[float]], expected: [[float]]}: loads
  `dir/model.safetensors` and `dir/kindling.json`, runs the model's forward
  pass in numpy (linear, mlp, cnn) on `rows` and prints the largest absolute
  difference from `expected` (Kindling's probabilities or values).
- `write`: {path, tensors: {name: shape}, seed, bad?, format?}: writes a
  float32 state dict of those names and shapes, values drawn away from
  zero, as safetensors or (`format: "pt"`) as `torch.save` writes it; `bad`
  spoils it: `truncated`, or tensor `spoil` as `f64`, `renamed` or of
  twice its `shape`'s first dimension.
- `compare`: {a, b}: whether two safetensors files hold the same tensors,
  bit for bit.
"""

import collections
import json
import os
import pickle
import sys
import types
import zipfile

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file


def relu(x):
    return np.maximum(x, 0.0)


def dense(t, x):
    n = 0
    while f"dense.{n}.weight" in t:
        n += 1
    for i in range(n):
        # PyTorch's Linear: weight [out, in], y = x W^T + b.
        x = x @ t[f"dense.{i}.weight"].T + t[f"dense.{i}.bias"]
        if i < n - 1:
            x = relu(x)
    return x


def conv_same(img, w, b):
    n, _, h, wd = img.shape
    kh, kw = w.shape[2], w.shape[3]
    padded = np.pad(img, ((0, 0), (0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2)))
    out = np.zeros((n, w.shape[0], h, wd))
    for dy in range(kh):
        for dx in range(kw):
            out += np.einsum("nchw,oc->nohw", padded[:, :, dy:dy + h, dx:dx + wd], w[:, :, dy, dx])
    return out + b[None, :, None, None]


def max_pool2(img):
    n, c, h, w = img.shape
    img = img[:, :, : h // 2 * 2, : w // 2 * 2]
    return img.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def forward(info, t, x):
    if info["model"] == "cnn":
        cfg = info["model_config"]
        img = x.reshape(len(x), cfg["channels"], cfg["height"], cfg["width"])
        for i in range(len(cfg["conv"])):
            img = max_pool2(relu(conv_same(img, t[f"convs.{i}.weight"], t[f"convs.{i}.bias"])))
        x = img.reshape(len(img), -1)
    out = dense(t, x)
    if info["output"] == "logits":
        out = np.exp(out - out.max(axis=1, keepdims=True))
        out = out / out.sum(axis=1, keepdims=True)
    return out


def check_forward(args):
    d = args["dir"]
    with open(os.path.join(d, "kindling.json")) as f:
        info = json.load(f)
    path = os.path.join(d, info["file"])
    t = {k: v.astype(np.float64) for k, v in load_file(path).items()}
    with safe_open(path, framework="numpy") as f:
        header = f.metadata() or {}
    dtypes = sorted({str(v.dtype) for v in load_file(path).values()})
    x = np.asarray(args["rows"], dtype=np.float64)
    assert x.shape[1] == info["input_dim"], (x.shape, info["input_dim"])
    got = forward(info, t, x)
    want = np.asarray(args["expected"], dtype=np.float64).reshape(got.shape)
    return {
        "max_diff": float(np.abs(got - want).max()),
        "tensors": {k: list(v.shape) for k, v in t.items()},
        "dtypes": dtypes,
        "header_has_description": "kindling" in header,
        "features": [f["name"] for f in info["features"]],
    }


def save_pt(tensors, path):
    """Writes `tensors` (float32 numpy arrays) as `torch.save(state_dict,
    path)` does, without PyTorch: a zip of `archive/data.pkl` (an
    OrderedDict of `torch._utils._rebuild_tensor_v2` calls on persistent
    storages), one `archive/data/K` file of little-endian values per
    tensor, and `archive/version`. The pickle names torch's globals, so
    they are stood in for while pickling."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    class FloatStorage:
        pass

    def _rebuild_tensor_v2(*args):
        raise RuntimeError("only pickled, never called")

    FloatStorage.__module__ = "torch"
    FloatStorage.__qualname__ = "FloatStorage"
    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    torch.FloatStorage = FloatStorage
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    torch._utils = utils
    saved = {name: sys.modules.get(name) for name in ("torch", "torch._utils")}
    sys.modules["torch"], sys.modules["torch._utils"] = torch, utils

    class Storage:
        def __init__(self, key, numel):
            self.key, self.numel = key, numel

    class Tensor:
        def __init__(self, key, array):
            self.key, self.array = key, array

        def __reduce__(self):
            shape = tuple(self.array.shape)
            stride = tuple(s // self.array.itemsize for s in self.array.strides)
            storage = Storage(self.key, self.array.size)
            return (_rebuild_tensor_v2, (storage, 0, shape, stride, False, collections.OrderedDict()))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, Storage):
                return ("storage", FloatStorage, obj.key, "cpu", obj.numel)
            return None

    import io

    data = collections.OrderedDict()
    for k, (name, array) in enumerate(tensors.items()):
        data[name] = Tensor(str(k), np.ascontiguousarray(array, dtype=np.float32))
    buf = io.BytesIO()
    try:
        Pickler(buf, protocol=2).dump(data)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        for tensor in data.values():
            z.writestr(f"archive/data/{tensor.key}", tensor.array.astype("<f4").tobytes())
        z.writestr("archive/version", "3\n")


def write(args):
    rng = np.random.default_rng(args["seed"])
    tensors = {}
    for name, shape in args["tensors"].items():
        # Away from zero: the test's tiny learning rate moves none of them.
        magnitude = rng.uniform(0.05, 0.5, size=shape)
        sign = np.where(rng.uniform(size=shape) < 0.5, -1.0, 1.0)
        tensors[name] = (magnitude * sign).astype(np.float32)
    bad = args.get("bad")
    first = args.get("spoil", "")
    if bad == "f64":
        tensors[first] = tensors[first].astype(np.float64)
    elif bad == "renamed":
        tensors[first + "_renamed"] = tensors.pop(first)
    elif bad == "shape":
        tensors[first] = np.concatenate([tensors[first], tensors[first]], axis=0)
    if args.get("format") == "pt":
        save_pt(tensors, args["path"])
    else:
        save_file(tensors, args["path"])
    if bad == "truncated":
        size = os.path.getsize(args["path"])
        with open(args["path"], "r+b") as f:
            f.truncate(size - 7)
    return {"written": sorted(tensors)}


def compare(args):
    a, b = load_file(args["a"]), load_file(args["b"])
    same = sorted(a) == sorted(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a
    )
    return {"same": same, "a": sorted(a), "b": sorted(b)}


def main():
    args = json.loads(sys.argv[1])
    mode = args["mode"]
    result = {"forward": check_forward, "write": write, "compare": compare}[mode](args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
