"""Who runs where, as whom, holding what, on each rendered overlay: every
object in its namespace (check_namespaces); the "restricted" Pod Security
profile, service accounts and API tokens, and the Secrets each pod mounts
(check_pod_security); SPARK_NAMESPACE's Secrets and the RBAC bindings that
let accounts create pods or read Secrets (check_spark_namespace).
"""

from validate_common import (
    CERT_MANAGER_NAMESPACE, CLUSTER_SCOPED, NAMESPACE, ROLE_NAMESPACE, SPARK_NAMESPACE, containers, driver_conf,
    generated_secret_names, mounted_secrets, pod_templates, reporter, unhashed,
)


# The one pod that may hold a Kubernetes API token: the Spark driver creates
# its executors. Every other pod runs with none.
API_TOKEN_ROLES = {"spark-connect"}
# The Secrets each pod may mount (volumes, projected volumes, env), by name
# without kustomize's hash: an executor holds the client certificate and
# nothing of the cluster's; Spark Connect's token only its server and the
# clients; Spark's own secret only Spark's pods (validate_spark.py).
SECRETS_OF = {
    "agent": {"kindling-token", "kindling-viewer-token", "kindling-credential-key", "kindling-agent-tls"},
    # Replicated on etcd (overlays/rendezvous-ha), also its client certificate for etcd.
    "rendezvous": {"kindling-token", "kindling-viewer-token", "kindling-rendezvous-tls", "kindling-etcd-client-tls"},
    "client": {"kindling-token", "kindling-client-tls", "spark-connect-token"},
    "executor": {"kindling-client-tls", "spark-authenticate"},
    "spark-connect": {"spark-connect-token", "spark-connect-tls", "spark-authenticate"},
    # The rendezvous' etcd: its members' certificate (clients and peers).
    "etcd": {"kindling-etcd-tls"},
}
# Every Secret SPARK_NAMESPACE may hold: whoever may create a pod there (the
# Spark driver's account, so any code that runs on the driver) can mount it.
SPARK_SECRETS = {
    "kindling-client-tls": "the executors' client certificate",
    "spark-connect-token": "Spark Connect's own token",
    "spark-connect-tls": "Spark Connect's server certificate",
    "spark-authenticate": "Spark's own secret, which its driver and executors authenticate each other with",
}
# Pods whose root filesystem must be read-only: every one (Spark's write to
# emptyDirs mounted at /tmp and their working directory).
READ_ONLY_ROOT = {"agent", "rendezvous", "client", "etcd", "executor", "spark-connect"}


def check_namespaces(objs, overlay, errors):
    """Both namespaces are rendered; every namespaced object names one of
    them (cert-manager's own objects may also live in
    CERT_MANAGER_NAMESPACE), a cluster-scoped one none; each pod runs in its
    role's namespace (ROLE_NAMESPACE). Without a namespace `kubectl apply -k`
    puts an object in the context's namespace, and a kustomization's
    `namespace:` would move Spark's pods, and what its account may create,
    next to Kindling's Secrets."""
    bad = reporter(errors, f"overlays/{overlay}")
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


def check_pod_security(objs, overlay, errors):
    """Every pod the manifests make meets Kubernetes' "restricted" Pod
    Security profile (non-root, RuntimeDefault seccomp, no privilege
    escalation, every capability dropped, no host namespaces or paths);
    Kindling's own pods also run on a read-only root filesystem. Only the
    Spark driver mounts a Kubernetes API token (executors run under an
    account of their own, bound to no Role, with none), and each pod mounts
    no Secret but those SECRETS_OF allows its role."""
    bad = reporter(errors, f"overlays/{overlay}")
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
    bad = reporter(errors, f"overlays/{overlay}")
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
