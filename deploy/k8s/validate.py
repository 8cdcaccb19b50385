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
Spark's driver and executors authenticate and encrypt their own wire with
a secret mounted from a Secret into Spark's containers alone
(check_spark_wire), and the driver's account may only create, read and
delete pods, as Spark's scheduler does (check_spark_driver_role); under
cert-manager, approver-policy's CertificateRequestPolicies limit the
ClusterIssuer to Kindling's names in Kindling's namespaces
(check_issuer_scope);
each server reads its operator and viewer tokens from two different
rendered Secrets (check_tokens); every PodDisruptionBudget selects a
workload's pods and never blocks a drain (check_disruption_budgets); every
container requests and limits ephemeral-storage, within which its pod's
emptyDirs fit (check_ephemeral_storage). Where an overlay monitors
(overlays/monitoring): the ServiceMonitor and PodMonitor reach the servers'
metrics port with the viewer token and TLS (check_monitors); the Grafana dashboard and the alerts name
only metrics and labels the servers export (agent/src/process/metrics.rs,
agent/rendezvous/src/metrics.rs, agent/ops/src/exposition.rs), and, with promtool installed, parse as PromQL and
pass overlays/monitoring/alerts.test.yaml (check_promql_with_promtool).

Usage: validate.py [--k8s-version 1.31.0] [--renderer auto|kubectl|builtin]

The checks live in the modules beside this file, one concern each:
validate_common (paths, namespaces, pod roles, YAML loading, the `bad`
collector, pod helpers), validate_render (rendering), validate_schema (each
object on its own), validate_security (check_namespaces, check_pod_security,
check_spark_namespace), validate_network (check_network_policies),
validate_egress (check_egress), validate_credentials (check_tls,
check_tokens, check_spark_connect), validate_spark (check_spark_wire,
check_spark_driver_role), validate_issuer (check_issuer_scope), validate_workloads
(check_ephemeral_storage, check_disruption_budgets, check_spread), validate_monitoring
(check_monitors) and validate_promql (metrics, PromQL, dashboards, alerts,
promtool). This file runs them over every manifest file and overlay.
"""

import argparse
import shutil
import sys
import tempfile

from validate_common import ROOT, containers, docs, reporter
from validate_credentials import check_spark_connect, check_tls, check_tokens
from validate_issuer import check_issuer_scope
from validate_monitoring import check_monitors
from validate_network import check_network_policies
from validate_promql import ALERTS_TESTS, check_promql_with_promtool, exported_metrics
from validate_render import render_builtin, render_kubectl, with_dummy_token
from validate_schema import check
from validate_security import check_namespaces, check_pod_security, check_spark_namespace
from validate_spark import check_spark_driver_role, check_spark_wire
from validate_workloads import check_disruption_budgets, check_ephemeral_storage, check_spread

# Each overlay and the image variant (tag suffix) its agents must run.
OVERLAYS = {"cpu": "cpu", "gpu": "gpu", "custom-agent": "cpu", "cert-manager": "cpu", "monitoring": "cpu",
            "rendezvous-ha": "cpu", "probes-from-nodes": "cpu"}
# Not Kubernetes objects on their own: kustomize inputs, promtool's unit
# tests of the alerts; and every file a kustomization names as a patch
# (partial objects, deletions), found by patch_files().
NOT_OBJECTS = {"kustomization.yaml", "alerts.test.yaml"}


def patch_files():
    """The files the kustomizations under ROOT name in `patches:`."""
    found = set()
    for k in ROOT.rglob("kustomization.yaml"):
        for p in docs(k)[0].get("patches", []):
            found.add((k.parent / p["path"]).resolve())
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k8s-version", default="1.31.0")
    ap.add_argument("--renderer", choices=["auto", "kubectl", "builtin"], default="auto")
    args = ap.parse_args()
    errors = []
    patches = patch_files()
    files = sorted(p for p in ROOT.rglob("*.yaml") if p.name not in NOT_OBJECTS and p.resolve() not in patches)
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
            bad = reporter(errors, f"overlays/{overlay}")
            agent = containers(objs, "DaemonSet", "kindling-agent")[0]
            if not agent["image"].endswith(f"-{variant}"):
                bad(f"agent image {agent['image']} is not the {variant} variant")
            gpus = agent["resources"].get("limits", {}).get("nvidia.com/gpu")
            if (variant == "gpu") != (gpus is not None):
                bad(f"agent nvidia.com/gpu limit is {gpus!r}")
            check_namespaces(objs, overlay, errors)
            check_tls(objs, overlay, errors)
            check_network_policies(objs, overlay, errors)
            check_pod_security(objs, overlay, errors)
            check_spark_namespace(objs, overlay, errors)
            check_spark_connect(objs, overlay, errors)
            check_spark_wire(objs, overlay, errors)
            check_spark_driver_role(objs, overlay, errors)
            check_issuer_scope(objs, overlay, errors)
            check_tokens(objs, overlay, errors)
            check_disruption_budgets(objs, overlay, errors)
            check_ephemeral_storage(objs, overlay, errors)
            check_spread(objs, overlay, errors)
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
