"""Credentials on each rendered overlay: TLS files in mounted Secrets and,
with cert-manager, the Certificates and issuers that make them
(check_tls); each server's operator and viewer tokens (check_tokens);
Spark Connect's token, its loopback-only plaintext port behind a TLS
sidecar, and how clients dial it (check_spark_connect).
"""

import re

from validate_common import (
    CERT_MANAGER_NAMESPACE, NAMESPACE, SERVERS, certificates, driver_conf, env_of, generated_secret_names,
    mounted_file, pod_templates, reporter, secret_key, secret_value, selects,
)


def check_tls(objs, overlay, errors):
    """Every KINDLING_TLS_* file lies in a mounted Secret; with cert-manager,
    a Certificate in the pod's namespace makes each such Secret, every
    Certificate's issuer exists (an Issuer of its namespace, or a
    ClusterIssuer whose CA key a Certificate in CERT_MANAGER_NAMESPACE
    makes), and the agents' and the rendezvous' certificates carry the names
    clients dial. (Spark Connect's: check_spark_connect.)"""
    bad = reporter(errors, f"overlays/{overlay}")
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


def check_tokens(objs, overlay, errors):
    """Each server (agent, rendezvous) reads its operator token and its
    viewer token from mounted Secrets the overlay renders, and not the same
    file: a server whose viewer token equals its operator token refuses to
    start."""
    bad = reporter(errors, f"overlays/{overlay}")
    secrets = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Secret"}
    for p in pod_templates(objs):
        if p["role"] not in SERVERS:
            continue
        for c in p["spec"].get("containers", []):
            env = env_of(c)
            files = {}
            for variable in ("KINDLING_TOKEN_FILE", "KINDLING_VIEWER_TOKEN_FILE"):
                if not env.get(variable):
                    bad(f"{p['who']}: no {variable}")
                    continue
                files[variable] = mounted_file(p["spec"], c, env[variable])
                if files[variable] is None:
                    bad(f"{p['who']}: {variable} {env[variable]} is not in a mounted Secret")
                    continue
                name, key = files[variable]
                if key not in {**(secrets.get(name, {}).get("data") or {}),
                               **(secrets.get(name, {}).get("stringData") or {})}:
                    bad(f"{p['who']}: {variable}: the overlay renders no Secret {name} with key {key}")
            operator = files.get("KINDLING_TOKEN_FILE")
            if operator is not None and operator == files.get("KINDLING_VIEWER_TOKEN_FILE"):
                bad(f"{p['who']}: the viewer token is the operator token {operator}: "
                    "the server refuses to start")


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
    bad = reporter(errors, f"overlays/{overlay}")
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
