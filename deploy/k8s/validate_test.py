"""The checks of Spark's wire, the Spark driver's rights and the CA's scope
refuse what they are there to refuse: each test renders an overlay with the
built-in renderer, puts back one weakness the shipped manifests closed, and
expects the check to name it; the shipped manifests pass.

    python3 -m unittest deploy/k8s/validate_test.py   (validate.sh runs it)
"""

import copy
import re
import sys
import tempfile
import unittest

from validate_issuer import check_issuer_scope
from validate_network import check_network_policies
from validate_render import render_builtin, with_dummy_token
from validate_spark import check_spark_driver_role, check_spark_wire

TMP = tempfile.TemporaryDirectory()
ROOT = with_dummy_token(TMP.name)
RENDERED = {overlay: render_builtin(ROOT, overlay) for overlay in ("cpu", "cert-manager", "probes-from-nodes")}
CHECKS = (check_spark_wire, check_spark_driver_role, check_issuer_scope, check_network_policies)


def run_checks(objs, overlay="cpu"):
    errors = []
    for check in CHECKS:
        check(objs, overlay, errors)
    return errors


def one(objs, kind, name):
    hits = [o for o in objs if o["kind"] == kind and re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?",
                                                                  o["metadata"]["name"])]
    assert len(hits) == 1, (kind, name, len(hits))
    return hits[0]


def driver_args(objs):
    return one(objs, "Deployment", "spark-connect")["spec"]["template"]["spec"]["containers"][0]["args"]


def set_conf(objs, key, value):
    """Sets (value) or drops (None) a driver --conf."""
    args = driver_args(objs)
    at = next((i for i, a in enumerate(args) if str(a).startswith(key + "=")), None)
    if at is not None:
        del args[at - 1:at + 1]
    if value is not None:
        args[-1:-1] = ["--conf", f"{key}={value}"]


class Refusals(unittest.TestCase):
    def rendered(self, overlay="cpu"):
        return copy.deepcopy(RENDERED[overlay])

    def assert_refused(self, objs, *words, overlay="cpu"):
        errors = run_checks(objs, overlay)
        self.assertTrue(any(all(w in e for w in words) for e in errors),
                        f"no error naming {words}; got:\n" + "\n".join(errors))

    def test_shipped_manifests_pass(self):
        for overlay in RENDERED:
            self.assertEqual(run_checks(self.rendered(overlay), overlay), [], overlay)

    def test_spark_without_authentication_or_encryption(self):
        for key in ("spark.authenticate", "spark.network.crypto.enabled", "spark.io.encryption.enabled"):
            objs = self.rendered()
            set_conf(objs, key, None)
            self.assert_refused(objs, key)
        objs = self.rendered()
        set_conf(objs, "spark.network.crypto.saslFallback", "true")
        self.assert_refused(objs, "saslFallback")

    def test_spark_secret_inline_or_in_the_pod_spec(self):
        objs = self.rendered()
        set_conf(objs, "spark.authenticate.secret", "x")
        self.assert_refused(objs, "on the command line")
        objs = self.rendered()
        set_conf(objs, "spark.authenticate.secret.executor.file", None)
        self.assert_refused(objs, "spark.authenticate.secret.executor.file", "pods' spec")
        objs = self.rendered()
        set_conf(objs, "spark.authenticate.secret.driver.file", "/tmp/secret")
        self.assert_refused(objs, "/tmp/secret", "no Secret mounted")

    def test_spark_secret_mounted_outside_spark(self):
        objs = self.rendered()
        pod = one(objs, "Deployment", "spark-connect")["spec"]["template"]["spec"]
        sidecar = next(c for c in pod["containers"] if c["name"] == "tls")
        sidecar["volumeMounts"].append({"name": "spark-authenticate", "mountPath": "/s", "readOnly": True})
        self.assert_refused(objs, "container tls mounts Spark's secret")
        objs = self.rendered()
        agent = one(objs, "DaemonSet", "kindling-agent")["spec"]["template"]["spec"]
        agent["volumes"].append({"name": "s", "secret": {"secretName": "spark-authenticate"}})
        self.assert_refused(objs, "kindling-agent", "mounts Spark's secret")

    def test_executor_block_manager_open(self):
        objs = self.rendered()
        objs.remove(one(objs, "NetworkPolicy", "spark-executor"))
        self.assert_refused(objs, "executor-pod-template", "no NetworkPolicy isolates it", "7079")
        objs = self.rendered()
        del one(objs, "NetworkPolicy", "spark-executor")["spec"]["ingress"][0]["from"]
        self.assert_refused(objs, "port 7079 admits")

    def test_probe_port_narrowed_to_pods_or_the_ip_block_widened_to_flight(self):
        # The nodes' network on the probe port passes (test_shipped_manifests_pass);
        # a pod selector there never matches the kubelet.
        objs = self.rendered("probes-from-nodes")
        probe = one(objs, "NetworkPolicy", "kindling-agent")["spec"]["ingress"][1]
        probe["from"] = [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kindling-client"}}}]
        self.assert_refused(objs, "probe port 8080 must admit every source, or the nodes' network",
                            overlay="probes-from-nodes")
        # The nodes' network on the Flight port is no peer of it.
        objs = self.rendered("probes-from-nodes")
        rules = one(objs, "NetworkPolicy", "kindling-agent")["spec"]["ingress"]
        rules[0]["from"].append({"ipBlock": {"cidr": "10.0.0.0/16"}})
        self.assert_refused(objs, "kindling-agent", "10.0.0.0/16", overlay="probes-from-nodes")

    def test_driver_role_wider_than_spark_needs(self):
        objs = self.rendered()
        one(objs, "Role", "spark-driver")["rules"][0]["resources"].append("services")
        self.assert_refused(objs, "may touch pods only")
        objs = self.rendered()
        one(objs, "Role", "spark-driver")["rules"].append(
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["update"]})
        self.assert_refused(objs, "may touch pods only")
        objs = self.rendered()
        one(objs, "Role", "spark-driver")["rules"][0]["verbs"].append("patch")
        self.assert_refused(objs, "['patch'] Spark does not use")
        objs = self.rendered()
        one(objs, "Role", "spark-driver")["rules"][0]["verbs"].remove("watch")
        self.assert_refused(objs, "may not ['watch'] pods")
        objs = self.rendered()
        set_conf(objs, "spark.kubernetes.executor.disableConfigMap", None)
        self.assert_refused(objs, "disableConfigMap")

    def test_cluster_issuer_unrestricted(self):
        objs = [o for o in self.rendered("cert-manager") if o["kind"] != "CertificateRequestPolicy"]
        self.assert_refused(objs, "signs for every namespace", overlay="cert-manager")

    def test_cluster_issuer_policy_too_wide(self):
        cases = [
            (lambda p: p["spec"]["selector"]["namespace"].update(matchNames=["*"]), "wildcard"),
            (lambda p: p["spec"]["selector"]["namespace"].update(matchNames=["kindling", "default"]),
             "sign in ['default']"),
            (lambda p: p["spec"]["allowed"]["dnsNames"]["values"].append("kindling-agent"),
             "allows ['kindling-agent'] in kindling-spark"),
            (lambda p: p["spec"]["allowed"].update(ipAddresses={"values": ["10.0.0.1"]}), "ipAddresses"),
            (lambda p: p["spec"]["selector"].pop("issuerRef"), "wildcard, labels or nothing"),
        ]
        for change, words in cases:
            objs = self.rendered("cert-manager")
            change(one(objs, "CertificateRequestPolicy", "kindling-ca-kindling-spark"))
            self.assert_refused(objs, words, overlay="cert-manager")

    def test_policies_usable_by_cert_manager_only(self):
        objs = self.rendered("cert-manager")
        one(objs, "ClusterRoleBinding", "kindling-certificate-policies")["subjects"].append(
            {"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"})
        self.assert_refused(objs, "only cert-manager's controller", overlay="cert-manager")
        objs = self.rendered("cert-manager")
        objs.remove(one(objs, "ClusterRoleBinding", "kindling-certificate-policies"))
        self.assert_refused(objs, "may not use it", overlay="cert-manager")

    def test_shipped_certificate_outside_the_policy(self):
        objs = self.rendered("cert-manager")
        cert = next(o for o in objs if o["kind"] == "Certificate" and o["metadata"]["name"] == "kindling-agent-tls")
        cert["spec"]["dnsNames"].append("kindling-agent.example.com")
        self.assert_refused(objs, "Certificate/kindling-agent-tls", "never be signed", overlay="cert-manager")


if __name__ == "__main__":
    sys.exit(unittest.main())
