"""The monitoring overlay's ServiceMonitors and PodMonitors, on each
rendered overlay (check_monitors): they select Kindling's servers and
scrape /metrics on the main port with the viewer token, over TLS as the
server speaks it, through a peer in EXTERNAL_PEERS; the PrometheusRules and
dashboards they come with are checked by validate_promql.
"""

from validate_common import SERVERS, env_of, mounted_file, pod_templates, reporter, secret_key, selects
from validate_network import EXTERNAL_PEERS, GRPC_PEERS
from validate_promql import MONITORED, check_dashboard, check_rules
from validate_schema import MONITOR_KINDS


# The label that makes a ConfigMap a Grafana dashboard (the sidecar's).
DASHBOARD_LABEL = ("grafana_dashboard", "1")


def check_monitors(objs, overlay, exported, errors):
    """Each ServiceMonitor and PodMonitor selects a Kindling server and
    scrapes /metrics on its main port with the viewer token the server
    reads (never the operator token), TLS as
    the server speaks it (the client identity the manifests mount, the name
    its certificate carries), through a NetworkPolicy peer in
    EXTERNAL_PEERS; rules and dashboards are checked as check_rules and
    check_dashboard say. Returns the PrometheusRules and the dashboards'
    queries, for promtool."""
    bad = reporter(errors, f"overlays/{overlay}")
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
                reporter(errors, where)("a dashboard's key must end in .json")
                continue
            queries += check_dashboard(text, where, exported, errors, jobs=jobs)
    return rules, queries
