"""Rendering each overlay of deploy/k8s: `kubectl kustomize`, or the
built-in renderer that covers exactly what these overlays use (resources,
namespace, labels, images, generators, strategic-merge patches of named
objects), on a copy of the tree whose secret generators read throwaway
placeholder files.
"""

import copy
import pathlib
import shutil
import subprocess

import yaml

from validate_common import CLUSTER_SCOPED, ROOT, docs


# The files base/secrets must hold (git-ignored; each operator makes their
# own): throwaway stand-ins, so validation never reads the real ones. The
# viewer token differs from the token, as the servers require.
PLACEHOLDER_SECRETS = {
    "token": "validate-only-not-a-secret\n",
    "credential-key": "validate-only-not-a-secret-key-of-32-bytes\n",
    "viewer-token": "validate-only-not-a-secret-viewer\n",
    "spark-connect-token": "validate-only-not-a-secret-spark-connect\n",
    "spark-authenticate": "validate-only-not-a-secret-spark-authenticate\n",
}


def with_dummy_token(tmp):
    """A copy of deploy/k8s whose secret generators have (throwaway) files."""
    copy_root = pathlib.Path(tmp) / "k8s"
    shutil.copytree(ROOT, copy_root, ignore=shutil.ignore_patterns(*PLACEHOLDER_SECRETS))
    for name, text in PLACEHOLDER_SECRETS.items():
        (copy_root / "base" / "secrets" / name).write_text(text)
    return copy_root


def render_kubectl(root, overlay):
    done = subprocess.run(
        ["kubectl", "kustomize", str(root / "overlays" / overlay)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"overlays/{overlay}: kubectl kustomize failed: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


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
            if not (base_dir / rel).exists():
                raise SystemExit(f"secretGenerator {gen['name']}: missing {rel}")
            data[key] = (base_dir / rel).read_text()
        meta = {"name": gen["name"]}
        if gen.get("namespace"):
            meta["namespace"] = gen["namespace"]
        objs.append({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "stringData": data})
    objs += generated_config_maps(base_dir, base)
    # As kustomize: a kustomization's `namespace:` moves all its namespaced
    # objects; without one, each keeps the namespace it names.
    set_namespace(objs, base.get("namespace"))
    over_dir = root / "overlays" / overlay
    over = docs(over_dir / "kustomization.yaml")[0]
    for r in over.get("resources", []):
        if not r.startswith(".."):
            objs += docs(over_dir / r)
    objs += generated_config_maps(over_dir, over)
    for p in over.get("patches", []):
        patch = docs(over_dir / p["path"])[0]
        target = p.get("target", {})
        hits = [o for o in objs if o["kind"] == target.get("kind", patch["kind"])
                and o["metadata"]["name"] == target.get("name", patch["metadata"]["name"])]
        if len(hits) != 1:
            raise SystemExit(f"{overlay}: patch {p['path']} matches {len(hits)} objects")
        if patch.get("$patch") == "delete":
            objs.remove(hits[0])
        else:
            objs[objs.index(hits[0])] = merge(hits[0], patch)
    set_namespace(objs, over.get("namespace"))
    for o in objs:
        set_images(o, base.get("images", []))
        set_images(o, over.get("images", []))
        for pairs in over.get("labels", []):
            o["metadata"].setdefault("labels", {}).update(pairs["pairs"])
    return objs


def set_namespace(objs, namespace):
    if namespace:
        for o in objs:
            if o["kind"] not in CLUSTER_SCOPED:
                o["metadata"]["namespace"] = namespace


def generated_config_maps(directory, kustomization):
    for gen in kustomization.get("configMapGenerator", []):
        meta = {"name": gen["name"]}
        if gen.get("namespace"):
            meta["namespace"] = gen["namespace"]
        if (gen.get("options") or {}).get("labels"):
            meta["labels"] = dict(gen["options"]["labels"])
        data = {}
        for f in gen["files"]:
            key, _, rel = f.partition("=") if "=" in f else (pathlib.Path(f).name, "", f)
            data[key] = (directory / rel).read_text()
        yield {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
