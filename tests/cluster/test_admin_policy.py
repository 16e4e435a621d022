"""The admin's limits, with the real apiserver, JobSet controller and kwok nodes.

- `rosetta operator --policy FILE`: a training the policy forbids is refused with the fields in its
  status and a Warning event, and nothing is created for it; an allowed one gets its JobSet; the
  forbidden one, fixed, gets its JobSet too.
- The apiserver itself refuses a JobSet: a ValidatingAdmissionPolicy (CEL, built into the apiserver)
  for good (422: condition CreateRejected, one attempt, none until the spec changes), a
  ResourceQuota for now (403 exceeded quota: condition QuotaExceeded, retried until it fits).

The operator runs as its own process, as in the other cluster tests, with a metrics port of its own
here: its reconcile counter says how often it tried.
"""

from __future__ import annotations

import contextlib
import time
import urllib.request
from typing import Iterator

import kubernetes
import yaml
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families
from test_lifecycle import small_training
from workloads import condition, provision, status

from control_plane import free_port
from rosetta_contract.pod_fields import DEFAULT_IMAGE
from rosetta_contract.spec import parse_training
from rosetta_operator.render import render
from support.cluster import GROUP, JS_GROUP, JS_PLURAL, JS_VERSION, PLURAL, VERSION, OperatorProcess, wait_for

REFUSED_REGISTRY = "registry.refused.example/"
POLICY = {"allowedRegistries": ["ghcr.io/rosetta-dev/"], "allowedPriorityClasses": ["batch-low"], "maxNodes": 2,
          "allowTolerateAll": False}


class Operator(OperatorProcess):
    def __init__(self, cluster, namespace: str, *args: str):
        liveness, self.metrics_port = free_port(), free_port()
        super().__init__(cluster, f"operator-{namespace}", "--namespace", namespace, "--liveness-port", str(liveness),
                         "--metrics-port", str(self.metrics_port), "--progress-interval", "2", *args)
        self.wait_healthy(liveness)

    def reconciles(self) -> dict[str, float]:
        """rosetta_operator_reconciles_total of the reconcile handler, by outcome."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return {s.labels["outcome"]: s.value for family in text_string_to_metric_families(text)
                for s in family.samples
                if s.name == "rosetta_operator_reconciles_total" and s.labels.get("handler") == "reconcile"}


@contextlib.contextmanager
def operator(cluster, namespace: str, *args: str) -> Iterator[Operator]:
    op = Operator(cluster, namespace, *args)
    try:
        yield op
        op.check_alive()
    finally:
        op.stop()


def warnings(cluster, namespace: str, name: str, reason: str) -> int:
    """How many times a Warning with `reason` was posted on training `name` (repeats count)."""
    events = cluster.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return sum(e.count or 1 for e in events if e.type == "Warning" and e.reason == reason)


def one_warning(cluster, namespace: str, name: str, reason: str) -> None:
    """kopf posts events from a queue of its own, moments after the status is written."""
    wait_for(lambda: warnings(cluster, namespace, name, reason), f"a {reason} event")
    assert warnings(cluster, namespace, name, reason) == 1


def edit(cluster, namespace: str, name: str, spec: dict) -> None:
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec})


def has_jobset(cluster, namespace: str, name: str) -> bool:
    return name in cluster.jobsets(namespace)


# ----------------------------------------------------------------------------------- policy


def test_the_policy_refuses_a_forbidden_training_and_admits_an_allowed_one(live_cluster, live_namespace, tmp_path):
    ns = live_namespace
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    allowed = small_training(ns, "allowed")
    forbidden = small_training(ns, "forbidden")
    forbidden["spec"].update(image="docker.io/library/busybox:1", nodes=3, scheduling={
        "priorityClassName": "system-node-critical", "tolerations": [{"operator": "Exists"}]})
    provision(live_cluster, ns, allowed)   # the checkpoints claim both use

    with operator(live_cluster, ns, "--policy", str(tmp_path / "policy.yaml")) as op:
        live_cluster.create_training(ns, forbidden)
        valid = wait_for(lambda: (c := condition(live_cluster, ns, "forbidden", "Valid")) and c["status"] == "False"
                         and c, "forbidden: Valid=False")
        assert valid["reason"] == "ForbiddenByPolicy"
        for field in ("spec.image: 'docker.io/library/busybox:1' is not from an allowed registry",
                      "spec.scheduling.tolerations[0]: an empty key with operator Exists tolerates every taint",
                      "spec.scheduling.priorityClassName: 'system-node-critical' is not allowed here; allowed: "
                      "batch-low (operator policy)",
                      "spec.nodes: 3 nodes; at most 2 per training here (operator policy)"):
            assert field in valid["message"], field
        assert status(live_cluster, ns, "forbidden")["phase"] == "Failed"
        one_warning(live_cluster, ns, "forbidden", "ForbiddenByPolicy")

        live_cluster.create_training(ns, allowed)
        wait_for(lambda: has_jobset(live_cluster, ns, "allowed"), "the allowed training's JobSet")
        assert (condition(live_cluster, ns, "allowed", "Valid") or {}).get("reason") == "SpecValid"
        # Nothing was created for the forbidden one.
        assert set(live_cluster.jobsets(ns)) == {"allowed"}
        assert set(live_cluster.configmaps(ns)) == {"allowed-config"}

        # Brought within the policy, it is reconciled like any edit.
        edit(live_cluster, ns, "forbidden", {"image": DEFAULT_IMAGE, "nodes": 2, "scheduling": None})
        wait_for(lambda: has_jobset(live_cluster, ns, "forbidden"), "the fixed training's JobSet")
        wait_for(lambda: (condition(live_cluster, ns, "forbidden", "Valid") or {}).get("status") == "True",
                 "forbidden: Valid=True")
        assert op.reconciles().get("forbidden") == 1


# ------------------------------------------------------------------------- refused by the API


@contextlib.contextmanager
def admission_policy(cluster, namespace: str) -> Iterator[str]:
    """A ValidatingAdmissionPolicy refusing, in `namespace`, JobSets whose image is from
    REFUSED_REGISTRY (the apiserver answers 422 Invalid); yields its message."""
    api = kubernetes.client.AdmissionregistrationV1Api(cluster.api)
    name = f"refuse-{namespace}"
    message = f"images from {REFUSED_REGISTRY} are not admitted here"
    images = "r.template.spec.template.spec.containers.exists(c, c.image.startsWith('%s'))" % REFUSED_REGISTRY
    api.create_validating_admission_policy({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": [JS_GROUP], "apiVersions": ["*"],
                                                         "operations": ["CREATE"], "resources": [JS_PLURAL]}]},
                 "validations": [{"expression": f"!object.spec.replicatedJobs.exists(r, {images})",
                                  "message": message}]}})
    api.create_validating_admission_policy_binding({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": namespace}}}}})
    try:
        yield message
    finally:
        api.delete_validating_admission_policy_binding(name)
        api.delete_validating_admission_policy(name)


def refused_by_admission(cluster, namespace: str, message: str) -> bool:
    """Whether the policy is in force yet (the apiserver loads it moments after it is created): a
    dry-run create of a JobSet it refuses."""
    doc = small_training(namespace, "probe")
    doc["spec"]["image"] = REFUSED_REGISTRY + "probe:1"
    jobset = render("probe", namespace, parse_training(doc).spec).jobset
    try:
        cluster.custom.create_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, JS_PLURAL, jobset,
                                                       dry_run="All")
    except ApiException as exc:
        return exc.status == 422 and message in (exc.body or "")
    return False


def test_a_jobset_the_apiserver_refuses_is_a_condition_not_a_retry_loop(live_cluster, live_namespace):
    ns = live_namespace
    doc = small_training(ns, "refused")
    doc["spec"]["image"] = REFUSED_REGISTRY + "trainer:1"
    provision(live_cluster, ns, doc)

    with admission_policy(live_cluster, ns) as message, operator(live_cluster, ns) as op:
        wait_for(lambda: refused_by_admission(live_cluster, ns, message), "the admission policy in force")
        live_cluster.create_training(ns, doc)
        created = wait_for(lambda: (c := condition(live_cluster, ns, "refused", "Created")) and c, "Created")
        assert (created["status"], created["reason"]) == ("False", "CreateRejected")
        assert created["message"].startswith("the API refused JobSet refused: ") and message in created["message"]
        current = status(live_cluster, ns, "refused")
        assert current["phase"] == "Failed" and current["message"] == created["message"]
        assert (condition(live_cluster, ns, "refused", "Failed") or {}).get("reason") == "CreateRejected"

        # kopf's error backoff would have tried again after 1, 2 and 5 s: it does not.
        time.sleep(10)
        after = op.reconciles()
        assert after.get("rejected") == 1 and not after.get("error"), after
        assert op.log.read_text().count("the API refused JobSet refused") == 1
        assert warnings(live_cluster, ns, "refused", "CreateRejected") == 1
        assert not has_jobset(live_cluster, ns, "refused")

        # The next edit of the spec is the next attempt.
        edit(live_cluster, ns, "refused", {"image": DEFAULT_IMAGE})
        wait_for(lambda: has_jobset(live_cluster, ns, "refused"), "the JobSet after the fix")
        wait_for(lambda: (condition(live_cluster, ns, "refused", "Created") or {}).get("status") == "True",
                 "Created=True")
        assert op.reconciles().get("rejected") == 1


def test_a_jobset_over_quota_waits_for_room(live_cluster, live_namespace):
    ns = live_namespace
    quota = {"metadata": {"name": "jobsets"}, "spec": {"hard": {f"count/{JS_PLURAL}.{JS_GROUP}": "0"}}}
    live_cluster.core.create_namespaced_resource_quota(ns, quota)
    # The quota controller fills in its status; until it has, admission refuses for another reason.
    wait_for(lambda: (live_cluster.core.read_namespaced_resource_quota("jobsets", ns).status.hard or {}),
             "the quota's status")
    doc = small_training(ns, "crowded")
    provision(live_cluster, ns, doc)

    with operator(live_cluster, ns) as op:
        live_cluster.create_training(ns, doc)
        created = wait_for(lambda: (c := condition(live_cluster, ns, "crowded", "Created")) and c, "Created")
        assert (created["status"], created["reason"]) == ("False", "QuotaExceeded")
        assert "exceeded quota: jobsets" in created["message"]
        assert status(live_cluster, ns, "crowded")["phase"] == "Pending"
        one_warning(live_cluster, ns, "crowded", "QuotaExceeded")

        # Room again: the retry (every 30 s) creates it, with no spec change.
        live_cluster.core.patch_namespaced_resource_quota("jobsets", ns, {"spec": {"hard": {
            f"count/{JS_PLURAL}.{JS_GROUP}": "1"}}})
        wait_for(lambda: has_jobset(live_cluster, ns, "crowded"), "the JobSet once the quota has room", 60)
        wait_for(lambda: (condition(live_cluster, ns, "crowded", "Created") or {}).get("status") == "True",
                 "Created=True")
        assert op.reconciles().get("quota", 0) >= 1
        assert warnings(live_cluster, ns, "crowded", "QuotaExceeded") == 1
