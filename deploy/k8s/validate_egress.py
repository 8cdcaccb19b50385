"""Egress of the pods deploy/k8s makes, checked on every rendered overlay
(validate_network.py's check_network_policies calls check_egress).

Each pod role in EGRESS must be selected by a NetworkPolicy of its
namespace with policyTypes Egress, and the egress rules of all such
policies together must let it dial exactly the destinations listed there:
none missing (the deployment would break), none added (an extra port or
peer, a rule without `to` or without `ports`, `egress: [{}]`). A refusal
names the pod, the policy and the rule.
"""

import json

# A destination is (what, port). `what` is a pod role of these manifests
# (validate_common.py's POD_ROLES: a peer is resolved through the rendered
# namespaces and pod templates' labels), KUBE_DNS, an ipBlock's CIDR, or the
# peer as written when it names pods outside the rendered namespaces.
# `port` is a TCP port number, or a string for anything else ("UDP 53",
# "TCP 8000-8100", "every TCP port", EVERY_PORT).
KUBE_DNS = "kube-dns"
DNS_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
DNS = {(KUBE_DNS, "UDP 53"), (KUBE_DNS, 53)}
# Data sources and the API server lie outside the cluster, at addresses
# these manifests cannot know: TCP 443 (and 6443) to every address.
ANY_ADDRESS = "0.0.0.0/0"
ANYWHERE = "anywhere (a rule without `to`)"
EVERY_PORT = "every port (a rule without `ports`)"
# Where each pod may connect, exactly, in every overlay. Change a shipped
# policy and change its pod's entry here with it; an overlay's own policy
# (a tracker, a data source on another port) goes in EXTRA_EGRESS
# (docs/operations.md, "Egress").
EGRESS = {
    # Kindling's servers: the ring, the rendezvous, DNS.
    "agent": {("rendezvous", 7070), ("agent", 50051), *DNS},
    "rendezvous": {*DNS},
    # Driver applications: Spark Connect's TLS sidecar, the agents, the
    # rendezvous. No experiment tracker: it lies wherever you run it.
    "client": {("spark-connect", 15002), ("agent", 50051), ("rendezvous", 7070), *DNS},
    # Executors (any client's UDFs run here): the agents' Flight port, the
    # driver's RPC and block manager, the other executors' block managers,
    # data sources over HTTPS.
    "executor": {("agent", 50051), ("spark-connect", 7078), ("spark-connect", 7079), ("executor", 7079),
                 (ANY_ADDRESS, 443), *DNS},
    # The Spark driver: the API server (443 or 6443, wherever it lies), its
    # executors' block managers, data sources over HTTPS.
    "spark-connect": {(ANY_ADDRESS, 443), (ANY_ADDRESS, 6443), ("executor", 7079), *DNS},
    # The replicated rendezvous' etcd members: each other, DNS.
    "etcd": {("etcd", 2380), *DNS},
}
# Destinations an overlay's own policies add, by overlay and pod role, e.g.
# {"my-overlay": {"client": {("203.0.113.10/32", 443)}}} for an MLflow
# tracker outside the cluster.
EXTRA_EGRESS = {
    # The replicas keep their state in etcd.
    "rendezvous-ha": {"rendezvous": {("etcd", 2379)}},
}
# Ports Spark gives the pods it builds itself, from the driver's --conf (the
# executor pod template declares none): container port name -> conf key.
SPARK_PORTS = {"executor": {"blockmanager": "spark.blockManager.port"}}


def policy_types(policy):
    """A NetworkPolicy's policyTypes, defaulted as Kubernetes does."""
    spec = policy.get("spec") or {}
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else []))


def fmt(destinations):
    return ", ".join(sorted(f"{what}:{port}" for what, port in destinations))


def served_ports(pod, conf):
    """A pod's TCP ports, name -> number: its template's and those Spark gives it
    (an unset or zero port is random: none)."""
    ports = dict(pod["ports"])
    for name, key in SPARK_PORTS.get(pod["role"], {}).items():
        value = conf.get(key, "0")
        if value.isdigit() and int(value):
            ports[name] = int(value)
    return ports


def port_specs(rule_port, ports):
    """One entry of a rule's `ports` towards a destination with these named
    TCP ports (None: not a pod of these manifests): [a TCP port number] or
    [a description of anything else] (a range also opens the pod's ports it
    spans); [] for a named port the pod lacks (it opens nothing there)."""
    proto, port, end = rule_port.get("protocol", "TCP"), rule_port.get("port"), rule_port.get("endPort")
    if port is None:
        return [f"every {proto} port"]
    if isinstance(port, str):
        if ports is None:
            return [f"{proto} port named {port}"]
        if port not in ports:
            return []
        port = ports[port]
    if end not in (None, port):
        spanned = [n for n in set((ports or {}).values()) if proto == "TCP" and port <= n <= end]
        return [f"{proto} {port}-{end}", *spanned]
    return [port if proto == "TCP" else f"{proto} {port}"]


def peer_targets(peer, namespace, resolve, conf):
    """What one peer of a rule in `namespace` names, as (what, its TCP ports by
    name, None outside these manifests), and what is wrong with it. `resolve(peer, namespace)` gives
    (namespace, podSelector, matching pod templates) for a peer naming pods of
    the rendered namespaces, else None."""
    if peer is None:
        return [(ANYWHERE, None)], []
    if peer == DNS_PEER:
        return [(KUBE_DNS, None)], []
    inside = resolve(peer, namespace)
    if inside is None:
        block = peer.get("ipBlock") or {}
        if set(peer) == {"ipBlock"}:
            what = str(block.get("cidr")) + (f" except {sorted(block['except'])}" if block.get("except") else "")
        else:
            what = json.dumps(peer, sort_keys=True)
        return [(what, None)], []
    ns, selector, pods = inside
    problems = []
    if not (selector.get("matchLabels") or selector.get("matchExpressions")):
        problems.append(f"peer {peer} selects every pod of {ns}, those created later too (the Spark driver's "
                        "account creates pods with any label): name the pods by label")
    if not pods:
        problems.append(f"peer {peer} matches no pod template in namespace {ns}")
    return [(p["role"] or p["who"], served_ports(p, conf)) for p in pods], problems


def rule_destinations(rule, namespace, resolve, conf):
    """The destinations one egress rule of a policy in `namespace` opens, and
    what is wrong with its peers."""
    found, problems = set(), []
    for peer in rule.get("to") or [None]:
        targets, wrong = peer_targets(peer, namespace, resolve, conf)
        problems += wrong
        for what, ports in targets:
            for rule_port in rule.get("ports") or [None]:
                specs = [EVERY_PORT] if rule_port is None else port_specs(rule_port, ports)
                found.update((what, spec) for spec in specs)
    return found, problems


def check_pod_egress(pod, wanted, table, policies, resolve, conf, report):
    """The pod's egress: restricted by some policy, and opened by the rules
    of those policies to exactly the destinations `wanted` (from `table`)."""
    who = f"{pod['who']} ({pod['role']})"
    if not policies:
        report(f"{who}: no NetworkPolicy restricts its egress, so it may dial anything; "
               f"{table} allows only {fmt(wanted)}")
        return
    opened_by = {}
    for pol in policies:
        for i, rule in enumerate(pol["spec"].get("egress") or []):
            where = f"NetworkPolicy/{pol['metadata']['name']} egress[{i}]"
            found, problems = rule_destinations(rule, pod["namespace"], resolve, conf)
            for problem in problems:
                report(f"{where}: {problem}")
            for d in found:
                opened_by.setdefault(d, []).append(where)
    for d in sorted(set(opened_by) - wanted, key=str):
        report(f"{who}: {' and '.join(opened_by[d])} lets it dial {fmt([d])}, "
               f"beyond {table} ({fmt(wanted)})")
    missing = wanted - set(opened_by)
    if missing:
        report(f"{who}: no egress rule lets it dial {fmt(missing)} ({table}): "
               "it cannot reach what it needs")


def check_table(by_role, conf, report):
    """Every pod port EGRESS names is one that pod serves: a port renumbered on
    one side only (the policies and EGRESS, or the pod) fails here."""
    for role, wanted in sorted(EGRESS.items()):
        for what, port in sorted(wanted, key=str):
            pod = by_role.get(what)
            if pod is None or not isinstance(port, int) or port in served_ports(pod, conf).values():
                continue
            hint = ""
            if what in SPARK_PORTS:
                hint = f" (Spark sets its ports from {sorted(SPARK_PORTS[what].values())}; unset, they are random)"
            report(f"EGRESS[{role!r}] names port {port} of {what}, which {pod['who']} does not serve{hint}")


def check_egress(overlay, pods, policies, resolve, selects, conf, bad):
    """Each pod of a role in EGRESS: its egress restricted, to exactly the
    destinations listed there and in the overlay's EXTRA_EGRESS. `policies`:
    every rendered NetworkPolicy; `selects(selector, labels)`; `conf`: the
    Spark driver's --conf."""
    seen = set()

    def report(msg):
        if msg not in seen:
            seen.add(msg)
            bad(msg)

    by_role = {p["role"]: p for p in pods if p["role"]}
    for role in sorted(EGRESS):
        pod = by_role.get(role)
        if pod is None:
            continue
        restricting = [p for p in policies
                       if p["metadata"].get("namespace") == pod["namespace"] and "Egress" in policy_types(p)
                       and selects(p["spec"].get("podSelector") or {}, pod["labels"])]
        extra = EXTRA_EGRESS.get(overlay, {}).get(role, set())
        table = f"EGRESS[{role!r}]" + (f" + EXTRA_EGRESS[{overlay!r}][{role!r}]" if extra else "")
        check_pod_egress(pod, EGRESS[role] | extra, table, restricting, resolve, conf, report)
    check_table(by_role, conf, report)

