"""Validates deploy/k8s: every manifest file, and each overlay as rendered.

Rendering uses `kubectl kustomize` when kubectl is installed; otherwise a
small built-in renderer that covers exactly what these overlays use
(resources, namespace, labels, images, generators, strategic-merge patches
of named DaemonSets). Schemas: kubernetes-validate, strict (unknown fields
are errors), offline.

Usage: validate.py [--k8s-version 1.31.0] [--renderer auto|kubectl|builtin]
"""

import argparse
import copy
import pathlib
import shutil
import subprocess
import sys
import tempfile

import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent
# Each overlay and the image variant (tag suffix) its agents must run.
OVERLAYS = {"cpu": "cpu", "gpu": "gpu", "custom-agent": "cpu"}
# Not Kubernetes objects on their own: kustomize inputs and partial patches.
NOT_OBJECTS = {"kustomization.yaml", "agent-gpu.yaml"}


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def check(obj, where, version, errors):
    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        errors.append(f"{where}: {name}: {e.message} at {'.'.join(map(str, e.path))}")
    except kubernetes_validate.SchemaNotFoundError as e:
        errors.append(f"{where}: {name}: no schema: {e}")
    return name


def with_dummy_token(tmp):
    """A copy of deploy/k8s whose secret generator has a (throwaway) token file."""
    copy_root = pathlib.Path(tmp) / "k8s"
    shutil.copytree(ROOT, copy_root, ignore=shutil.ignore_patterns("token"))
    (copy_root / "base" / "secrets" / "token").write_text("validate-only-not-a-secret\n")
    return copy_root


def render_kubectl(root, overlay):
    out = subprocess.run(
        ["kubectl", "kustomize", str(root / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d is not None]


def merge(base, patch):
    """Strategic merge, as far as these patches need: maps merge, lists of
    named maps merge by name, other lists replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list):
        if all(isinstance(x, dict) and "name" in x for x in base + patch):
            out = [copy.deepcopy(x) for x in base]
            for p in patch:
                hit = next((i for i, x in enumerate(out) if x["name"] == p["name"]), None)
                if hit is None:
                    out.append(copy.deepcopy(p))
                else:
                    out[hit] = merge(out[hit], p)
            return out
        return copy.deepcopy(patch)
    return copy.deepcopy(patch)


def set_images(obj, images):
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec", {}) if "template" in spec else spec
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        name, _, tag = c.get("image", "").partition(":")
        for rule in images:
            if rule["name"] == name:
                name = rule.get("newName", name)
                tag = rule.get("newTag", tag)
        c["image"] = f"{name}:{tag}" if tag else name


def render_builtin(root, overlay):
    base_dir = root / "base"
    base = docs(base_dir / "kustomization.yaml")[0]
    objs = [d for r in base["resources"] for d in docs(base_dir / r)]
    for gen in base.get("secretGenerator", []):
        data = {}
        for f in gen["files"]:
            key, _, rel = f.partition("=")
            data[key] = "(generated)"
            if not (base_dir / rel).exists():
                raise SystemExit(f"secretGenerator {gen['name']}: missing {rel}")
        objs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": gen["name"]},
                     "type": "Opaque", "stringData": data})
    for gen in base.get("configMapGenerator", []):
        data = {pathlib.Path(f).name: (base_dir / f).read_text() for f in gen["files"]}
        objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]},
                     "data": data})
    over_dir = root / "overlays" / overlay
    over = docs(over_dir / "kustomization.yaml")[0]
    for p in over.get("patches", []):
        patch = docs(over_dir / p["path"])[0]
        target = p.get("target", {})
        hits = [o for o in objs if o["kind"] == target.get("kind", patch["kind"])
                and o["metadata"]["name"] == target.get("name", patch["metadata"]["name"])]
        if len(hits) != 1:
            raise SystemExit(f"{overlay}: patch {p['path']} matches {len(hits)} objects")
        objs[objs.index(hits[0])] = merge(hits[0], patch)
    for o in objs:
        set_images(o, base.get("images", []))
        set_images(o, over.get("images", []))
        if o["kind"] != "Namespace":
            o["metadata"]["namespace"] = base["namespace"]
    return objs


def containers(objs, kind, name):
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o["spec"]["template"]["spec"]["containers"]
    raise AssertionError(f"no {kind}/{name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k8s-version", default="1.31.0")
    ap.add_argument("--renderer", choices=["auto", "kubectl", "builtin"], default="auto")
    args = ap.parse_args()
    errors = []
    files = sorted(p for p in ROOT.rglob("*.yaml") if p.name not in NOT_OBJECTS)
    for path in files:
        for obj in docs(path):
            check(obj, path.relative_to(ROOT), args.k8s_version, errors)
    renderer = args.renderer
    if renderer == "auto":
        renderer = "kubectl" if shutil.which("kubectl") else "builtin"
    with tempfile.TemporaryDirectory() as tmp:
        root = with_dummy_token(tmp)
        for overlay, variant in OVERLAYS.items():
            render = render_kubectl if renderer == "kubectl" else render_builtin
            objs = render(root, overlay)
            for obj in objs:
                check(obj, f"overlays/{overlay} (rendered)", args.k8s_version, errors)
            agent = containers(objs, "DaemonSet", "kindling-agent")[0]
            if not agent["image"].endswith(f"-{variant}"):
                errors.append(f"overlays/{overlay}: agent image {agent['image']} is not the {variant} variant")
            gpus = agent["resources"].get("limits", {}).get("nvidia.com/gpu")
            if (variant == "gpu") != (gpus is not None):
                errors.append(f"overlays/{overlay}: agent nvidia.com/gpu limit is {gpus!r}")
            print(f"overlays/{overlay}: {len(objs)} objects rendered with {renderer}")
    print(f"{len(files)} manifest files checked against Kubernetes {args.k8s_version}")
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
