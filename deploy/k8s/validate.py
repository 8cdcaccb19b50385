"""Validates deploy/k8s: every manifest file, and each overlay as rendered.

Rendering uses `kubectl kustomize` when kubectl is installed; otherwise a
small built-in renderer that covers exactly what these overlays use
(resources, namespace, labels, images, generators, strategic-merge patches
of named DaemonSets). Schemas: kubernetes-validate, strict (unknown fields
are errors), offline.

On each rendered overlay also: TLS files lie in mounted Secrets (made by
Certificates under cert-manager), and the NetworkPolicies admit to each gRPC
port of the agents and the rendezvous exactly the pods in GRPC_PEERS, resolved
through the labels of the rendered pod templates (check_network_policies).

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
    shutil.copytree(ROOT, copy_root, ignore=shutil.ignore_patterns("token", "credential-key"))
    (copy_root / "base" / "secrets" / "token").write_text("validate-only-not-a-secret\n")
    (copy_root / "base" / "secrets" / "credential-key").write_text("validate-only-not-a-secret-key-of-32-bytes\n")
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


# NetworkPolicy. Pods are named by the object that makes them, not by their
# labels (the labels are what is checked): the executor pod template is a file
# in a ConfigMap (`kubectl kustomize` appends a hash to the ConfigMap's name).
POD_ROLES = {
    "agent": ("DaemonSet", "kindling-agent"),
    "rendezvous": ("Deployment", "kindling-rendezvous"),
    "client": ("Job", "kindling-train-example"),
    "executor": ("ConfigMap", "spark-executor-pod-template"),
    "spark-connect": ("Deployment", "spark-connect"),
}
# Each gRPC port of a Kindling server and exactly the pods that may connect to it.
GRPC_PEERS = {
    ("agent", 50051): {"executor", "agent", "client"},  # Flight + collective ring
    ("rendezvous", 7070): {"agent", "client"},
}
# The only pods NetworkPolicies may isolate: Spark's driver and executors need
# traffic (driver <-> executors, the API server) no policy here allows.
ISOLATED = {"agent", "rendezvous"}
ANYONE = "anyone"


def pod_templates(objs):
    """Every pod the objects make: workload templates and Pod manifests inside
    ConfigMaps (Spark's executor template). Each as a dict: who, role,
    namespace, labels, ports (container port name -> number, TCP), probe_ports."""
    found = []
    for o in objs:
        ns = o["metadata"].get("namespace")
        if o["kind"] == "ConfigMap":
            for key, text in (o.get("data") or {}).items():
                if not key.endswith((".yaml", ".yml")):
                    continue
                for d in yaml.safe_load_all(text):
                    if isinstance(d, dict) and d.get("kind") == "Pod":
                        found.append((o, f"ConfigMap/{o['metadata']['name']}:{key}", ns,
                                      d.get("metadata") or {}, d.get("spec") or {}))
            continue
        spec = o.get("spec") or {}
        if "jobTemplate" in spec:
            spec = spec["jobTemplate"].get("spec") or {}
        if "template" in spec:
            t = spec["template"]
            found.append((o, f"{o['kind']}/{o['metadata']['name']}", ns, t.get("metadata") or {}, t.get("spec") or {}))
        elif o["kind"] == "Pod":
            found.append((o, f"Pod/{o['metadata']['name']}", ns, o["metadata"], spec))
    pods = []
    for o, who, ns, meta, spec in found:
        role = next((r for r, (kind, name) in POD_ROLES.items()
                     if o["kind"] == kind and (o["metadata"]["name"] == name
                                               or (kind == "ConfigMap" and o["metadata"]["name"].startswith(name + "-")))),
                    None)
        ports, probe_ports = {}, set()
        for c in spec.get("containers", []):
            for p in c.get("ports", []):
                if p.get("protocol", "TCP") == "TCP":
                    ports[p.get("name", str(p["containerPort"]))] = p["containerPort"]
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                for how in ("httpGet", "tcpSocket", "grpc"):
                    port = ((c.get(probe) or {}).get(how) or {}).get("port")
                    if port is not None:
                        probe_ports.add(port)
        pods.append({"who": who, "role": role, "namespace": ns, "labels": meta.get("labels") or {},
                     "ports": ports,
                     "probe_ports": {ports.get(p) if isinstance(p, str) else p for p in probe_ports}})
    return pods


def selects(selector, labels):
    """A LabelSelector against a pod's labels; the empty selector selects every pod."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        has, values = e["key"] in labels, e.get("values") or []
        ok = {"In": has and labels.get(e["key"]) in values,
              "NotIn": not (has and labels.get(e["key"]) in values),
              "Exists": has,
              "DoesNotExist": not has}.get(e["operator"])
        if not ok:
            return False
    return True


def policy_types(policy):
    spec = policy.get("spec") or {}
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else []))


def admits_port(rule_port, pod, number):
    if rule_port.get("protocol", "TCP") != "TCP":
        return False
    port = rule_port.get("port")
    if port is None:
        return True
    if isinstance(port, str):
        port = pod["ports"].get(port)
        if port is None:
            return False
    return port <= number <= rule_port.get("endPort", port)


def ingress_peers(policies, pod, number):
    """The peers that may connect to the pod's TCP port `number`: None when no
    policy isolates the pod (everyone may), else the `from` entries of every
    ingress rule admitting the port, ANYONE for a rule without `from`."""
    isolated, peers = False, []
    for p in policies:
        if p["metadata"].get("namespace") != pod["namespace"] or "Ingress" not in policy_types(p):
            continue
        if not selects(p["spec"].get("podSelector") or {}, pod["labels"]):
            continue
        isolated = True
        for rule in p["spec"].get("ingress") or []:
            if rule.get("ports") and not any(admits_port(rp, pod, number) for rp in rule["ports"]):
                continue
            peers += rule.get("from") or [ANYONE]
    return peers if isolated else None


def check_network_policies(objs, overlay, errors):
    """The agents' and the rendezvous' gRPC ports admit exactly GRPC_PEERS,
    their probe ports every source, and every selector in a policy matches
    the labels of a pod the manifests make (a renamed label fails here)."""
    bad = lambda msg: errors.append(f"overlays/{overlay}: {msg}")  # noqa: E731
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    if not policies:
        bad("no NetworkPolicy")
        return
    pods = pod_templates(objs)
    by_role = {p["role"]: p for p in pods if p["role"]}
    for role in sorted(set(POD_ROLES) - set(by_role)):
        bad(f"no pod template for {role} ({'/'.join(POD_ROLES[role])})")
    name = lambda p: p["role"] or p["who"]  # noqa: E731

    def matched(selector, namespace):
        return [p for p in pods if p["namespace"] == namespace and selects(selector, p["labels"])]

    for pol in policies:
        where = f"NetworkPolicy/{pol['metadata']['name']}"
        ns = pol["metadata"].get("namespace")
        spec = pol.get("spec") or {}
        if "Egress" in policy_types(pol):
            bad(f"{where} restricts egress: agents dial the rendezvous, their peers and DNS, "
                "and this check models ingress only")
        targets = matched(spec.get("podSelector") or {}, ns)
        if not targets:
            bad(f"{where}: podSelector {spec.get('podSelector')} matches no pod template")
        for t in targets:
            if t["role"] not in ISOLATED:
                bad(f"{where} selects {name(t)}: only {sorted(ISOLATED)} may be isolated")
        for rule in spec.get("ingress") or []:
            for peer in rule.get("from") or []:
                if set(peer) != {"podSelector"}:
                    bad(f"{where}: peer {peer} is not a podSelector of the namespace")
                elif not matched(peer["podSelector"], ns):
                    bad(f"{where}: peer podSelector {peer['podSelector']} matches no pod template")

    for (role, number), wanted in GRPC_PEERS.items():
        pod = by_role.get(role)
        if pod is None:
            continue
        if number not in pod["ports"].values():
            bad(f"{pod['who']} has no container port {number}")
        peers = ingress_peers(policies, pod, number)
        if peers is None:
            bad(f"{pod['who']}: no NetworkPolicy isolates it: every pod may connect to {number}")
            continue
        if ANYONE in peers or any(set(p) != {"podSelector"} for p in peers):
            bad(f"{pod['who']}: port {number} admits peers beyond the namespace's pods: {peers}")
        allowed = {name(p) for peer in peers if peer != ANYONE and "podSelector" in peer
                   for p in matched(peer["podSelector"], pod["namespace"])}
        if allowed != wanted:
            bad(f"{pod['who']}: port {number} admits {sorted(allowed)}, not {sorted(wanted)}"
                f" (missing {sorted(wanted - allowed)}, extra {sorted(allowed - wanted)})")

    for role in sorted(ISOLATED):
        pod = by_role.get(role)
        if pod is None:
            continue
        for number in sorted(set(pod["ports"].values())):
            if (role, number) in GRPC_PEERS:
                continue
            if number not in pod["probe_ports"]:
                bad(f"{pod['who']}: container port {number} is neither a probe port nor in GRPC_PEERS")
                continue
            peers = ingress_peers(policies, pod, number)
            if peers is not None and ANYONE not in peers:
                bad(f"{pod['who']}: probe port {number} must admit every source (the kubelet "
                    f"cannot be named in a NetworkPolicy); admits {peers}")


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
            check_network_policies(objs, overlay, errors)
            print(f"overlays/{overlay}: {len(objs)} objects rendered with {renderer}")
    print(f"{len(files)} manifest files checked against Kubernetes {args.k8s_version}")
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
