"""Validates deploy/k8s: every manifest file, and each overlay as rendered.

Rendering uses `kubectl kustomize` when kubectl is installed; otherwise a
small built-in renderer that covers exactly what these overlays use
(resources, namespace, labels, images, generators, strategic-merge patches
of named DaemonSets). Schemas: kubernetes-validate, strict (unknown fields
are errors), offline.

On each rendered overlay also: every object lies in its namespace, Spark's
in SPARK_NAMESPACE and Kindling's in NAMESPACE (check_namespaces); TLS files
lie in mounted Secrets (made by Certificates under cert-manager); the
NetworkPolicies admit to each gRPC port of the agents, the rendezvous and
Spark Connect exactly the pods in GRPC_PEERS (and the overlay's
EXTERNAL_PEERS), resolved through the namespaces' and the rendered pod
templates' labels, and to Spark Connect's exactly the peers in EXACT_PEERS,
and every pod (agents, rendezvous, clients, the Spark driver, executors)
may dial exactly the destinations in validate_egress.EGRESS
(check_network_policies); every pod meets the "restricted" Pod Security
profile, only the Spark driver holds an API token and every pod mounts
exactly the Secrets in SECRETS_OF (check_pod_security); SPARK_NAMESPACE
holds no Secret but SPARK_SECRETS and only its accounts may create pods,
there alone (check_spark_namespace); Spark Connect takes its token from a
Secret, listens in plaintext on loopback only, and clients send the token
over TLS only, to the name its certificate carries (check_spark_connect);
each server reads its operator and viewer tokens from two different
rendered Secrets (check_tokens); every PodDisruptionBudget selects a
workload's pods and never blocks a drain (check_disruption_budgets); every
container requests and limits ephemeral-storage, within which its pod's
emptyDirs fit (check_ephemeral_storage). Where an overlay monitors
(overlays/monitoring): the ServiceMonitor and PodMonitor reach the servers'
metrics port with the viewer token and TLS (check_monitors); the Grafana dashboard and the alerts name
only metrics and labels the servers export (agent/src/metrics.rs,
agent/rendezvous/src/metrics.rs, agent/ops/src/exposition.rs), and, with promtool installed, parse as PromQL and
pass overlays/monitoring/alerts.test.yaml (check_promql_with_promtool).

Usage: validate.py [--k8s-version 1.31.0] [--renderer auto|kubectl|builtin]
"""

import argparse
import copy
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import kubernetes_validate
import yaml

from validate_egress import EGRESS, check_egress, policy_types

ROOT = pathlib.Path(__file__).resolve().parent
REPO = ROOT.parents[1]
# Each overlay and the image variant (tag suffix) its agents must run.
OVERLAYS = {"cpu": "cpu", "gpu": "gpu", "custom-agent": "cpu", "cert-manager": "cpu", "monitoring": "cpu"}
# Not Kubernetes objects on their own: kustomize inputs, partial patches,
# promtool's unit tests of the alerts.
NOT_OBJECTS = {"kustomization.yaml", "agent-gpu.yaml", "alerts.test.yaml"}
# The two namespaces (base/namespace.yaml): Kindling's servers, clients and
# credentials; Spark's driver and executors, whose account creates pods.
NAMESPACE = "kindling"
SPARK_NAMESPACE = "kindling-spark"
# cert-manager's cluster resource namespace, where a ClusterIssuer reads its
# CA key (overlays/cert-manager/certificates.yaml).
CERT_MANAGER_NAMESPACE = "cert-manager"
CLUSTER_SCOPED = {"Namespace", "ClusterIssuer", "ClusterRole", "ClusterRoleBinding"}


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
    if obj["kind"] in ("Issuer", "ClusterIssuer"):
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
        if (spec.get("issuerRef") or {}).get("kind", "Issuer") not in ("Issuer", "ClusterIssuer"):
            bad(f"issuerRef.kind {spec['issuerRef']['kind']!r} is not Issuer or ClusterIssuer")
        if not (spec.get("dnsNames") or spec.get("commonName")):
            bad("neither dnsNames nor commonName")
        if set(spec.get("usages", [])) - CERT_MANAGER_USAGES:
            bad(f"unknown usages {sorted(set(spec.get('usages', [])) - CERT_MANAGER_USAGES)}")
    else:
        bad("unexpected cert-manager kind")


# prometheus-operator's CRDs (monitoring.coreos.com/v1) have no schema here
# either: the fields these manifests may use, as in its Go types (v0.58 or
# later: `enableHttp2` on scrape endpoints). An unknown field is an error, as
# strict validation makes it for the built-in kinds (`enableHTTP2` is the
# ScrapeConfig CRD's spelling, ignored here).
MONITOR_SPEC_FIELDS = {
    "jobLabel", "podTargetLabels", "selector", "selectorMechanism", "namespaceSelector", "sampleLimit",
    "targetLimit", "scrapeProtocols", "fallbackScrapeProtocol", "labelLimit", "labelNameLengthLimit",
    "labelValueLengthLimit", "keepDroppedTargets", "attachMetadata", "scrapeClass", "bodySizeLimit",
}
MONITOR_KINDS = {
    # kind: (its endpoints' field, fields of its spec only, fields of its endpoints only)
    "ServiceMonitor": ("endpoints", {"targetLabels", "serviceDiscoveryRole"}, {"bearerTokenFile"}),
    "PodMonitor": ("podMetricsEndpoints", set(), {"portNumber"}),
}
ENDPOINT_FIELDS = {
    "port", "targetPort", "path", "scheme", "params", "interval", "scrapeTimeout", "honorLabels",
    "honorTimestamps", "trackTimestampsStaleness", "metricRelabelings", "relabelings", "filterRunning",
    "authorization", "basicAuth", "oauth2", "bearerTokenSecret", "followRedirects", "enableHttp2",
    "enableCompression", "tlsConfig", "proxyUrl", "noProxy", "proxyFromEnvironment", "proxyConnectHeader",
}
TLS_FIELDS = {"ca", "cert", "keySecret", "serverName", "insecureSkipVerify", "minVersion", "maxVersion"}
RULE_GROUP_FIELDS = {"name", "labels", "interval", "query_offset", "rules", "partial_response_strategy", "limit"}
RULE_FIELDS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
SEVERITIES = {"critical", "warning", "info"}
DURATION = re.compile(r"^(0|([0-9]+(ms|s|m|h|d|w|y))+)$")


def secret_key(ref):
    """A SecretKeySelector as (name, key), or None if it lacks either."""
    if isinstance(ref, dict) and ref.get("name") and ref.get("key"):
        return ref["name"], ref["key"]
    return None


def check_prometheus_operator(obj, where, name, errors):
    """The monitoring.coreos.com kinds these manifests use, on their own;
    check_monitors checks what they point at in a rendered overlay."""
    spec = obj.get("spec") or {}
    bad = lambda msg: errors.append(f"{where}: {name}: {msg}")  # noqa: E731
    if obj.get("apiVersion") != "monitoring.coreos.com/v1":
        bad(f"apiVersion {obj.get('apiVersion')!r} is not monitoring.coreos.com/v1")
    kind = obj.get("kind")
    if kind in MONITOR_KINDS:
        field, spec_only, endpoint_only = MONITOR_KINDS[kind]
        unknown = set(spec) - MONITOR_SPEC_FIELDS - spec_only - {field}
        if unknown:
            bad(f"unknown fields {sorted(unknown)}")
        selector = spec.get("selector") or {}
        if not selector.get("matchLabels") and not selector.get("matchExpressions"):
            bad("no selector: it would scrape every pod or Service of its namespaces")
        if (spec.get("namespaceSelector") or {}).get("any"):
            bad("namespaceSelector.any: scrapes every namespace")
        endpoints = spec.get(field) or []
        if not endpoints:
            bad(f"no {field}")
        for i, ep in enumerate(endpoints):
            at = f"{field}[{i}]"
            unknown = set(ep) - ENDPOINT_FIELDS - endpoint_only
            if unknown:
                bad(f"{at}: unknown fields {sorted(unknown)}")
            if not isinstance(ep.get("port"), str):
                bad(f"{at}: no port name")
            if str(ep.get("scheme", "http")).lower() not in ("http", "https"):
                bad(f"{at}: scheme {ep.get('scheme')!r} is not http or https")
            for d in ("interval", "scrapeTimeout"):
                if d in ep and not DURATION.match(str(ep[d])):
                    bad(f"{at}: {d} {ep[d]!r} is not a duration")
            auth = ep.get("authorization")
            if auth is not None:
                if set(auth) - {"type", "credentials"}:
                    bad(f"{at}.authorization: unknown fields {sorted(set(auth) - {'type', 'credentials'})}")
                if str(auth.get("type", "Bearer")).lower() == "basic":
                    bad(f"{at}.authorization: type Basic is not supported there")
                if secret_key(auth.get("credentials")) is None:
                    bad(f"{at}.authorization: credentials needs a Secret name and key")
            tls = ep.get("tlsConfig")
            if tls is not None:
                if set(tls) - TLS_FIELDS:
                    bad(f"{at}.tlsConfig: unknown fields {sorted(set(tls) - TLS_FIELDS)}")
                if tls.get("insecureSkipVerify"):
                    bad(f"{at}.tlsConfig: insecureSkipVerify sends the token to whoever answers")
                for k in ("ca", "cert"):
                    if k in tls and (set(tls[k]) != {"secret"} or secret_key(tls[k]["secret"]) is None):
                        bad(f"{at}.tlsConfig.{k}: needs secret: {{name, key}}")
                if "keySecret" in tls and secret_key(tls["keySecret"]) is None:
                    bad(f"{at}.tlsConfig.keySecret: needs a Secret name and key")
    elif kind == "PrometheusRule":
        if set(spec) - {"groups"}:
            bad(f"unknown fields {sorted(set(spec) - {'groups'})}")
        groups = spec.get("groups") or []
        if not groups:
            bad("no groups")
        seen_groups, seen_alerts = set(), set()
        for g in groups:
            gname = g.get("name")
            if not gname or gname in seen_groups:
                bad(f"group name {gname!r} missing or repeated")
            seen_groups.add(gname)
            if set(g) - RULE_GROUP_FIELDS:
                bad(f"group {gname}: unknown fields {sorted(set(g) - RULE_GROUP_FIELDS)}")
            if not g.get("rules"):
                bad(f"group {gname}: no rules")
            for r in g.get("rules") or []:
                rname = r.get("alert") or r.get("record")
                at = f"group {gname}: {rname}"
                if set(r) - RULE_FIELDS:
                    bad(f"{at}: unknown fields {sorted(set(r) - RULE_FIELDS)}")
                if ("alert" in r) == ("record" in r):
                    bad(f"{at}: needs exactly one of alert, record")
                if not isinstance(r.get("expr"), str) or not r["expr"].strip():
                    bad(f"{at}: no expr")
                for d in ("for", "keep_firing_for"):
                    if d in r and not DURATION.match(str(r[d])):
                        bad(f"{at}: {d} {r[d]!r} is not a duration")
                if "alert" in r:
                    if r["alert"] in seen_alerts:
                        bad(f"{at}: alert named twice")
                    seen_alerts.add(r["alert"])
                    if (r.get("labels") or {}).get("severity") not in SEVERITIES:
                        bad(f"{at}: labels.severity must be one of {sorted(SEVERITIES)}")
                    if not (r.get("annotations") or {}).get("summary"):
                        bad(f"{at}: no summary annotation")
    else:
        bad("unexpected monitoring.coreos.com kind")


def check(obj, where, version, errors):
    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if str(obj.get("apiVersion", "")).startswith("cert-manager.io/"):
        check_cert_manager(obj, where, name, errors)
        return name
    if str(obj.get("apiVersion", "")).startswith("monitoring.coreos.com/"):
        check_prometheus_operator(obj, where, name, errors)
        return name
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        errors.append(f"{where}: {name}: {e.message} at {'.'.join(map(str, e.path))}")
    except kubernetes_validate.SchemaNotFoundError as e:
        errors.append(f"{where}: {name}: no schema: {e}")
    return name


# The files base/secrets must hold (git-ignored; each operator makes their
# own): throwaway stand-ins, so validation never reads the real ones. The
# viewer token differs from the token, as the servers require.
PLACEHOLDER_SECRETS = {
    "token": "validate-only-not-a-secret\n",
    "credential-key": "validate-only-not-a-secret-key-of-32-bytes\n",
    "viewer-token": "validate-only-not-a-secret-viewer\n",
    "spark-connect-token": "validate-only-not-a-secret-spark-connect\n",
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


def check_namespaces(objs, overlay, errors):
    """Both namespaces are rendered; every namespaced object names one of
    them (cert-manager's own objects may also live in
    CERT_MANAGER_NAMESPACE), a cluster-scoped one none; each pod runs in its
    role's namespace (ROLE_NAMESPACE). Without a namespace `kubectl apply -k`
    puts an object in the context's namespace, and a kustomization's
    `namespace:` would move Spark's pods, and what its account may create,
    next to Kindling's Secrets."""
    bad = lambda msg: errors.append(f"overlays/{overlay}: {msg}")  # noqa: E731
    rendered = {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"}
    for ns in (NAMESPACE, SPARK_NAMESPACE):
        if ns not in rendered:
            bad(f"no Namespace {ns} (base/namespace.yaml)")
    for o in objs:
        ns, what = o["metadata"].get("namespace"), f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] in CLUSTER_SCOPED:
            if ns:
                bad(f"{what} is cluster-scoped but names namespace {ns!r}")
        elif ns == CERT_MANAGER_NAMESPACE and str(o.get("apiVersion", "")).startswith("cert-manager.io/"):
            continue
        elif ns not in (NAMESPACE, SPARK_NAMESPACE):
            bad(f"{what} is in namespace {ns!r}, not {NAMESPACE!r} or {SPARK_NAMESPACE!r} "
                "(name it in metadata.namespace; no kustomization may set `namespace:`)")
    for pod in pod_templates(objs):
        want = ROLE_NAMESPACE.get(pod["role"])
        if want and pod["namespace"] != want:
            bad(f"{pod['who']} ({pod['role']}) is in namespace {pod['namespace']!r}, not {want!r}")


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


def check_tls(objs, overlay, errors):
    """Every KINDLING_TLS_* file lies in a mounted Secret; with cert-manager,
    a Certificate in the pod's namespace makes each such Secret, every
    Certificate's issuer exists (an Issuer of its namespace, or a
    ClusterIssuer whose CA key a Certificate in CERT_MANAGER_NAMESPACE
    makes), and the agents' and the rendezvous' certificates carry the names
    clients dial. (Spark Connect's: check_spark_connect.)"""
    bad = lambda msg: errors.append(f"overlays/{overlay}: {msg}")  # noqa: E731
    secrets = set()
    env_by_role = {}
    for pod in pod_templates(objs):
        for c in pod["spec"].get("containers", []):
            env = env_of(c)
            if pod["role"]:
                env_by_role.setdefault(pod["role"], env)
            for key in ("KINDLING_TLS_CERT", "KINDLING_TLS_KEY", "KINDLING_TLS_CA"):
                if env.get(key) is None:
                    continue
                found = mounted_file(pod["spec"], c, env[key])
                if found is None:
                    bad(f"{pod['who']}: {key}={env[key]} is in no mounted Secret")
                else:
                    secrets.add((pod["namespace"], found[0]))
    certs = certificates(objs)
    if not certs:
        return
    issuers = {(o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs if o["kind"] == "Issuer"}
    cluster_issuers = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterIssuer"}
    for (ns, _), c in sorted(certs.items()):
        ref = c["spec"]["issuerRef"]
        what = f"Certificate/{c['metadata']['name']} in {ns}"
        if ref.get("kind", "Issuer") == "Issuer" and (ns, ref["name"]) not in issuers:
            bad(f"{what}: no Issuer {ref['name']} in its namespace")
        elif ref.get("kind") == "ClusterIssuer" and ref["name"] not in cluster_issuers:
            bad(f"{what}: no ClusterIssuer {ref['name']}")
    for name, ci in sorted(cluster_issuers.items()):
        key = ((ci["spec"].get("ca") or {}).get("secretName"))
        if key and (CERT_MANAGER_NAMESPACE, key) not in certs:
            bad(f"ClusterIssuer/{name}: no Certificate in {CERT_MANAGER_NAMESPACE} (cert-manager's cluster "
                f"resource namespace) makes its CA Secret {key}")
    for ns, secret in sorted(secrets - set(certs)):
        bad(f"Secret {secret} is mounted for TLS in {ns} but no Certificate there makes it")
    agent = env_by_role.get("agent", {})
    rendezvous_host = (agent.get("KINDLING_RENDEZVOUS") or "").split("://")[-1].rsplit(":", 1)[0]
    wanted = [("kindling-rendezvous-tls", rendezvous_host), ("kindling-agent-tls", agent.get("KINDLING_TLS_SERVER_NAME"))]
    for secret, name in wanted:
        names = certs.get((NAMESPACE, secret), {}).get("spec", {}).get("dnsNames", [])
        if name not in names:
            bad(f"the certificate in {secret} lacks {name!r} (has {names})")


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
# The namespace each pod runs in: Spark's driver and executors in their own.
ROLE_NAMESPACE = {"agent": NAMESPACE, "rendezvous": NAMESPACE, "client": NAMESPACE,
                  "executor": SPARK_NAMESPACE, "spark-connect": SPARK_NAMESPACE}
# Each gRPC port of a Kindling server and exactly the pods that may connect
# to it, in whichever namespace they run (executors push from theirs).
GRPC_PEERS = {
    ("agent", 50051): {"executor", "agent", "client"},  # Flight + collective ring
    ("rendezvous", 7070): {"agent", "client"},
    # Spark Connect (its TLS sidecar): any caller's plans and UDFs, given
    # Spark Connect's token.
    ("spark-connect", 15002): {"client"},
    # The driver's RPC and block manager.
    ("spark-connect", 7078): {"executor"},
    ("spark-connect", 7079): {"executor"},
}
# The peers a port admits, exactly as written. GRPC_PEERS sees the pods these
# manifests make; a peer also admits every pod its selectors will match, and
# Spark's account creates pods with any label in SPARK_NAMESPACE. So Spark
# Connect admits client pods of NAMESPACE only: a bare podSelector there
# would admit a pod of SPARK_NAMESPACE labelled kindling-client.
CLIENT_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
               "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kindling-client"}}}
EXACT_PEERS = {("spark-connect", 15002): [CLIENT_PEER]}
# The only pods an Ingress policy may isolate: Spark's executors need
# traffic (from the driver and each other) no policy here allows. Egress:
# every role's exactly as in EGRESS (validate_egress.py).
ISOLATED = {"agent", "rendezvous", "spark-connect"}
# Kindling's own servers: the tokens, TLS and metrics checks are about them.
SERVERS = {"agent", "rendezvous"}
# The one pod that may hold a Kubernetes API token: the Spark driver creates
# its executors. Every other pod runs with none.
API_TOKEN_ROLES = {"spark-connect"}
# The Secrets each pod may mount (volumes, projected volumes, env), by name
# without kustomize's hash: an executor holds the client certificate and
# nothing of the cluster's; Spark Connect's token only its server and the
# clients.
SECRETS_OF = {
    "agent": {"kindling-token", "kindling-viewer-token", "kindling-credential-key", "kindling-agent-tls"},
    "rendezvous": {"kindling-token", "kindling-viewer-token", "kindling-rendezvous-tls"},
    "client": {"kindling-token", "kindling-client-tls", "spark-connect-token"},
    "executor": {"kindling-client-tls"},
    "spark-connect": {"spark-connect-token", "spark-connect-tls"},
}
# Every Secret SPARK_NAMESPACE may hold: whoever may create a pod there (the
# Spark driver's account, so any code that runs on the driver) can mount it.
SPARK_SECRETS = {
    "kindling-client-tls": "the executors' client certificate",
    "spark-connect-token": "Spark Connect's own token",
    "spark-connect-tls": "Spark Connect's server certificate",
}
# Pods whose root filesystem must be read-only (Spark's pods write under
# their image's work directory).
READ_ONLY_ROOT = {"agent", "rendezvous", "client"}
ANYONE = "anyone"
# Peers outside the namespace, by overlay, and the gRPC ports they may reach,
# exactly: Prometheus scrapes /metrics there (overlays/monitoring,
# prometheus-network-policy.yaml).
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
              "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
EXTERNAL_PEERS = {
    "monitoring": {("agent", 50051): [PROMETHEUS], ("rendezvous", 7070): [PROMETHEUS]},
}


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


def canonical(peer):
    return json.dumps(peer, sort_keys=True)


def internal_peer(peer, namespace, rendered):
    """(namespace, podSelector) of a NetworkPolicy peer that names pods of
    one of the `rendered` namespaces (a bare podSelector: the policy's own
    `namespace`; a namespaceSelector on kubernetes.io/metadata.name alone,
    with or without a podSelector), else None: a peer outside these
    manifests."""
    if peer == ANYONE:
        return None
    if set(peer) == {"podSelector"}:
        return namespace, peer["podSelector"] or {}
    if set(peer) - {"podSelector"} != {"namespaceSelector"}:
        return None
    selector = peer["namespaceSelector"] or {}
    names = selector.get("matchLabels") or {}
    if set(selector) != {"matchLabels"} or set(names) != {"kubernetes.io/metadata.name"}:
        return None
    if names["kubernetes.io/metadata.name"] not in rendered:
        return None
    return names["kubernetes.io/metadata.name"], peer.get("podSelector") or {}


def check_network_policies(objs, overlay, errors):
    """The gRPC ports of the agents, the rendezvous and Spark Connect admit
    exactly the pods in GRPC_PEERS, across the two namespaces, and the
    overlay's EXTERNAL_PEERS; the ports in EXACT_PEERS admit exactly those
    peers as written; probe ports admit every source; every selector in a
    policy matches the labels of a pod the manifests make in the namespace
    it names (a renamed label fails here); each pod may dial exactly its
    destinations in EGRESS (validate_egress.check_egress)."""
    bad = lambda msg: errors.append(f"overlays/{overlay}: {msg}")  # noqa: E731
    external = EXTERNAL_PEERS.get(overlay, {})
    known_external = [p for peers in external.values() for p in peers]
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    if not policies:
        bad("no NetworkPolicy")
        return
    pods = pod_templates(objs)
    by_role = {p["role"]: p for p in pods if p["role"]}
    for role in sorted(set(POD_ROLES) - set(by_role)):
        bad(f"no pod template for {role} ({'/'.join(POD_ROLES[role])})")
    name = lambda p: p["role"] or p["who"]  # noqa: E731
    rendered = {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"}

    def matched(selector, namespace):
        return [p for p in pods if p["namespace"] == namespace and selects(selector, p["labels"])]

    def peer_pods(peer, namespace):
        inside_namespace, selector = internal_peer(peer, namespace, rendered)
        return matched(selector, inside_namespace)

    for pol in policies:
        where = f"NetworkPolicy/{pol['metadata']['name']}"
        ns = pol["metadata"].get("namespace")
        spec = pol.get("spec") or {}
        targets = matched(spec.get("podSelector") or {}, ns)
        if "Egress" in policy_types(pol):
            for t in targets:
                if t["role"] not in EGRESS:
                    bad(f"{where} restricts the egress of {name(t)}: only {sorted(EGRESS)} may be restricted")
        if not targets:
            bad(f"{where}: podSelector {spec.get('podSelector')} matches no pod template")
        for t in targets:
            if "Ingress" in policy_types(pol) and t["role"] not in ISOLATED:
                bad(f"{where} selects {name(t)}: only {sorted(ISOLATED)} may be isolated")
        for rule in spec.get("ingress") or []:
            for peer in rule.get("from") or []:
                if peer in known_external:
                    continue
                inside = internal_peer(peer, ns, rendered)
                if inside is None:
                    bad(f"{where}: peer {peer} names no pods of {sorted(rendered)} (a podSelector, with a "
                        "namespaceSelector on kubernetes.io/metadata.name for another namespace)"
                        " and is not in EXTERNAL_PEERS for this overlay")
                elif not matched(inside[1], inside[0]):
                    bad(f"{where}: peer {peer} matches no pod template in namespace {inside[0]}")

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
        outside = [p for p in peers if internal_peer(p, pod["namespace"], rendered) is None]
        wanted_outside = external.get((role, number), [])
        if sorted(map(canonical, outside)) != sorted(map(canonical, wanted_outside)):
            bad(f"{pod['who']}: port {number} admits from outside {sorted(rendered)} {outside}, "
                f"not {wanted_outside} (EXTERNAL_PEERS)")
        allowed = {name(p) for peer in peers if peer not in outside
                   for p in peer_pods(peer, pod["namespace"])}
        if allowed != wanted:
            bad(f"{pod['who']}: port {number} admits {sorted(allowed)}, not {sorted(wanted)}"
                f" (missing {sorted(wanted - allowed)}, extra {sorted(allowed - wanted)})")
        exact = EXACT_PEERS.get((role, number))
        if exact is not None and sorted(map(canonical, peers)) != sorted(map(canonical, exact + wanted_outside)):
            bad(f"{pod['who']}: port {number} admits the peers {peers}, not exactly {exact} (EXACT_PEERS): "
                f"only {sorted(wanted)} pods of the namespace named there, nothing of {SPARK_NAMESPACE}")

    def resolve(peer, namespace):
        inside = internal_peer(peer, namespace, rendered)
        return None if inside is None else (*inside, matched(inside[1], inside[0]))

    check_egress(overlay, pods, policies, resolve, selects, driver_conf(objs), bad)

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


def check_pod_security(objs, overlay, errors):
    """Every pod the manifests make meets Kubernetes' "restricted" Pod
    Security profile (non-root, RuntimeDefault seccomp, no privilege
    escalation, every capability dropped, no host namespaces or paths);
    Kindling's own pods also run on a read-only root filesystem. Only the
    Spark driver mounts a Kubernetes API token (executors run under an
    account of their own, bound to no Role, with none), and each pod mounts
    no Secret but those SECRETS_OF allows its role."""
    bad = lambda msg: errors.append(f"overlays/{overlay}: {msg}")  # noqa: E731
    generated = generated_secret_names()
    accounts = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o
                for o in objs if o["kind"] == "ServiceAccount"}
    bound = {(sub.get("namespace") or o["metadata"].get("namespace"), sub["name"])
             for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
             for sub in o.get("subjects") or [] if sub.get("kind") == "ServiceAccount"}
    spark_conf = " ".join(str(a) for c in containers(objs, "Deployment", "spark-connect")
                          for a in (c.get("args") or []))
    for pod in pod_templates(objs):
        if pod["role"] is None:
            continue
        spec, who = pod["spec"], pod["who"]
        psc = spec.get("securityContext") or {}
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(key):
                bad(f"{who}: {key}")
        for v in spec.get("volumes") or []:
            if "hostPath" in v:
                bad(f"{who}: hostPath volume {v['name']}")
        if (psc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            bad(f"{who}: no RuntimeDefault seccomp profile")
        for c in spec.get("containers") or []:
            csc = c.get("securityContext") or {}
            if not (csc.get("runAsNonRoot", psc.get("runAsNonRoot"))):
                bad(f"{who}: container {c['name']} may run as root (runAsNonRoot)")
            if csc.get("allowPrivilegeEscalation") is not False:
                bad(f"{who}: container {c['name']} allows privilege escalation")
            if csc.get("privileged"):
                bad(f"{who}: container {c['name']} is privileged")
            if "ALL" not in ((csc.get("capabilities") or {}).get("drop") or []):
                bad(f"{who}: container {c['name']} keeps capabilities (drop ALL)")
            if pod["role"] in READ_ONLY_ROOT and not csc.get("readOnlyRootFilesystem"):
                bad(f"{who}: container {c['name']} writes its root filesystem")
        account = spec.get("serviceAccountName", "default")
        if pod["role"] == "executor":
            wanted = f"spark.kubernetes.authenticate.executor.serviceAccountName={account}"
            if wanted not in spark_conf:
                bad(f"{who}: the driver does not start executors under {account!r} ({wanted})")
            if (pod["namespace"], account) in bound:
                bad(f"{who}: the executors' account {account!r} is bound to a Role")
        automount = spec.get("automountServiceAccountToken",
                             (accounts.get((pod["namespace"], account)) or {}).get("automountServiceAccountToken", True))
        if automount and pod["role"] not in API_TOKEN_ROLES:
            bad(f"{who}: mounts the API token of service account {account!r}")
        if pod["role"] in SECRETS_OF:
            extra = {unhashed(s, generated) for s in mounted_secrets(spec)} - SECRETS_OF[pod["role"]]
            if extra:
                bad(f"{who}: mounts Secrets {sorted(extra)} (may: {sorted(SECRETS_OF[pod['role']])})")


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


def grants(rule, verbs, resource):
    """Whether an RBAC rule grants one of `verbs` on the core `resource`."""
    return bool(set(rule.get("apiGroups") or []) & {"", "*"}
                and set(rule.get("resources") or []) & {resource, "*"}
                and set(rule.get("verbs") or []) & (set(verbs) | {"*"}))


def is_spark_subject(subject, namespace):
    """Whether a binding's subject is an account, or every account, of SPARK_NAMESPACE."""
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return (subject.get("namespace") or namespace) == SPARK_NAMESPACE
    return kind == "Group" and name in ("system:serviceaccounts", f"system:serviceaccounts:{SPARK_NAMESPACE}",
                                        "system:authenticated")


def driver_conf(objs):
    """The Spark driver's --conf settings (key -> value)."""
    conf, args = {}, [str(a) for c in containers(objs, "Deployment", "spark-connect") for a in c.get("args") or []]
    for flag, value in zip(args, args[1:]):
        if flag == "--conf":
            key, _, val = value.partition("=")
            conf[key] = val
    return conf


def check_spark_namespace(objs, overlay, errors):
    """SPARK_NAMESPACE, where the driver's account creates pods, holds no
    Secret but SPARK_SECRETS: none is rendered, made by a Certificate or
    named by a pod or pod template there. Only ServiceAccounts of
    SPARK_NAMESPACE may create pods, through a RoleBinding of SPARK_NAMESPACE
    (so in no other namespace); no ClusterRoleBinding lets anyone create
    pods or read Secrets; no binding gives an account of SPARK_NAMESPACE a
    right anywhere else; a binding's Role or ClusterRole is rendered here
    (else its rights are unknown); the driver runs as an account that may
    create pods, of its own namespace, and starts its executors there."""
    bad = lambda msg: errors.append(f"overlays/{overlay}: {msg}")  # noqa: E731
    generated = generated_secret_names()
    held = {}
    for o in objs:
        if o["metadata"].get("namespace") != SPARK_NAMESPACE:
            continue
        if o["kind"] == "Secret":
            held.setdefault(unhashed(o["metadata"]["name"], generated), f"Secret/{o['metadata']['name']}")
        elif o["kind"] == "Certificate":
            held.setdefault(o["spec"]["secretName"], f"Certificate/{o['metadata']['name']}")
    for pod in pod_templates(objs):
        if pod["namespace"] == SPARK_NAMESPACE:
            for s in sorted(mounted_secrets(pod["spec"])):
                held.setdefault(unhashed(s, generated), pod["who"])
    for secret, where in sorted(held.items()):
        if secret not in SPARK_SECRETS:
            bad(f"{where} puts Secret {secret} in {SPARK_NAMESPACE}, where the Spark driver's account can "
                f"create a pod that mounts it: only {sorted(SPARK_SECRETS)} may be there (SPARK_SECRETS)")

    roles = {(o["kind"], o["metadata"].get("namespace") if o["kind"] == "Role" else None, o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    may_create_pods = set()
    for b in (o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ns = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        where = f"{b['kind']}/{b['metadata']['name']}" + (f" in {ns}" if ns else "")
        ref = b.get("roleRef") or {}
        role = roles.get((ref.get("kind"), ns if ref.get("kind") == "Role" else None, ref.get("name")))
        subjects = b.get("subjects") or []
        if role is None:
            bad(f"{where} binds {ref.get('kind')}/{ref.get('name')}, which these manifests do not render: "
                "its rights cannot be checked")
            continue
        rules = role.get("rules") or []
        creates = any(grants(r, {"create"}, "pods") for r in rules)
        reads = any(grants(r, {"get", "list", "watch"}, "secrets") for r in rules)
        scope = ns or "every namespace"
        if b["kind"] == "ClusterRoleBinding" and (creates or reads):
            bad(f"{where} lets {subjects} {'create pods' if creates else 'read Secrets'} in every namespace, "
                f"{NAMESPACE} included")
        if creates and ns != SPARK_NAMESPACE and b["kind"] == "RoleBinding":
            bad(f"{where} lets {subjects} create pods in {ns}: pods may be created in {SPARK_NAMESPACE} only")
        for s in subjects:
            spark = is_spark_subject(s, ns)
            if creates:
                if s.get("kind") == "ServiceAccount" and spark:
                    may_create_pods.add(s["name"])
                else:
                    bad(f"{where} lets {s.get('kind')} {s.get('namespace') or ns}/{s.get('name')} create pods "
                        f"in {scope}: only ServiceAccounts of {SPARK_NAMESPACE} may")
            if spark and ns != SPARK_NAMESPACE:
                bad(f"{where} gives {s.get('kind')} {s.get('name')} of {SPARK_NAMESPACE} rights in {scope}: "
                    f"Spark's accounts may hold rights in {SPARK_NAMESPACE} only")

    server = next((p for p in pod_templates(objs) if p["role"] == "spark-connect"), None)
    if server is not None:
        account = server["spec"].get("serviceAccountName", "default")
        if account not in may_create_pods:
            bad(f"{server['who']}: its account {SPARK_NAMESPACE}/{account} may not create pods: "
                "the driver cannot start executors")
        conf, env = driver_conf(objs), {}
        for c in server["spec"].get("containers") or []:
            env.update({e["name"]: e for e in c.get("env") or []})
        where = conf.get("spark.kubernetes.namespace")
        own = where == SPARK_NAMESPACE or (
            where == "$(POD_NAMESPACE)"
            and ((env.get("POD_NAMESPACE") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
            == "metadata.namespace")
        if not own:
            bad(f"{server['who']}: spark.kubernetes.namespace={where!r}: the driver must start its executors in "
                f"its own namespace ({SPARK_NAMESPACE}, or $(POD_NAMESPACE) from metadata.namespace)")


SPARK_CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
SPARK_CONNECT_TOKEN_CONF = "spark.connect.authenticate.token"
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def parse_remote(url):
    """host, port and parameters of `sc://host[:port][/;key=value;...]`."""
    m = re.fullmatch(r"sc://(\[[^\]]+\]|[^:/;]+)(?::(\d+))?/?(;.*)?", url or "")
    if not m:
        return None
    params = dict(p.partition("=")[::2] for p in (m.group(3) or "").split(";") if p)
    return m.group(1), int(m.group(2) or 15002), params


def secret_value(objs, namespace, name, key, generated):
    """A rendered Secret's value under `key` (data or stringData), or None."""
    for o in objs:
        if (o["kind"] == "Secret" and o["metadata"].get("namespace") == namespace
                and unhashed(o["metadata"]["name"], generated) == unhashed(name, generated)):
            data = {**(o.get("data") or {}), **(o.get("stringData") or {})}
            return data.get(key)
    return None


def check_spark_connect(objs, overlay, errors):
    """Spark Connect's server takes its token from a Secret of its
    namespace (SPARK_CONNECT_TOKEN_ENV by secretKeyRef: never a literal
    value, never SPARK_CONNECT_TOKEN_CONF on the command line, where the
    process list and the SparkConf executors and the Config RPC read would
    show it) and serves plaintext gRPC on loopback only; its Service reaches
    another container, the TLS sidecar, which mounts its certificate from a
    Secret. Every client pod with SPARK_REMOTE dials that Service by name,
    with use_ssl=true and the token as $(VAR) of a secretKeyRef variable
    set before it, from a Secret holding the server's value, and trusts a
    CA from a mounted Secret (SSL_CERT_FILE). With cert-manager, a
    Certificate in the server's namespace makes the sidecar's Secret for
    every name clients dial, as a server certificate."""
    bad = lambda msg: errors.append(f"overlays/{overlay}: {msg}")  # noqa: E731
    generated = generated_secret_names()
    server = next((p for p in pod_templates(objs) if p["role"] == "spark-connect"), None)
    if server is None:
        return
    who, spec, ns = server["who"], server["spec"], server["namespace"]
    spark = next((c for c in spec.get("containers") or []
                  if "org.apache.spark.sql.connect.service.SparkConnectServer" in map(str, c.get("args") or [])), None)
    if spark is None:
        bad(f"{who}: no container runs SparkConnectServer")
        return
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        texts = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        texts += [str(e.get("value")) for e in c.get("env") or [] if "value" in e]
        if any(SPARK_CONNECT_TOKEN_CONF in x for x in texts):
            bad(f"{who}: container {c['name']} sets {SPARK_CONNECT_TOKEN_CONF} on its command line or in a "
                f"literal: the token would show in the process list and the SparkConf; take "
                f"{SPARK_CONNECT_TOKEN_ENV} from a Secret")
    entry = next((e for e in spark.get("env") or [] if e["name"] == SPARK_CONNECT_TOKEN_ENV), None)
    ref = ((entry or {}).get("valueFrom") or {}).get("secretKeyRef")
    server_token = None
    if entry is None:
        bad(f"{who}: no {SPARK_CONNECT_TOKEN_ENV}: Spark Connect runs every caller's plans and UDFs "
            "without authentication")
    elif "value" in entry:
        bad(f"{who}: {SPARK_CONNECT_TOKEN_ENV} is a literal value in the manifest: take it from a Secret "
            "(valueFrom.secretKeyRef)")
    elif secret_key(ref) is None:
        bad(f"{who}: {SPARK_CONNECT_TOKEN_ENV} does not come from a Secret (valueFrom.secretKeyRef with name and key)")
    else:
        server_token = secret_value(objs, ns, ref["name"], ref["key"], generated)
        if server_token is None:
            bad(f"{who}: {SPARK_CONNECT_TOKEN_ENV}: the overlay renders no Secret {ref['name']} with key "
                f"{ref['key']} in {ns}")
    conf = driver_conf(objs)
    address = conf.get("spark.connect.grpc.binding.address")
    if address not in LOOPBACK:
        bad(f"{who}: Spark Connect listens in plaintext on {address or 'every address'}: bind it to loopback "
            "(spark.connect.grpc.binding.address=127.0.0.1) behind the TLS sidecar")
    plain_port = int(conf.get("spark.connect.grpc.binding.port", 15002))
    port_owner = {}  # container port, by name and by number -> (container, number)
    for c in spec.get("containers") or []:
        for cp in c.get("ports") or []:
            for key in (cp["containerPort"], cp.get("name")):
                if key is not None:
                    port_owner[key] = (c, cp["containerPort"])
    if plain_port in port_owner:
        bad(f"{who}: the plaintext port {plain_port} is a container port")

    dialled, tls_secrets = {}, set()
    services = [s for s in objs if s["kind"] == "Service" and s["metadata"].get("namespace") == ns
                and s["spec"].get("selector") and selects({"matchLabels": s["spec"]["selector"]}, server["labels"])]
    if not services:
        bad(f"{who}: no Service in {ns} selects it")
    for svc in services:
        for sp in svc["spec"].get("ports") or []:
            target = sp.get("targetPort", sp["port"])
            owner = port_owner.get(target)
            if owner is None:
                bad(f"Service/{svc['metadata']['name']} port {sp['port']}: no container port {target!r}")
                continue
            c, name = owner[0], svc["metadata"]["name"]
            for host in (f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"):
                dialled[(host, sp["port"])] = svc
            if c is spark:
                bad(f"Service/{svc['metadata']['name']} port {sp['port']} reaches the Spark container directly, "
                    "in plaintext: point it at the TLS sidecar")
                continue
            volumes = {v["name"]: v["secret"]["secretName"] for v in spec.get("volumes") or [] if "secret" in v}
            mounted = {volumes[m["name"]] for m in c.get("volumeMounts") or [] if m["name"] in volumes}
            if not mounted:
                bad(f"Service/{svc['metadata']['name']} port {sp['port']}: container {c['name']} mounts no Secret, "
                    "so no certificate: it serves no TLS")
            tls_secrets |= mounted

    hosts = set()
    for pod in pod_templates(objs):
        for c in pod["spec"].get("containers") or []:
            env_list = c.get("env") or []
            names = [e["name"] for e in env_list]
            env = {e["name"]: e for e in env_list}
            if "SPARK_REMOTE" not in env or pod is server:
                continue
            at = f"{pod['who']}: container {c['name']}"
            remote = env["SPARK_REMOTE"].get("value")
            parsed = parse_remote(remote)
            if parsed is None:
                bad(f"{at}: SPARK_REMOTE {remote!r} is not sc://host:port/;key=value…")
                continue
            host, port, params = parsed
            if (host, port) not in dialled:
                bad(f"{at}: SPARK_REMOTE dials {host}:{port}, not Spark Connect's Service by name "
                    f"({sorted(h for h, _ in dialled)}; from another namespace a short name does not resolve)")
            hosts.add(host)
            if params.get("use_ssl") != "true":
                bad(f"{at}: SPARK_REMOTE lacks use_ssl=true: the token would cross the network in plaintext "
                    "(the client refuses to send it)")
            token = params.get("token")
            m = re.fullmatch(r"\$\((\w+)\)", token or "")
            if token is None:
                bad(f"{at}: SPARK_REMOTE carries no token: Spark Connect refuses the client")
            elif m is None:
                bad(f"{at}: SPARK_REMOTE carries a literal token: take it from a Secret, as $(VAR) of a "
                    "secretKeyRef variable")
            else:
                var = m.group(1)
                vref = ((env.get(var) or {}).get("valueFrom") or {}).get("secretKeyRef")
                if secret_key(vref) is None or names.index(var) > names.index("SPARK_REMOTE"):
                    bad(f"{at}: SPARK_REMOTE's token $({var}) is not a secretKeyRef variable set before "
                        "SPARK_REMOTE (Kubernetes expands only those)")
                else:
                    value = secret_value(objs, pod["namespace"], vref["name"], vref["key"], generated)
                    if value is None:
                        bad(f"{at}: $({var}): the overlay renders no Secret {vref['name']} with key "
                            f"{vref['key']} in {pod['namespace']}")
                    elif server_token is not None and value != server_token:
                        bad(f"{at}: $({var}) from Secret {vref['name']} in {pod['namespace']} is not the "
                            f"server's token (Secret {ref['name']} in {ns}): make both from one file")
            ca = env.get("SSL_CERT_FILE", {}).get("value")
            if mounted_file(pod["spec"], c, ca) is None:
                bad(f"{at}: SSL_CERT_FILE {ca!r} is in no mounted Secret: the client cannot check Spark "
                    "Connect's certificate")
    certs = certificates(objs)
    if certs:
        for secret in sorted(tls_secrets):
            cert = certs.get((ns, secret))
            if cert is None:
                bad(f"Secret {secret} is mounted for Spark Connect's TLS in {ns} but no Certificate there makes it")
                continue
            names = cert["spec"].get("dnsNames") or []
            for host in sorted(hosts - set(names)):
                bad(f"the certificate in {secret} lacks {host!r}, which clients dial (has {names})")
            if "server auth" not in (cert["spec"].get("usages") or []):
                bad(f"Certificate/{cert['metadata']['name']} in {ns}: no `server auth` usage")


QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
FACTOR = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
          "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}


def quantity(q):
    """A Kubernetes quantity in base units, or None if it is not one."""
    m = QUANTITY.match(str(q))
    return float(m.group(1)) * FACTOR[m.group(2)] if m else None


def check_ephemeral_storage(objs, overlay, errors):
    """Every container (and init container) of every pod the manifests make,
    the executor template's included, requests and limits
    ephemeral-storage, the request within the limit; every emptyDir on disk
    has a sizeLimit; and each pod's limits add up to at least its disk
    emptyDirs' sizeLimits, which count against them, so the kubelet never
    evicts a pod for volumes that are within their own limits."""
    bad = lambda msg: errors.append(f"overlays/{overlay}: {msg}")  # noqa: E731
    for pod in pod_templates(objs):
        spec, total, volumes = pod["spec"], 0.0, 0.0
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            res = c.get("resources") or {}
            request = quantity((res.get("requests") or {}).get("ephemeral-storage"))
            limit = quantity((res.get("limits") or {}).get("ephemeral-storage"))
            at = f"{pod['who']}: container {c['name']}"
            if request is None or limit is None:
                bad(f"{at}: needs resources.requests and resources.limits of ephemeral-storage "
                    f"(has {res.get('requests', {}).get('ephemeral-storage')!r}, "
                    f"{res.get('limits', {}).get('ephemeral-storage')!r})")
                continue
            if request > limit:
                bad(f"{at}: ephemeral-storage request {res['requests']['ephemeral-storage']} exceeds its limit "
                    f"{res['limits']['ephemeral-storage']}")
            if c in (spec.get("containers") or []):
                total += limit
        for v in spec.get("volumes") or []:
            if "emptyDir" not in v or (v["emptyDir"] or {}).get("medium") == "Memory":
                continue
            size = quantity((v["emptyDir"] or {}).get("sizeLimit"))
            if size is None:
                bad(f"{pod['who']}: emptyDir {v['name']} has no sizeLimit: it may fill the node's disk")
            else:
                volumes += size
        if total and volumes > total:
            bad(f"{pod['who']}: its disk emptyDirs may hold {volumes / 2 ** 30:.2f} GiB but its containers' "
                f"ephemeral-storage limits add up to {total / 2 ** 30:.2f} GiB: the kubelet evicts it first")


WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"}


def check_disruption_budgets(objs, overlay, errors):
    """Every PodDisruptionBudget selects the pods of at least one workload
    of its namespace; no workload's pods are selected by two (the eviction
    API then refuses every eviction); none blocks a drain outright:
    maxUnavailable at least 1, minAvailable (never on a DaemonSet, whose
    pod count is the node count) below every selected workload's replicas,
    and unhealthyPodEvictionPolicy AlwaysAllow, so an unready pod never holds
    one up; every Deployment, StatefulSet and DaemonSet has one, so each
    says what a drain may do to it."""
    bad = lambda msg: errors.append(f"overlays/{overlay}: {msg}")  # noqa: E731
    workloads = [o for o in objs if o["kind"] in WORKLOADS]
    covered = {}
    for pdb in (o for o in objs if o["kind"] == "PodDisruptionBudget"):
        spec, ns = pdb.get("spec") or {}, pdb["metadata"].get("namespace")
        where = f"PodDisruptionBudget/{pdb['metadata']['name']} in {ns}"
        selector = spec.get("selector") or {}
        if not selector.get("matchLabels") and not selector.get("matchExpressions"):
            bad(f"{where}: an empty selector selects every pod of its namespace")
            continue
        hits = [w for w in workloads if w["metadata"].get("namespace") == ns
                and selects(selector, ((w["spec"].get("template") or {}).get("metadata") or {}).get("labels") or {})]
        if not hits:
            bad(f"{where}: selector {selector} selects no workload's pods")
        for w in hits:
            covered.setdefault((ns, w["kind"], w["metadata"]["name"]), []).append(pdb["metadata"]["name"])
        if ("minAvailable" in spec) == ("maxUnavailable" in spec):
            bad(f"{where}: needs exactly one of minAvailable, maxUnavailable")
        if spec.get("unhealthyPodEvictionPolicy") != "AlwaysAllow":
            bad(f"{where}: unhealthyPodEvictionPolicy is {spec.get('unhealthyPodEvictionPolicy')!r}, not "
                "AlwaysAllow: a pod that is not Ready could hold a drain up")
        if "maxUnavailable" in spec:
            value = spec["maxUnavailable"]
            if value in (0, "0", "0%"):
                bad(f"{where}: maxUnavailable {value!r} allows no eviction: it blocks every drain")
        if "minAvailable" in spec:
            value = spec["minAvailable"]
            for w in hits:
                what = f"{w['kind']}/{w['metadata']['name']}"
                if w["kind"] == "DaemonSet":
                    bad(f"{where}: minAvailable {value!r} on {what}, whose pod count is the node count, unknown "
                        "here: use maxUnavailable")
                    continue
                replicas = w["spec"].get("replicas", 1)
                floor = (-(-replicas * int(str(value).rstrip("%")) // 100) if str(value).endswith("%")
                         else int(value))
                if floor >= replicas:
                    bad(f"{where}: minAvailable {value!r} of {what}'s {replicas} replica(s) lets no pod be "
                        "evicted: it blocks every drain of their nodes")
    for w in workloads:
        key = (w["metadata"].get("namespace"), w["kind"], w["metadata"]["name"])
        names = covered.get(key, [])
        if not names:
            bad(f"{w['kind']}/{key[2]} in {key[0]}: no PodDisruptionBudget selects its pods: say what a drain "
                "may do to it")
        elif len(names) > 1:
            bad(f"{w['kind']}/{key[2]} in {key[0]}: its pods are selected by {len(names)} PodDisruptionBudgets "
                f"{sorted(names)}: the eviction API refuses every eviction of such a pod")


# Monitoring (overlays/monitoring). The metrics the servers export are read
# from their source: a metric or label renamed there fails here.
METRIC_SOURCES = ("agent/src/metrics.rs", "agent/rendezvous/src/metrics.rs", "agent/ops/src/exposition.rs")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Labels Prometheus gives every series it scrapes through a PodMonitor or a
# ServiceMonitor, and the metrics of its own the dashboard and alerts may use.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "service"}
PROMETHEUS_METRICS = {"up"}
# Grafana's own variables, and what stands for them when promtool parses.
GRAFANA_VARIABLES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Overlays that must scrape both servers and carry the alerts and a dashboard.
MONITORED = {"monitoring"}
DASHBOARD_LABEL = ("grafana_dashboard", "1")
ALERTS_TESTS = "alerts.test.yaml"
# Every alert is explained there.
ALERTS_DOC = "docs/operations.md"
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')


def exported_metrics():
    """(metric names, label names) the agents and the rendezvous export: the
    `"kindling_…"` literals of METRIC_SOURCES (outside their tests), each
    histogram's series, and the keys of the samples' labels."""
    names, labels = set(), set()
    for rel in METRIC_SOURCES:
        text = (REPO / rel).read_text().split("#[cfg(test)]")[0]
        names |= set(re.findall(r'"(kindling_[a-z_]+)"', text))
        # family(&mut e, "name", "help", MetricType::Kind) (and single(…)):
        # prometheus-client adds `_total` to a counter's samples and the
        # bucket, sum and count series (with their `le`) to a histogram's.
        for name, kind in re.findall(
            r'(?:family|single)\(\s*(?:&mut )?\w+,\s*"(kindling_[a-z_]+)",\s*"(?:[^"\\]|\\.)*",\s*MetricType::(\w+)', text
        ):
            if kind == "Counter":
                names.add(name + "_total")
            elif kind == "Histogram":
                names |= {name + s for s in HISTOGRAM_SUFFIXES}
                labels.add("le")
        # ("job_id", &job), ("agent", a), ("le", le.as_str()): a key, then a variable.
        labels |= set(re.findall(r'\(\s*"([a-z_]+)"\s*,\s*(?:[&*][\w.]+|\w+|\w+\.as_str\(\))\s*\)', text))
    labels = {name for name in labels if not name.startswith("kindling_")}
    if not names or not labels:
        raise SystemExit(f"no metrics found in {', '.join(METRIC_SOURCES)}: did the exposition move?")
    return names, labels


def promql_names(expr):
    """The metric names, the label names and the `by (…)` labels of a PromQL
    expression (string literals left out)."""
    bare = STRING.sub('""', expr)
    metrics = set(re.findall(r"(?<![\w:])kindling_[\w:]*", bare))
    metrics |= set(re.findall(r"(?<![\w:])([A-Za-z_:][\w:]*)\s*\{", bare))
    labels = set()
    for body in re.findall(r"\{([^}]*)\}", bare):
        labels |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", body))
    by = set()
    for op, body in re.findall(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", bare):
        names = {n.strip() for n in body.split(",") if n.strip()}
        labels |= names
        if op == "by":
            by |= names
    return metrics, labels, by


def template_labels(text):
    """Labels a Grafana legend (`{{job_id}}`) or an alert annotation
    (`{{ $labels.job_id }}`) prints."""
    return set(re.findall(r"\{\{\s*(?:\$labels\.)?([A-Za-z_]\w*)\s*\}\}", text or ""))


def check_promql(expr, where, exported, errors, printed="", jobs=None):
    """Only exported metrics and labels; what `printed` (a legend, the
    annotations) prints is a label the result can have; `job` matchers name
    the jobs the monitors give their series (`jobs`, where known)."""
    metrics, labels = exported
    for op, value in re.findall(r'(?<![\w])job\s*(=~|=)\s*"([^"]*)"', expr):
        for job in (value.split("|") if op == "=~" else [value]):
            if jobs is not None and job not in jobs:
                errors.append(f"{where}: job {job!r} is not a job the monitors scrape ({sorted(jobs)})")
    used, used_labels, by = promql_names(expr)
    for m in sorted(used - metrics - PROMETHEUS_METRICS):
        errors.append(f"{where}: {m} is not a metric the agents or the rendezvous export "
                      f"({', '.join(METRIC_SOURCES)}) nor one of Prometheus' {sorted(PROMETHEUS_METRICS)}")
    for name in sorted(used_labels - labels - TARGET_LABELS):
        errors.append(f"{where}: label {name!r} is on no series the agents or the rendezvous export")
    shown = template_labels(printed)
    for name in sorted(shown - labels - TARGET_LABELS):
        errors.append(f"{where}: prints label {name!r}, which no exported series has")
    if by and shown - by:
        errors.append(f"{where}: prints {sorted(shown - by)}, which `by ({', '.join(sorted(by))})` drops")


def grafana_to_promql(expr):
    """The expression as Prometheus gets it: Grafana's variables replaced."""
    def value(m):
        name = m.group(1) or m.group(2) or m.group(3)
        return GRAFANA_VARIABLES.get(name, ".*")
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", value, expr)


def check_dashboard(text, where, exported, errors, jobs=None):
    """A Grafana dashboard: parses; a `datasource` variable every query goes
    through; panels with unique ids and gridPos that do not overlap; every
    query names exported metrics and labels and defined variables. Returns
    (record name, PromQL) of every query, for promtool."""
    bad = lambda msg: errors.append(f"{where}: {msg}")  # noqa: E731
    try:
        dash = json.loads(text)
    except json.JSONDecodeError as e:
        bad(f"not JSON: {e}")
        return []
    for key in ("uid", "title", "schemaVersion", "templating", "panels"):
        if key not in dash:
            bad(f"no {key}")
    variables = {v.get("name"): v for v in (dash.get("templating") or {}).get("list", [])}
    ds = variables.get("datasource") or {}
    if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        bad("needs a variable `datasource` of type datasource, query prometheus")

    def through_variable(obj, at):
        if obj.get("datasource") is not None and obj["datasource"] != DATASOURCE:
            bad(f"{at}: datasource {obj['datasource']} is not {DATASOURCE}")

    def variables_of(expr, at):
        for m in re.finditer(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", expr):
            name = m.group(1) or m.group(2) or m.group(3)
            if name not in variables and name not in GRAFANA_VARIABLES:
                bad(f"{at}: variable ${name} is not defined")

    queries = []
    for name, v in variables.items():
        if v.get("type") != "query":
            continue
        through_variable(v, f"variable {name}")
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\(\s*(?:(.+?)\s*,\s*)?(\w+)\s*\)\s*", q or "")
        if not m:
            bad(f"variable {name}: {q!r} is not label_values(series, label)")
            continue
        series, label = m.groups()
        at = f"{where}: variable {name}"
        check_promql(series or "", at, exported, errors, printed=f"{{{{{label}}}}}")
        variables_of(series or "", at)
        if series:
            queries.append((f"dashboard:variable_{name}", grafana_to_promql(series)))

    panels = list(dash.get("panels") or [])
    for p in list(panels):
        panels += p.get("panels") or []  # inside collapsed rows
    ids, placed = set(), []
    for p in panels:
        at = f"panel {p.get('id')} {p.get('title')!r}"
        if not isinstance(p.get("id"), int) or p["id"] in ids:
            bad(f"{at}: id missing or repeated")
        ids.add(p.get("id"))
        gp = p.get("gridPos") or {}
        if not all(isinstance(gp.get(k), int) for k in "hwxy") or gp["w"] < 1 or gp["h"] < 1 \
                or gp["x"] < 0 or gp["x"] + gp["w"] > 24:
            bad(f"{at}: gridPos {gp} is not h, w, x, y within 24 columns")
        elif p in (dash.get("panels") or []):
            for other, ogp in placed:
                if gp["x"] < ogp["x"] + ogp["w"] and ogp["x"] < gp["x"] + gp["w"] \
                        and gp["y"] < ogp["y"] + ogp["h"] and ogp["y"] < gp["y"] + gp["h"]:
                    bad(f"{at}: overlaps {other}")
            placed.append((at, gp))
        if p.get("type") == "row":
            continue
        through_variable(p, at)
        targets = p.get("targets") or []
        if not targets:
            bad(f"{at}: no targets")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or not all(refs):
            bad(f"{at}: refIds {refs} missing or repeated")
        for t in targets:
            tat = f"{at} target {t.get('refId')}"
            through_variable(t, tat)
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                bad(f"{tat}: no expr")
                continue
            check_promql(expr, f"{where}: {tat}", exported, errors, printed=t.get("legendFormat", ""), jobs=jobs)
            variables_of(expr, tat)
            queries.append((f"dashboard:panel_{p.get('id')}_{t.get('refId')}", grafana_to_promql(expr)))
    return queries


def documented_expressions(doc):
    """Alert name -> expression (whitespace collapsed) in the doc's ```promql
    blocks, where each expression follows a comment line `# AlertName …`."""
    shown = {}
    for block in re.findall(r"```promql\n(.*?)```", doc, re.S):
        name = None
        for line in block.splitlines():
            m = re.match(r"#\s*(\w+)", line)
            if m and line.startswith("# ") and m.group(1)[0].isupper():
                name = m.group(1)
                shown[name] = ""
            elif name and not line.startswith("#"):
                shown[name] = " ".join((shown[name] + " " + line).split())
    return shown


def check_rules(rule, where, exported, errors, jobs=None):
    """A PrometheusRule's expressions and annotations name exported metrics
    and labels, and ALERTS_DOC names each alert and shows its expression
    (whitespace aside)."""
    doc = (REPO / ALERTS_DOC).read_text()
    shown = documented_expressions(doc)
    for g in rule["spec"].get("groups") or []:
        for r in g.get("rules") or []:
            name = r.get("alert") or r.get("record")
            at = f"{where}: {rule['kind']}/{rule['metadata']['name']}: {name}"
            printed = " ".join((r.get("annotations") or {}).values())
            expr = str(r.get("expr", ""))
            check_promql(expr, at, exported, errors, printed=printed, jobs=jobs)
            if r.get("alert") and f"`{r['alert']}`" not in doc:
                errors.append(f"{at}: {ALERTS_DOC} does not explain it")
            elif r.get("alert") and shown.get(r["alert"]) != " ".join(expr.split()):
                errors.append(f"{at}: {ALERTS_DOC}'s promql block shows another expression for it: "
                              f"{shown.get(r['alert'])!r}")


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


def check_tokens(objs, overlay, errors):
    """Each server (agent, rendezvous) reads its operator token and its
    viewer token from mounted Secrets the overlay renders, and not the same
    file: a server whose viewer token equals its operator token refuses to
    start."""
    secrets = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Secret"}
    for p in pod_templates(objs):
        if p["role"] not in SERVERS:
            continue
        for c in p["spec"].get("containers", []):
            env = env_of(c)
            files = {}
            for variable in ("KINDLING_TOKEN_FILE", "KINDLING_VIEWER_TOKEN_FILE"):
                if not env.get(variable):
                    errors.append(f"overlays/{overlay}: {p['who']}: no {variable}")
                    continue
                files[variable] = mounted_file(p["spec"], c, env[variable])
                if files[variable] is None:
                    errors.append(f"overlays/{overlay}: {p['who']}: {variable} {env[variable]} "
                                  "is not in a mounted Secret")
                    continue
                name, key = files[variable]
                if key not in {**(secrets.get(name, {}).get("data") or {}),
                               **(secrets.get(name, {}).get("stringData") or {})}:
                    errors.append(f"overlays/{overlay}: {p['who']}: {variable}: "
                                  f"the overlay renders no Secret {name} with key {key}")
            operator = files.get("KINDLING_TOKEN_FILE")
            if operator is not None and operator == files.get("KINDLING_VIEWER_TOKEN_FILE"):
                errors.append(f"overlays/{overlay}: {p['who']}: the viewer token is the operator token "
                              f"{operator}: the server refuses to start")


def check_monitors(objs, overlay, exported, errors):
    """Each ServiceMonitor and PodMonitor selects a Kindling server and
    scrapes /metrics on its main port with the viewer token the server
    reads (never the operator token), TLS as
    the server speaks it (the client identity the manifests mount, the name
    its certificate carries), through a NetworkPolicy peer in
    EXTERNAL_PEERS; rules and dashboards are checked as check_rules and
    check_dashboard say. Returns the PrometheusRules and the dashboards'
    queries, for promtool."""
    bad = lambda msg: errors.append(f"overlays/{overlay}: {msg}")  # noqa: E731
    monitors = [o for o in objs if o["kind"] in MONITOR_KINDS]
    rules = [o for o in objs if o["kind"] == "PrometheusRule"]
    dashboards = [o for o in objs if o["kind"] == "ConfigMap"
                  and (o["metadata"].get("labels") or {}).get(DASHBOARD_LABEL[0]) == DASHBOARD_LABEL[1]]
    if overlay in MONITORED and not rules:
        bad("no PrometheusRule")
    if overlay in MONITORED and not dashboards:
        bad(f"no ConfigMap labelled {'='.join(DASHBOARD_LABEL)} (a Grafana dashboard)")
    pods = pod_templates(objs)
    by_role = {p["role"]: p for p in pods if p["role"]}
    # Client identities (CA, certificate, key), each a (Secret, key): what
    # the manifests' clients mount.
    identities = set()
    for p in pods:
        if p["role"] in SERVERS:
            continue
        for c in p["spec"].get("containers", []):
            env = env_of(c)
            files = tuple(mounted_file(p["spec"], c, env.get(k))
                          for k in ("KINDLING_TLS_CA", "KINDLING_TLS_CERT", "KINDLING_TLS_KEY"))
            if all(files):
                identities.add(files)
    agent_env = env_of(by_role["agent"]["spec"]["containers"][0]) if "agent" in by_role else {}
    # The names clients check on the servers' certificates (check_tls checks
    # the certificates carry them).
    dialled = {"agent": agent_env.get("KINDLING_TLS_SERVER_NAME"),
               "rendezvous": (agent_env.get("KINDLING_RENDEZVOUS") or "").split("://")[-1].rsplit(":", 1)[0]}
    secrets = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Secret"}
    scraped = set()
    # The `job` label of each monitor's series: its jobLabel's value, else
    # the Service's name, or namespace/name for a PodMonitor.
    jobs = set()
    for m in monitors:
        kind, spec = m["kind"], m.get("spec") or {}
        mname = f"{kind}/{m['metadata']['name']}"
        namespaces = (spec.get("namespaceSelector") or {}).get("matchNames") or [m["metadata"].get("namespace")]
        selector = spec.get("selector") or {}
        service = None
        if kind == "ServiceMonitor":
            services = [o for o in objs if o["kind"] == "Service" and o["metadata"].get("namespace") in namespaces
                        and selects(selector, o["metadata"].get("labels") or {})]
            if len(services) != 1:
                bad(f"{mname}: selector {selector} matches Services "
                    f"{[s['metadata']['name'] for s in services]}, not exactly one")
                continue
            service = services[0]
            targets = [p for p in pods if p["namespace"] == service["metadata"].get("namespace")
                       and service["spec"].get("selector")
                       and selects({"matchLabels": service["spec"]["selector"]}, p["labels"])]
        else:
            targets = [p for p in pods if p["namespace"] in namespaces and selects(selector, p["labels"])]
        if not targets:
            bad(f"{mname}: selects no pod template")
            continue
        job_label = spec.get("jobLabel")
        sources = [service["metadata"].get("labels") or {}] if service else [t["labels"] for t in targets]
        if job_label and any(job_label not in labels for labels in sources):
            bad(f"{mname}: jobLabel {job_label} is not a label of the {'Service' if service else 'pods'}")
        elif job_label:
            jobs |= {labels[job_label] for labels in sources}
        elif service:
            jobs.add(service["metadata"]["name"])
        else:
            jobs.add(f"{m['metadata'].get('namespace')}/{m['metadata']['name']}")
        for ep in spec.get(MONITOR_KINDS[kind][0]) or []:
            for t in targets:
                at = f"{mname} -> {t['who']}"
                if t["role"] not in SERVERS:
                    bad(f"{at}: not a Kindling server ({sorted(SERVERS)})")
                    continue
                if service:
                    sp = next((q for q in service["spec"].get("ports", []) if q.get("name") == ep.get("port")), None)
                    if sp is None:
                        bad(f"{at}: Service {service['metadata']['name']} has no port {ep.get('port')!r}")
                        continue
                    target = sp.get("targetPort", sp["port"])
                    number = t["ports"].get(target) if isinstance(target, str) else target
                else:
                    number = t["ports"].get(ep.get("port"))
                if number is None:
                    bad(f"{at}: no container port {ep.get('port')!r}")
                    continue
                if (t["role"], number) not in GRPC_PEERS:
                    bad(f"{at}: port {number} is not the server's main port, where /metrics is served")
                    continue
                scraped.add(t["role"])
                if ep.get("path", "/metrics") != "/metrics":
                    bad(f"{at}: path {ep.get('path')!r} is not /metrics")
                if (t["role"], number) not in EXTERNAL_PEERS.get(overlay, {}):
                    bad(f"{at}: no peer in EXTERNAL_PEERS[{overlay!r}] admits Prometheus to {number}")
                c = next(c for c in t["spec"]["containers"]
                         if number in [q.get("containerPort") for q in c.get("ports", [])])
                env = env_of(c)
                # Prometheus holds the viewer token (it reads /metrics and
                # the status page, and calls nothing), never the operator
                # token: the server must read one, from a Secret, and the
                # monitor must send that one.
                variable = "KINDLING_VIEWER_TOKEN_FILE"
                token = mounted_file(t["spec"], c, env.get(variable))
                credentials = secret_key((ep.get("authorization") or {}).get("credentials"))
                operator = mounted_file(t["spec"], c, env.get("KINDLING_TOKEN_FILE"))
                if token is None:
                    bad(f"{at}: the server reads no viewer token from a Secret ({variable}): "
                        "Prometheus would need the operator token")
                elif credentials is not None and credentials == operator:
                    bad(f"{at}: authorization.credentials {credentials} is the operator token: "
                        f"scrape with the viewer token {token}")
                elif credentials != token:
                    bad(f"{at}: authorization.credentials {credentials} is not the server's {variable} {token}")
                elif token[1] not in {**(secrets.get(token[0], {}).get("data") or {}),
                                      **(secrets.get(token[0], {}).get("stringData") or {})}:
                    bad(f"{at}: the rendered base has no Secret {token[0]} with key {token[1]}")
                tls = ep.get("tlsConfig") or {}
                scheme = str(ep.get("scheme", "http")).lower()
                if not env.get("KINDLING_TLS_CERT"):
                    if scheme == "https" or tls:
                        bad(f"{at}: the server speaks no TLS")
                    continue
                if scheme != "https":
                    bad(f"{at}: the server speaks TLS: scheme must be https")
                if ep.get("enableHttp2") is not False:
                    bad(f"{at}: enableHttp2 must be false: HTTP/2 on that port is gRPC")
                if tls.get("serverName") != dialled[t["role"]]:
                    bad(f"{at}: tlsConfig.serverName {tls.get('serverName')!r} is not {dialled[t['role']]!r}, "
                        "the name clients check on its certificate")
                files = (secret_key((tls.get("ca") or {}).get("secret")),
                         secret_key((tls.get("cert") or {}).get("secret")), secret_key(tls.get("keySecret")))
                if env.get("KINDLING_TLS_CLIENT_AUTH") == "true":
                    if files not in identities:
                        bad(f"{at}: the server requires a client certificate: tlsConfig (ca, cert, keySecret) "
                            f"{files} is not a client identity the manifests mount: {sorted(identities)}")
                elif files[0] not in {i[0] for i in identities}:
                    bad(f"{at}: tlsConfig.ca {files[0]} is not the CA the manifests' clients trust")
    if overlay in MONITORED:
        for role in sorted(SERVERS - scraped):
            bad(f"no ServiceMonitor or PodMonitor scrapes the {role}")
    queries = []
    for r in rules:
        check_rules(r, f"overlays/{overlay}", exported, errors, jobs=jobs)
    for cm in dashboards:
        for key, text in (cm.get("data") or {}).items():
            where = f"overlays/{overlay}: ConfigMap/{cm['metadata']['name']}:{key}"
            if not key.endswith(".json"):
                errors.append(f"{where}: a dashboard's key must end in .json")
                continue
            queries += check_dashboard(text, where, exported, errors, jobs=jobs)
    return rules, queries


def check_promql_with_promtool(root, overlay, rules, queries, tmp, errors):
    """promtool parses every alert and dashboard query and runs the
    overlay's ALERTS_TESTS against its PrometheusRules. Returns what it did,
    for the summary; None without promtool."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return None
    work = pathlib.Path(tmp) / f"promtool-{overlay}"
    work.mkdir()
    groups = [g for r in rules for g in r["spec"]["groups"]]
    rule_file = work / "rules.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": groups}))
    # The rule file the tests name (rule_files): the alerts with their
    # summary as their only annotation, so the tests need not repeat the
    # descriptions.
    summaries = copy.deepcopy(groups)
    for g in summaries:
        for r in g.get("rules") or []:
            if "annotations" in r:
                r["annotations"] = {k: v for k, v in r["annotations"].items() if k == "summary"}
    (work / "kindling-rules.yaml").write_text(yaml.safe_dump({"groups": summaries}))
    query_file = work / "dashboard-queries.yaml"
    query_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": name, "expr": expr} for name, expr in queries]}]}))
    done = []
    run = lambda *args: subprocess.run([promtool, *args], capture_output=True, text=True)  # noqa: E731
    checked = run("check", "rules", str(rule_file), str(query_file))
    if checked.returncode != 0:
        errors.append(f"overlays/{overlay}: promtool check rules:\n{checked.stdout}{checked.stderr}")
    else:
        done.append(f"{len(queries)} dashboard queries and the alerts parsed")
    tests = root / "overlays" / overlay / ALERTS_TESTS
    if tests.exists():
        shutil.copy(tests, work / ALERTS_TESTS)
        tested = run("test", "rules", str(work / ALERTS_TESTS))
        if tested.returncode != 0:
            errors.append(f"overlays/{overlay}: promtool test rules {ALERTS_TESTS}:\n{tested.stdout}{tested.stderr}")
        else:
            done.append(f"{ALERTS_TESTS} passed")
    elif overlay in MONITORED:
        errors.append(f"overlays/{overlay}: no {ALERTS_TESTS}")
    return "; ".join(done)


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
    exported = exported_metrics()
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
            check_namespaces(objs, overlay, errors)
            check_tls(objs, overlay, errors)
            check_network_policies(objs, overlay, errors)
            check_pod_security(objs, overlay, errors)
            check_spark_namespace(objs, overlay, errors)
            check_spark_connect(objs, overlay, errors)
            check_tokens(objs, overlay, errors)
            check_disruption_budgets(objs, overlay, errors)
            check_ephemeral_storage(objs, overlay, errors)
            rules, queries = check_monitors(objs, overlay, exported, errors)
            print(f"overlays/{overlay}: {len(objs)} objects rendered with {renderer}")
            if rules or queries:
                alerts = sum(1 for r in rules for g in r["spec"]["groups"] for x in g["rules"] if "alert" in x)
                print(f"overlays/{overlay}: {alerts} alerts and {len(queries)} dashboard queries name only "
                      f"the {len(exported[0])} exported metrics and their labels")
                done = check_promql_with_promtool(root, overlay, rules, queries, tmp, errors)
                print(f"overlays/{overlay}: promtool: {done}" if done is not None else
                      f"overlays/{overlay}: promtool not installed: PromQL not parsed, {ALERTS_TESTS} not run")
    print(f"{len(files)} manifest files checked against Kubernetes {args.k8s_version}")
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
