"""Spark's own wire and Spark's rights, on each rendered overlay: the driver
and its executors authenticate and encrypt their RPC and block transfers
with a secret that lies in a Secret mounted into Spark's pods alone
(check_spark_wire); the driver's account may do to pods exactly what Spark's
Kubernetes scheduler does, and nothing to any other kind, and the driver is
configured to ask for nothing more (check_spark_driver_role).
"""

from validate_common import (
    SPARK_NAMESPACE, driver_conf, generated_secret_names, mounted_file, mounted_secrets, pod_templates, reporter,
    secret_value, unhashed,
)


# The driver's --conf that turns Spark's own security on: any peer without
# the secret is refused at the connection's first message, RPC and blocks
# travel encrypted (no fallback to the older SASL scheme), and what Spark
# spills or shuffles to local disk is encrypted.
SPARK_WIRE_CONF = {
    "spark.authenticate": "true",
    "spark.network.crypto.enabled": "true",
    "spark.network.crypto.saslFallback": "false",
    "spark.io.encryption.enabled": "true",
}
# Where the secret must come from: a file on each side. Spark on Kubernetes
# otherwise generates one and writes it into each executor pod's spec as an
# environment variable, readable by anyone who may read pods.
SECRET_FILE_CONF = {
    "spark-connect": "spark.authenticate.secret.driver.file",
    "executor": "spark.authenticate.secret.executor.file",
}
# The secret inline, on the command line or in the environment: refused.
SECRET_INLINE_CONF = "spark.authenticate.secret"
SECRET_ENV = {"_SPARK_AUTH_SECRET", "SPARK_AUTHENTICATE_SECRET"}
# The containers that run Spark and so read the secret; the Spark Connect
# pod's TLS sidecar does not.
SPARK_CONTAINERS = {"spark-connect": "spark-connect", "executor": "spark-kubernetes-executor"}

# What Spark's Kubernetes scheduler (client mode, the default "direct"
# allocator) does with pods: create executors, get its own pod (their
# owner), list and watch them, delete one, or all by label.
DRIVER_POD_VERBS = {"create", "get", "list", "watch", "delete", "deletecollection"}
# The driver --conf that keeps Spark from asking for more: no ConfigMap of
# its configuration directory, no PersistentVolumeClaims, no Service
# cleanup; executors deleted (not patched) when they end.
DRIVER_CONF_FOR_ROLE = {
    "spark.kubernetes.executor.disableConfigMap": "true",
    "spark.kubernetes.driver.ownPersistentVolumeClaim": "false",
    "spark.kubernetes.driver.reusePersistentVolumeClaim": "false",
    "spark.kubernetes.driver.service.deleteOnTermination": "false",
}
# Options under which Spark would patch pods or manage other kinds: left
# unset (or at these values).
DRIVER_CONF_DEFAULTS = {
    "spark.kubernetes.executor.deleteOnTermination": "true",
    "spark.kubernetes.allocation.pods.allocator": "direct",
}
DRIVER_CONF_UNSET = {"spark.kubernetes.executor.decommissionLabel", "spark.kubernetes.executor.podDeletionCost"}


def spark_pods(objs):
    """The Spark Connect pod and the executor pod template, by role."""
    return {p["role"]: p for p in pod_templates(objs) if p["role"] in SECRET_FILE_CONF}


def check_spark_wire(objs, overlay, errors):
    """SPARK_WIRE_CONF is set on the driver; the secret is read from a file
    on each side (SECRET_FILE_CONF), never inline or from the environment;
    both files lie in the same key of one Secret rendered in
    SPARK_NAMESPACE, mounted into Spark's containers (SPARK_CONTAINERS) and
    no other container or pod."""
    bad = reporter(errors, f"overlays/{overlay}")
    conf = driver_conf(objs)
    for key, want in SPARK_WIRE_CONF.items():
        if conf.get(key) != want:
            bad(f"Deployment/spark-connect: --conf {key}={conf.get(key)!r}, not {want!r}: Spark's block manager "
                "and RPC would serve any pod that connects (blocks hold training rows and the task binaries)")
    if SECRET_INLINE_CONF in conf:
        bad(f"Deployment/spark-connect: --conf {SECRET_INLINE_CONF} puts Spark's secret on the command line: "
            f"read it from a mounted file ({', '.join(SECRET_FILE_CONF.values())})")
    pods, generated, found = spark_pods(objs), generated_secret_names(), {}
    for role, key in SECRET_FILE_CONF.items():
        pod, path = pods.get(role), conf.get(key)
        if pod is None:
            continue
        if not path:
            bad(f"{pod['who']}: no --conf {key}: Spark would put a generated secret into the executor pods' "
                "spec, readable by whoever may read pods")
            continue
        container = next((c for c in pod["spec"].get("containers") or [] if c["name"] == SPARK_CONTAINERS[role]),
                         None)
        where = mounted_file(pod["spec"], container or {}, path)
        if where is None:
            bad(f"{pod['who']}: {key}={path} lies in no Secret mounted into container {SPARK_CONTAINERS[role]}")
            continue
        secret, item = unhashed(where[0], generated), where[1]
        if secret_value(objs, SPARK_NAMESPACE, secret, item, generated) is None:
            bad(f"{pod['who']}: {key}={path} names key {item!r} of Secret {secret}, which is not rendered in "
                f"{SPARK_NAMESPACE}")
        found[role] = (secret, item)
    if len(set(found.values())) > 1:
        bad(f"the driver and the executors read different secrets: {found}")
    for pod in pod_templates(objs):
        for c in (pod["spec"].get("containers") or []) + (pod["spec"].get("initContainers") or []):
            for e in c.get("env") or []:
                if e["name"] in SECRET_ENV:
                    bad(f"{pod['who']}: container {c['name']} takes Spark's secret from ${e['name']}")
    for secret in {s for s, _ in found.values()}:
        for pod in pod_templates(objs):
            mounts = {unhashed(s, generated) for s in mounted_secrets(pod["spec"])}
            if secret not in mounts:
                continue
            if pod["role"] not in SPARK_CONTAINERS:
                bad(f"{pod['who']} ({pod['role']}) mounts Spark's secret {secret}: only Spark's pods may")
                continue
            volumes = {v["name"] for v in pod["spec"].get("volumes") or []
                       if unhashed((v.get("secret") or {}).get("secretName", ""), generated) == secret}
            for c in pod["spec"].get("containers") or []:
                if c["name"] != SPARK_CONTAINERS[pod["role"]] and volumes & {m["name"] for m in
                                                                            c.get("volumeMounts") or []}:
                    bad(f"{pod['who']}: container {c['name']} mounts Spark's secret {secret}: only "
                        f"{SPARK_CONTAINERS[pod['role']]} runs Spark")


def bindings_of(objs, namespace, account):
    """The Roles and ClusterRoles bound to a ServiceAccount, as (binding, role or None)."""
    roles = {(o["kind"], o["metadata"].get("namespace") if o["kind"] == "Role" else None, o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    found = []
    for b in (o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ns = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        for s in b.get("subjects") or []:
            if s.get("kind") == "ServiceAccount" and s.get("name") == account \
                    and (s.get("namespace") or ns) == namespace:
                ref = b.get("roleRef") or {}
                found.append((b, roles.get((ref.get("kind"), ns if ref.get("kind") == "Role" else None,
                                            ref.get("name")))))
    return found


def check_spark_driver_role(objs, overlay, errors):
    """The Spark driver's account holds, in all its bindings together, the
    core group's `pods` with exactly DRIVER_POD_VERBS and no other resource,
    group or verb (no Service it could publish, no ConfigMap of its
    namespace it could rewrite); the driver's --conf asks Spark for nothing
    more (DRIVER_CONF_FOR_ROLE, DRIVER_CONF_DEFAULTS, DRIVER_CONF_UNSET)."""
    bad = reporter(errors, f"overlays/{overlay}")
    server = spark_pods(objs).get("spark-connect")
    if server is None:
        return
    account = server["spec"].get("serviceAccountName", "default")
    verbs = set()
    for binding, role in bindings_of(objs, SPARK_NAMESPACE, account):
        where = f"{binding['kind']}/{binding['metadata']['name']}"
        if role is None:
            bad(f"{where} binds a role these manifests do not render to {account}: its rights cannot be checked")
            continue
        for rule in role.get("rules") or []:
            what = f"{role['kind']}/{role['metadata']['name']} rule {rule}"
            if rule.get("apiGroups") != [""] or rule.get("resources") != ["pods"] or rule.get("nonResourceURLs"):
                bad(f"{what}: the Spark driver's account {account} may touch pods only (no Services, "
                    "ConfigMaps, claims, subresources or other groups)")
            extra = set(rule.get("verbs") or []) - DRIVER_POD_VERBS
            if extra:
                bad(f"{what}: verbs {sorted(extra)} Spark does not use (it uses {sorted(DRIVER_POD_VERBS)})")
            verbs |= set(rule.get("verbs") or [])
    missing = DRIVER_POD_VERBS - verbs
    if missing:
        bad(f"{server['who']}: the driver's account {account} may not {sorted(missing)} pods: Spark's scheduler "
            "needs them to manage its executors")
    conf = driver_conf(objs)
    for key, want in {**DRIVER_CONF_FOR_ROLE, **DRIVER_CONF_DEFAULTS}.items():
        default = DRIVER_CONF_DEFAULTS.get(key)
        if conf.get(key, default) != want:
            bad(f"Deployment/spark-connect: --conf {key}={conf.get(key)!r}, not {want!r}: Spark would need "
                "rights its Role does not grant")
    for key in sorted(DRIVER_CONF_UNSET & set(conf)):
        bad(f"Deployment/spark-connect: --conf {key} makes Spark patch its executor pods, which its Role "
            "does not allow")
