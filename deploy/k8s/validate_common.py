"""What every check of deploy/k8s shares: where the tree lies, the two
namespaces, the pod roles (which object makes which pod), YAML loading, the
`bad(...)` collector each check reports through, and the helpers that read
pods, containers, mounts, Secrets and the Spark driver's --conf out of the
rendered objects.
"""

import pathlib
import re

import yaml


ROOT = pathlib.Path(__file__).resolve().parent
REPO = ROOT.parents[1]
# The two namespaces (base/namespace.yaml): Kindling's servers, clients and
# credentials; Spark's driver and executors, whose account creates pods.
NAMESPACE = "kindling"
SPARK_NAMESPACE = "kindling-spark"
# cert-manager's cluster resource namespace, where a ClusterIssuer reads its
# CA key (overlays/cert-manager/certificates.yaml).
CERT_MANAGER_NAMESPACE = "cert-manager"
CLUSTER_SCOPED = {"Namespace", "ClusterIssuer", "ClusterRole", "ClusterRoleBinding", "CertificateRequestPolicy"}


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def reporter(errors, where):
    """The `bad(msg)` every check reports through: appends `where: msg` to
    `errors` (where: the file or overlay, and the object, it is about)."""
    return lambda msg: errors.append(f"{where}: {msg}")


# Pod roles. Pods are named by the object that makes them, not by their
# labels (the labels are what is checked): the executor pod template is a file
# in a ConfigMap (`kubectl kustomize` appends a hash to the ConfigMap's name).
POD_ROLES = {
    "agent": [("DaemonSet", "kindling-agent")],
    # One replica on a volume (base), or replicas on etcd (overlays/rendezvous-ha).
    "rendezvous": [("Deployment", "kindling-rendezvous"), ("StatefulSet", "kindling-rendezvous")],
    "client": [("Job", "kindling-train-example")],
    "executor": [("ConfigMap", "spark-executor-pod-template")],
    "spark-connect": [("Deployment", "spark-connect")],
    "etcd": [("StatefulSet", "kindling-etcd")],
}
# Roles only some overlays have: the others must not, every overlay has the rest.
ONLY_IN = {"etcd": {"rendezvous-ha"}}
# The namespace each pod runs in: Spark's driver and executors in their own.
ROLE_NAMESPACE = {"agent": NAMESPACE, "rendezvous": NAMESPACE, "client": NAMESPACE, "etcd": NAMESPACE,
                  "executor": SPARK_NAMESPACE, "spark-connect": SPARK_NAMESPACE}
# Kindling's own servers: the tokens, TLS and metrics checks are about them.
SERVERS = {"agent", "rendezvous"}


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
        role = next((r for r, made_by in POD_ROLES.items() for kind, name in made_by
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
                     "ports": ports, "spec": spec,
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


def certificates(objs):
    """Certificates by the (namespace, Secret) they make."""
    return {(o["metadata"].get("namespace"), o["spec"]["secretName"]): o for o in objs if o["kind"] == "Certificate"}


def secret_key(ref):
    """A SecretKeySelector as (name, key), or None if it lacks either."""
    if isinstance(ref, dict) and ref.get("name") and ref.get("key"):
        return ref["name"], ref["key"]
    return None


def mounted_file(spec, container, path):
    """The (Secret, key) a container's file lies in, or None."""
    volumes = {v["name"]: v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    for m in container.get("volumeMounts", []):
        mount = m["mountPath"].rstrip("/") + "/"
        if path and path.startswith(mount) and m["name"] in volumes:
            return volumes[m["name"]], path[len(mount):]
    return None


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def mounted_secrets(spec):
    """The Secret names a pod spec mounts as volumes (plain or projected) or
    reads into its containers' environment."""
    names = set()
    for v in spec.get("volumes") or []:
        if "secret" in v:
            names.add(v["secret"]["secretName"])
        for src in (v.get("projected") or {}).get("sources") or []:
            if "secret" in src:
                names.add(src["secret"]["name"])
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
        for src in c.get("envFrom") or []:
            if "secretRef" in src:
                names.add(src["secretRef"]["name"])
    return names


def generated_secret_names():
    """The Secrets the base's secretGenerator makes."""
    base = docs(ROOT / "base" / "kustomization.yaml")[0]
    return {g["name"] for g in base.get("secretGenerator", [])}


def unhashed(name, generated):
    """A generated Secret's name without the hash `kubectl kustomize` appends."""
    for g in generated:
        if re.fullmatch(re.escape(g) + r"-[a-z0-9]{10}", name):
            return g
    return name


def secret_value(objs, namespace, name, key, generated):
    """A rendered Secret's value under `key` (data or stringData), or None."""
    for o in objs:
        if (o["kind"] == "Secret" and o["metadata"].get("namespace") == namespace
                and unhashed(o["metadata"]["name"], generated) == unhashed(name, generated)):
            data = {**(o.get("data") or {}), **(o.get("stringData") or {})}
            return data.get(key)
    return None


def driver_conf(objs):
    """The Spark driver's --conf settings (key -> value)."""
    conf, args = {}, [str(a) for c in containers(objs, "Deployment", "spark-connect") for a in c.get("args") or []]
    for flag, value in zip(args, args[1:]):
        if flag == "--conf":
            key, _, val = value.partition("=")
            conf[key] = val
    return conf
