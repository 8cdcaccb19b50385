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
OVERLAYS = {"cpu": "cpu", "gpu": "gpu", "custom-agent": "cpu", "cert-manager": "cpu"}
# Not Kubernetes objects on their own: kustomize inputs and partial patches.
NOT_OBJECTS = {"kustomization.yaml", "agent-gpu.yaml"}


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


CERT_MANAGER_USAGES = {
    "digital signature", "key encipherment", "server auth", "client auth", "cert sign",
}


def check_cert_manager(obj, where, name, errors):
    """cert-manager's CRDs have no schema here: check what these manifests use."""
    spec = obj.get("spec") or {}
    bad = lambda msg: errors.append(f"{where}: {name}: {msg}")  # noqa: E731
    if obj.get("apiVersion") != "cert-manager.io/v1":
        bad(f"apiVersion {obj.get('apiVersion')!r} is not cert-manager.io/v1")
    if obj["kind"] == "Issuer":
        kinds = [k for k in ("selfSigned", "ca") if k in spec]
        if len(kinds) != 1 or set(spec) - {"selfSigned", "ca"}:
            bad(f"an Issuer needs exactly one of selfSigned, ca; has {sorted(spec)}")
        if "ca" in spec and not spec["ca"].get("secretName"):
            bad("a CA Issuer needs ca.secretName")
    elif obj["kind"] == "Certificate":
        known = {"isCA", "commonName", "secretName", "duration", "renewBefore", "dnsNames", "usages",
                 "privateKey", "issuerRef"}
        if set(spec) - known:
            bad(f"unknown fields {sorted(set(spec) - known)}")
        if not spec.get("secretName"):
            bad("no secretName")
        if not (spec.get("issuerRef") or {}).get("name"):
            bad("no issuerRef.name")
        if not (spec.get("dnsNames") or spec.get("commonName")):
            bad("neither dnsNames nor commonName")
        if set(spec.get("usages", [])) - CERT_MANAGER_USAGES:
            bad(f"unknown usages {sorted(set(spec.get('usages', [])) - CERT_MANAGER_USAGES)}")
    else:
        bad("unexpected cert-manager kind")


def check(obj, where, version, errors):
    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if str(obj.get("apiVersion", "")).startswith("cert-manager.io/"):
        check_cert_manager(obj, where, name, errors)
        return name
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
    for r in over.get("resources", []):
        if not r.startswith(".."):
            objs += docs(over_dir / r)
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


def pod_spec(obj):
    spec = obj.get("spec", {})
    if "jobTemplate" in spec:
        spec = spec["jobTemplate"]["spec"]
    return spec.get("template", {}).get("spec") if "template" in spec else (spec if obj["kind"] == "Pod" else None)


def check_tls(objs, overlay, errors):
    """Every KINDLING_TLS_* file lies in a mounted Secret; with cert-manager,
    a Certificate makes each such Secret and carries the names clients dial."""
    secrets = set()
    env_of = {}
    pods = [(o, pod_spec(o)) for o in objs]
    for cm in (o for o in objs if o["kind"] == "ConfigMap"):
        for text in cm.get("data", {}).values():
            for d in yaml.safe_load_all(text):
                if isinstance(d, dict) and d.get("kind") == "Pod":
                    pods.append((d, d["spec"]))
    for o, pod in pods:
        if not pod:
            continue
        who = o["metadata"].get("name", "executor pod template")
        volumes = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
        for c in pod.get("containers", []):
            mounts = {m["mountPath"]: volumes.get(m["name"]) for m in c.get("volumeMounts", [])}
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            env_of[who] = env
            for key in ("KINDLING_TLS_CERT", "KINDLING_TLS_KEY", "KINDLING_TLS_CA"):
                path = env.get(key)
                if path is None:
                    continue
                secret = next((s for m, s in mounts.items() if s and path.startswith(m.rstrip("/") + "/")), None)
                if secret is None:
                    errors.append(f"overlays/{overlay}: {who}: {key}={path} is in no mounted Secret")
                else:
                    secrets.add(secret)
    certs = {o["spec"]["secretName"]: o for o in objs if o["kind"] == "Certificate"}
    if not certs:
        return
    issuers = {o["metadata"]["name"] for o in objs if o["kind"] == "Issuer"}
    for c in certs.values():
        if c["spec"]["issuerRef"]["name"] not in issuers:
            errors.append(f"overlays/{overlay}: Certificate/{c['metadata']['name']}: no Issuer "
                          f"{c['spec']['issuerRef']['name']}")
    for secret in sorted(secrets - set(certs)):
        errors.append(f"overlays/{overlay}: Secret {secret} is mounted for TLS but no Certificate makes it")
    agent = env_of.get("kindling-agent", {})
    rendezvous_host = (agent.get("KINDLING_RENDEZVOUS") or "").split("://")[-1].rsplit(":", 1)[0]
    wanted = [("kindling-rendezvous-tls", rendezvous_host), ("kindling-agent-tls", agent.get("KINDLING_TLS_SERVER_NAME"))]
    for secret, name in wanted:
        names = certs.get(secret, {}).get("spec", {}).get("dnsNames", [])
        if name not in names:
            errors.append(f"overlays/{overlay}: the certificate in {secret} lacks {name!r} (has {names})")


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
            check_tls(objs, overlay, errors)
            print(f"overlays/{overlay}: {len(objs)} objects rendered with {renderer}")
    print(f"{len(files)} manifest files checked against Kubernetes {args.k8s_version}")
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
