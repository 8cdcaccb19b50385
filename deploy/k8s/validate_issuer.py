"""What the cluster's CA may sign, where cert-manager makes the certificates
(check_issuer_scope): cert-manager's approver-policy CertificateRequestPolicies
limit each ClusterIssuer to Kindling's namespaces and names, keep Kindling's
own identities out of SPARK_NAMESPACE, and let every shipped Certificate
through.
"""

from validate_common import CERT_MANAGER_NAMESPACE, NAMESPACE, SPARK_NAMESPACE, certificates, reporter


POLICY_KIND = "CertificateRequestPolicy"
POLICY_GROUP = "policy.cert-manager.io"
# The namespaces a policy may name: Kindling's two for the ClusterIssuer,
# and cert-manager's own for the self-signed issuer that makes the CA.
POLICY_NAMESPACES = {"ClusterIssuer": {NAMESPACE, SPARK_NAMESPACE}, "Issuer": {CERT_MANAGER_NAMESPACE}}
# Names a policy may not allow at all: they would reach beyond its names.
NO_SANS = ("ipAddresses", "uris", "emailAddresses", "subject", "otherNames")
# The identity cert-manager's controller requests with (it makes the
# CertificateRequests of Certificates): approver-policy weighs a policy only
# for a requester that may `use` it.
CERT_MANAGER_ACCOUNT = (CERT_MANAGER_NAMESPACE, "cert-manager")
# cert-manager's defaults for what a Certificate leaves out.
DEFAULT_USAGES = ["digital signature", "key encipherment"]


def issuer_of(cert):
    ref = cert["spec"]["issuerRef"]
    return ref["name"], ref.get("kind", "Issuer"), ref.get("group", "cert-manager.io")


def selected(policy):
    """(issuer name, kind, group, namespaces) a policy selects, or None when
    it selects by wildcard, labels or not at all."""
    sel = policy["spec"].get("selector") or {}
    ref, ns = sel.get("issuerRef"), sel.get("namespace") or {}
    if not ref or any(not ref.get(k) or "*" in ref[k] for k in ("name", "kind", "group")):
        return None
    names = ns.get("matchNames") or []
    if not names or ns.get("matchLabels") or any("*" in n for n in names):
        return None
    return ref["name"], ref["kind"], ref["group"], set(names)


def allowed_names(policy):
    allowed = policy["spec"].get("allowed") or {}
    cn = (allowed.get("commonName") or {}).get("value")
    return ({cn} if cn else set()) | set((allowed.get("dnsNames") or {}).get("values") or [])


def permits(policy, cert):
    """Whether a policy allows every name, usage and the CA bit a Certificate asks for."""
    spec, allowed = cert["spec"], policy["spec"].get("allowed") or {}
    cn = (allowed.get("commonName") or {}).get("value")
    if spec.get("commonName") and spec["commonName"] != cn:
        return False
    if set(spec.get("dnsNames") or []) - set((allowed.get("dnsNames") or {}).get("values") or []):
        return False
    usages = set(spec.get("usages") or DEFAULT_USAGES) | ({"cert sign"} if spec.get("isCA") else set())
    if usages - set(allowed.get("usages") or []):
        return False
    return bool(allowed.get("isCA")) or not spec.get("isCA")


def check_policy(policy, cluster_issuers, bad):
    """One policy on its own: exact selectors, Kindling's namespaces, no wildcard or extra name."""
    where = f"{POLICY_KIND}/{policy['metadata']['name']}"
    sel = selected(policy)
    if sel is None:
        bad(f"{where}: selects by wildcard, labels or nothing: name the issuer (name, kind, group) and the "
            "namespaces (selector.namespace.matchNames) exactly")
        return None
    name, kind, _, namespaces = sel
    outside = namespaces - POLICY_NAMESPACES.get(kind, set())
    if outside:
        bad(f"{where}: lets {kind}/{name} sign in {sorted(outside)}: only in "
            f"{sorted(POLICY_NAMESPACES.get(kind, set()))}")
    allowed = policy["spec"].get("allowed") or {}
    wild = sorted(n for n in allowed_names(policy) if "*" in n)
    if wild:
        bad(f"{where}: allows names by wildcard {wild}")
    extra = sorted(k for k in NO_SANS if allowed.get(k))
    if extra:
        bad(f"{where}: allows {extra}: Kindling's certificates carry DNS names and a common name only")
    if allowed.get("isCA") and (kind, name) in {("ClusterIssuer", n) for n in cluster_issuers}:
        bad(f"{where}: lets {kind}/{name} sign a CA, which could sign any name")
    return sel


def check_issuer_scope(objs, overlay, errors):
    """With a ClusterIssuer: every CertificateRequestPolicy selects one issuer
    and its namespaces exactly (POLICY_NAMESPACES), allows no wildcard, IP,
    URI, e-mail or subject; every ClusterIssuer and every issuer a shipped
    Certificate names has a policy; no policy of SPARK_NAMESPACE allows a
    name a Certificate of NAMESPACE carries (the agents', the rendezvous',
    the clients'); each shipped Certificate is permitted by a policy of its
    namespace (else it is never signed); cert-manager's controller may `use`
    every policy, through a binding of exactly that account."""
    bad = reporter(errors, f"overlays/{overlay}")
    cluster_issuers = {o["metadata"]["name"] for o in objs if o["kind"] == "ClusterIssuer"}
    if not cluster_issuers:
        return
    policies = [o for o in objs if o["kind"] == POLICY_KIND]
    if not policies:
        bad(f"ClusterIssuer {sorted(cluster_issuers)} signs for every namespace: no {POLICY_KIND} "
            "(overlays/cert-manager/approver-policy.yaml) limits it to Kindling's names and namespaces")
        return
    checked = [(p, check_policy(p, cluster_issuers, bad)) for p in policies]
    checked = [(p, s) for p, s in checked if s is not None]
    certs = certificates(objs)
    for name in sorted(cluster_issuers):
        if not any(s[:2] == (name, "ClusterIssuer") for _, s in checked):
            bad(f"ClusterIssuer/{name}: no {POLICY_KIND} selects it: it signs whatever is asked, wherever")
    kindling_names = {n for (ns, _), c in certs.items() if ns == NAMESPACE
                      for n in [c["spec"].get("commonName"), *(c["spec"].get("dnsNames") or [])] if n}
    for p, (_, kind, _, namespaces) in checked:
        leaked = allowed_names(p) & kindling_names
        if SPARK_NAMESPACE in namespaces and leaked:
            bad(f"{POLICY_KIND}/{p['metadata']['name']}: allows {sorted(leaked)} in {SPARK_NAMESPACE}, names "
                f"Kindling's servers and clients accept from {NAMESPACE} only")
    for (ns, _), c in sorted(certs.items()):
        ok = [p for p, s in checked if s[:3] == issuer_of(c) and ns in s[3] and permits(p, c)]
        if not ok:
            bad(f"Certificate/{c['metadata']['name']} in {ns}: no {POLICY_KIND} permits it: it would never be "
                "signed")
    roles = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterRole"}
    usable = set()
    for b in (o for o in objs if o["kind"] == "ClusterRoleBinding"):
        role = roles.get((b.get("roleRef") or {}).get("name"))
        grants = {n for r in (role or {}).get("rules") or []
                  if POLICY_GROUP in (r.get("apiGroups") or []) and "use" in (r.get("verbs") or [])
                  and "certificaterequestpolicies" in (r.get("resources") or [])
                  for n in (r.get("resourceNames") or ["*"])}
        if not grants:
            continue
        subjects = {(s.get("kind"), s.get("namespace"), s.get("name")) for s in b.get("subjects") or []}
        if subjects != {("ServiceAccount", *CERT_MANAGER_ACCOUNT)}:
            bad(f"ClusterRoleBinding/{b['metadata']['name']} lets {sorted(subjects)} use {POLICY_KIND}s: only "
                f"cert-manager's controller ({'/'.join(CERT_MANAGER_ACCOUNT)}) may")
            continue
        usable |= grants
    for p, _ in checked:
        if p["metadata"]["name"] not in usable and "*" not in usable:
            bad(f"{POLICY_KIND}/{p['metadata']['name']}: cert-manager's controller may not use it: approver-policy "
                "ignores it and its requests stay unapproved")
