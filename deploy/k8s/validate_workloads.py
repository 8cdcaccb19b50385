"""What a node's disk and a drain may do to the pods of each rendered
overlay: ephemeral-storage requests and limits, within which emptyDirs fit
(check_ephemeral_storage); PodDisruptionBudgets that select every workload
and never block a drain (check_disruption_budgets); replicas that hold a
quorum or a leadership spread one per node (check_spread).
"""

import re

from validate_common import POD_ROLES, pod_templates, reporter, selects


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
    bad = reporter(errors, f"overlays/{overlay}")
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
    bad = reporter(errors, f"overlays/{overlay}")
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


# Roles whose replicas are there to survive a node: at least this many
# replicas where there is more than one (etcd: an odd quorum of 3 at least;
# the rendezvous on etcd: a leader and a follower).
SPREAD = {"etcd": 3, "rendezvous": 2}


def check_spread(objs, overlay, errors):
    """Every workload of a SPREAD role that runs more than one replica runs
    at least its minimum (etcd an odd number) and keeps them on different
    nodes: a required pod anti-affinity on kubernetes.io/hostname whose
    selector selects its own pods (a preferred one lets the scheduler put
    two etcd members, or every replica, on one node, whose loss then takes
    the quorum or the rendezvous)."""
    bad = reporter(errors, f"overlays/{overlay}")
    for w in (o for o in objs if o["kind"] in WORKLOADS):
        role = next((r for r, made_by in POD_ROLES.items()
                     if (w["kind"], w["metadata"]["name"]) in made_by), None)
        replicas = (w.get("spec") or {}).get("replicas", 1)
        if role not in SPREAD or replicas <= 1:
            continue
        what = f"{w['kind']}/{w['metadata']['name']}"
        if replicas < SPREAD[role] or (role == "etcd" and replicas % 2 == 0):
            bad(f"{what}: {replicas} replicas; {role} needs at least {SPREAD[role]}"
                + (" and an odd number (a quorum)" if role == "etcd" else ""))
        template = w["spec"].get("template") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        anti = ((template.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity") or {}
        required = anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []
        if not any(term.get("topologyKey") == "kubernetes.io/hostname"
                   and selects(term.get("labelSelector") or {"matchLabels": {"-": "-"}}, labels)
                   for term in required):
            bad(f"{what}: its {replicas} replicas need a required podAntiAffinity on kubernetes.io/hostname "
                "selecting their own pods (preferred lets one node hold several, whose loss takes them all)")
