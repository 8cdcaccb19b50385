"""Each manifest object on its own (check): the built-in kinds against the
Kubernetes schemas (kubernetes-validate, strict: unknown fields are errors,
offline); cert-manager's, its approver-policy's and prometheus-operator's kinds, which have no
schema there, against the fields these manifests may use.
"""

import re

import kubernetes_validate

from validate_common import reporter, secret_key


CERT_MANAGER_USAGES = {
    "digital signature", "key encipherment", "server auth", "client auth", "cert sign",
}


def check_cert_manager(obj, where, name, errors):
    """cert-manager's CRDs have no schema here: check what these manifests use."""
    spec = obj.get("spec") or {}
    bad = reporter(errors, f"{where}: {name}")
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


# cert-manager approver-policy's CertificateRequestPolicy
# (policy.cert-manager.io/v1alpha1): the fields of its Go types these
# manifests may use; validate_issuer.py checks what it allows.
POLICY_FIELDS = {
    "spec": {"selector", "allowed", "constraints", "plugins"},
    "selector": {"issuerRef", "namespace"},
    "issuerRef": {"name", "kind", "group"},
    "namespace": {"matchNames", "matchLabels"},
    "allowed": {"commonName", "dnsNames", "ipAddresses", "uris", "emailAddresses", "isCA", "usages", "subject",
                "otherNames"},
    "constraints": {"minDuration", "maxDuration", "privateKey"},
    "privateKey": {"algorithm", "minSize", "maxSize"},
}


def check_certificate_request_policy(obj, where, name, errors):
    spec = obj.get("spec") or {}
    bad = reporter(errors, f"{where}: {name}")
    if obj.get("apiVersion") != "policy.cert-manager.io/v1alpha1" or obj.get("kind") != "CertificateRequestPolicy":
        bad(f"{obj.get('apiVersion')} {obj.get('kind')} is not policy.cert-manager.io/v1alpha1 "
            "CertificateRequestPolicy")
    parts = {"spec": spec, "selector": spec.get("selector") or {},
             "issuerRef": (spec.get("selector") or {}).get("issuerRef") or {},
             "namespace": (spec.get("selector") or {}).get("namespace") or {},
             "allowed": spec.get("allowed") or {}, "constraints": spec.get("constraints") or {},
             "privateKey": (spec.get("constraints") or {}).get("privateKey") or {}}
    for part, fields in POLICY_FIELDS.items():
        unknown = set(parts[part]) - fields
        if unknown:
            bad(f"{part}: unknown fields {sorted(unknown)}")
    if "selector" not in spec:
        bad("no selector")
    for key in ("commonName",):
        if set((parts["allowed"].get(key) or {})) - {"value", "required", "validations"}:
            bad(f"allowed.{key}: unknown fields")
    for key in ("dnsNames", "ipAddresses", "uris", "emailAddresses"):
        if set((parts["allowed"].get(key) or {})) - {"values", "required", "validations"}:
            bad(f"allowed.{key}: unknown fields")
    if set(parts["allowed"].get("usages") or []) - CERT_MANAGER_USAGES:
        bad(f"allowed.usages: unknown usages {sorted(set(parts['allowed']['usages']) - CERT_MANAGER_USAGES)}")


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


def check_prometheus_operator(obj, where, name, errors):
    """The monitoring.coreos.com kinds these manifests use, on their own;
    check_monitors checks what they point at in a rendered overlay."""
    spec = obj.get("spec") or {}
    bad = reporter(errors, f"{where}: {name}")
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
    if str(obj.get("apiVersion", "")).startswith("policy.cert-manager.io/"):
        check_certificate_request_policy(obj, where, name, errors)
        return name
    if str(obj.get("apiVersion", "")).startswith("monitoring.coreos.com/"):
        check_prometheus_operator(obj, where, name, errors)
        return name
    bad = reporter(errors, f"{where}: {name}")
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        bad(f"{e.message} at {'.'.join(map(str, e.path))}")
    except kubernetes_validate.SchemaNotFoundError as e:
        bad(f"no schema: {e}")
    return name
