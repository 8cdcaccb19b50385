"""NetworkPolicies, on each rendered overlay (check_network_policies): who
may connect to each gRPC port of the agents, the rendezvous and Spark
Connect (GRPC_PEERS, EXACT_PEERS, the overlay's EXTERNAL_PEERS), probe
ports, which pods a policy may isolate, and every selector matching a pod
the manifests make; each pod's egress is validate_egress's.
"""

import json

from validate_common import (
    NAMESPACE, ONLY_IN, POD_ROLES, SPARK_NAMESPACE, driver_conf, pod_templates, reporter, selects,
)
from validate_egress import EGRESS, check_egress, policy_types, served_ports


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
    # An executor's block manager (the port Spark gives it from
    # spark.blockManager.port): shuffle, cached rows, broadcast task
    # binaries. The driver and the other executors only.
    ("executor", 7079): {"spark-connect", "executor"},
    # The replicated rendezvous' etcd (overlays/rendezvous-ha): clients are
    # the replicas, peers the members.
    ("etcd", 2379): {"rendezvous"},
    ("etcd", 2380): {"etcd"},
}
# The peers a port admits, exactly as written. GRPC_PEERS sees the pods these
# manifests make; a peer also admits every pod its selectors will match, and
# Spark's account creates pods with any label in SPARK_NAMESPACE. So Spark
# Connect admits client pods of NAMESPACE only: a bare podSelector there
# would admit a pod of SPARK_NAMESPACE labelled kindling-client.
CLIENT_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
               "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kindling-client"}}}
EXACT_PEERS = {("spark-connect", 15002): [CLIENT_PEER]}
# The pods an Ingress policy may isolate (every one: each port admits
# exactly its GRPC_PEERS or, for a probe, every source or the nodes' network). Egress: every
# role's exactly as in EGRESS (validate_egress.py).
ISOLATED = {"agent", "rendezvous", "spark-connect", "etcd", "executor"}
ANYONE = "anyone"
# Peers outside the namespace, by overlay, and the gRPC ports they may reach,
# exactly: Prometheus scrapes /metrics there (overlays/monitoring,
# prometheus-network-policy.yaml).
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
              "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
EXTERNAL_PEERS = {
    "monitoring": {("agent", 50051): [PROMETHEUS], ("rendezvous", 7070): [PROMETHEUS]},
}


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
    peers as written; probe ports admit every source or the nodes' network (ipBlock) only; every selector in a
    policy matches the labels of a pod the manifests make in the namespace
    it names (a renamed label fails here); each pod may dial exactly its
    destinations in EGRESS (validate_egress.check_egress)."""
    bad = reporter(errors, f"overlays/{overlay}")
    external = EXTERNAL_PEERS.get(overlay, {})
    known_external = [p for peers in external.values() for p in peers]
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    if not policies:
        bad("no NetworkPolicy")
        return
    pods = pod_templates(objs)
    by_role = {p["role"]: p for p in pods if p["role"]}
    for role in sorted(POD_ROLES):
        expected = overlay in ONLY_IN.get(role, {overlay})
        made_by = " or ".join("/".join(k) for k in POD_ROLES[role])
        if expected and role not in by_role:
            bad(f"no pod template for {role} ({made_by})")
        if not expected and role in by_role:
            bad(f"a pod template for {role} ({made_by}), which only {sorted(ONLY_IN[role])} have")
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
        probe_ports = {n for t in targets for n in t["probe_ports"]}
        for rule in spec.get("ingress") or []:
            rule_ports = {p.get("port") for p in rule.get("ports") or []}
            for peer in rule.get("from") or []:
                if peer in known_external:
                    continue
                # The nodes' network, on probe ports only (overlays/probes-from-nodes).
                if set(peer) == {"ipBlock"} and rule_ports and rule_ports <= probe_ports:
                    continue
                inside = internal_peer(peer, ns, rendered)
                if inside is None:
                    bad(f"{where}: peer {peer} names no pods of {sorted(rendered)} (a podSelector, with a "
                        "namespaceSelector on kubernetes.io/metadata.name for another namespace)"
                        " and is not in EXTERNAL_PEERS for this overlay")
                elif not matched(inside[1], inside[0]):
                    bad(f"{where}: peer {peer} matches no pod template in namespace {inside[0]}")

    conf = driver_conf(objs)
    for (role, number), wanted in GRPC_PEERS.items():
        pod = by_role.get(role)
        if pod is None:
            continue
        if number not in served_ports(pod, conf).values():
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

    check_egress(overlay, pods, policies, resolve, selects, conf, bad)

    for role in sorted(ISOLATED):
        pod = by_role.get(role)
        if pod is None:
            continue
        for number in sorted(set(served_ports(pod, conf).values())):
            if (role, number) in GRPC_PEERS:
                continue
            if number not in pod["probe_ports"]:
                bad(f"{pod['who']}: container port {number} is neither a probe port nor in GRPC_PEERS")
                continue
            peers = ingress_peers(policies, pod, number)
            if peers is None or ANYONE in peers:
                continue
            # Or the nodes' network only (overlays/probes-from-nodes): the
            # kubelet probes from its node's address; a pod or namespace
            # selector never matches it.
            if not peers or not all(isinstance(p, dict) and set(p) == {"ipBlock"} for p in peers):
                bad(f"{pod['who']}: probe port {number} must admit every source, or the nodes' "
                    f"network (ipBlock) only: the kubelet probes from its node; admits {peers}")
