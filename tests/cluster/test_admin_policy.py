"""The admin's limits, with the real apiserver, JobSet controller and kwok nodes.

- `rosetta operator --policy FILE`: a training the policy forbids is refused with the fields in its
  status and a Warning event, and nothing is created for it; an allowed one gets its JobSet; the
  forbidden one, fixed, gets its JobSet too.
- Each rule of the policy's placement, resources and queue, and a namespace's own entry, against one
  operator: one training per rule, created at once, each refused for its rule alone, beside an
  allowed one that the namespace's entry lets through.
- The after-training evaluation Job is judged again when the training has succeeded: a JobSet whose
  record of the spec was rewritten gets no Job the policy forbids.
- The apiserver itself refuses a JobSet: a ValidatingAdmissionPolicy (CEL, built into the apiserver)
  for good (422: condition CreateRejected, one attempt, none until the spec changes), a
  ResourceQuota for now (403 exceeded quota: condition QuotaExceeded, retried until it fits).

The operator runs as its own process, as in the other cluster tests, with a metrics port of its own
here: its reconcile counter says how often it tried.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import urllib.request
from typing import Iterator

import kubernetes
import yaml
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families
from test_lifecycle import small_training
from workloads import condition, provision, running_pods, status

from control_plane import free_port
from rosetta_contract.spec import parse_training
from rosetta_contract.trainer_pod import DEFAULT_IMAGE
from rosetta_operator.applied_spec import APPLIED_SPEC
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
        # The JobSet is created before the status that says so is written.
        wait_for(lambda: (condition(live_cluster, ns, "allowed", "Valid") or {}).get("reason") == "SpecValid",
                 "the allowed training Valid")
        # Nothing was created for the forbidden one.
        assert set(live_cluster.jobsets(ns)) == {"allowed"}
        assert set(live_cluster.configmaps(ns)) == {"allowed-config"}

        # Brought within the policy, it is reconciled like any edit.
        edit(live_cluster, ns, "forbidden", {"image": DEFAULT_IMAGE, "nodes": 2, "scheduling": None})
        wait_for(lambda: has_jobset(live_cluster, ns, "forbidden"), "the fixed training's JobSet")
        wait_for(lambda: (condition(live_cluster, ns, "forbidden", "Valid") or {}).get("status") == "True",
                 "forbidden: Valid=True")
        assert op.reconciles().get("forbidden") == 1


INSTANCE_TYPE = "node.kubernetes.io/instance-type"
QUEUE = "team-queue"


def rules_policy(namespace: str) -> dict:
    """Cluster-wide limits, and the test namespace's entry over them: two nodes where one is the
    cluster's limit, and a Kueue queue required."""
    return {"allowedNodeSelectorKeys": [INSTANCE_TYPE, "eks.amazonaws.com/nodegroup"],
            "allowedNodeSelectorValues": {INSTANCE_TYPE: ["m6i.4xlarge"]},
            "allowedGpuResources": ["nvidia.com/gpu"], "maxEfaPerNode": 0, "maxMemoryPerPod": "4Gi",
            "maxCpuPerTraining": 4, "maxShmSize": "1Gi", "maxNodes": 1,
            "namespaces": {namespace: {"maxNodes": 2, "requireQueue": True}}}


def one_rule_each(namespace: str) -> dict[str, tuple[dict, str]]:
    """name → (what the spec changes from the allowed training, the one refusal it must get)."""
    cp = "node-role.kubernetes.io/control-plane"
    entry = f"(operator policy for namespace '{namespace}')"
    return {
        "control-plane": ({"scheduling": {"queueName": QUEUE, "nodeSelector": {cp: ""}}},
                          f"spec.scheduling.nodeSelector.{cp}: selects control-plane nodes"),
        "tolerate-all": ({"scheduling": {"queueName": QUEUE, "tolerations": [{"operator": "Exists"}]}},
                         "spec.scheduling.tolerations[0]: an empty key with operator Exists tolerates every taint"),
        "node-key": ({"scheduling": {"queueName": QUEUE, "nodeSelector": {"topology.kubernetes.io/zone": "a"}}},
                     "selects nodes by 'topology.kubernetes.io/zone', which is not allowed here; allowed keys: "
                     f"{INSTANCE_TYPE}, eks.amazonaws.com/nodegroup {entry}"),
        "node-value": ({"scheduling": {"queueName": QUEUE, "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": INSTANCE_TYPE, "operator": "In", "values": ["p5.48xlarge"]}]}]}}}}},
                       "spec.scheduling.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
                       f"nodeSelectorTerms[0].matchExpressions[0]: selects '{INSTANCE_TYPE}' = 'p5.48xlarge', which "
                       "is not allowed here; allowed values: m6i.4xlarge"),
        "gpu-resource": ({"gpusPerNode": 1, "procsPerNode": None, "training": {"device": "cuda"},
                          "resources": {"cpu": 1, "memory": "3Gi", "shmSize": "1Gi", "gpuResource": "amd.com/gpu"}},
                         "spec.resources.gpuResource: 'amd.com/gpu' is not allowed here; allowed: nvidia.com/gpu"),
        "efa": ({"resources": {"cpu": 1, "memory": "3Gi", "shmSize": "1Gi", "efa": 1}},
                f"spec.resources.efa: 1 EFA devices per pod; at most 0 here {entry}"),
        "memory": ({"resources": {"cpu": 1, "memory": "8Gi", "shmSize": "1Gi"}},
                   f"spec.resources.memory: 8Gi of memory per pod; at most 4Gi here {entry}"),
        "cpu": ({"resources": {"cpu": 3, "memory": "3Gi", "shmSize": "1Gi"}},
                f"spec.resources.cpu: 2 pods × 3 of CPU is more than the 4 a training may have here {entry}"),
        "shm": ({"resources": {"cpu": 1, "memory": "3Gi", "shmSize": "2Gi"}},
                f"spec.resources.shmSize: 2Gi; at most 1Gi here {entry}"),
        "no-queue": ({"scheduling": {}},
                     "spec.scheduling.queueName: unset; trainings here must wait for Kueue to admit them: name a "
                     f"LocalQueue of the namespace {entry}"),
    }


def with_changes(allowed: dict, name: str, changes: dict) -> dict:
    """The allowed training under another name, with `changes` over its spec (None drops a field)."""
    doc = copy.deepcopy(allowed)
    doc["metadata"]["name"] = name
    for key, value in changes.items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = {**doc["spec"][key], **value} if key == "training" else value
    return doc


def test_each_rule_refuses_its_training_and_a_namespace_entry_overrides(live_cluster, live_namespace, tmp_path):
    ns = live_namespace
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(rules_policy(ns)))
    allowed = small_training(ns, "allowed")  # two nodes: over the cluster-wide limit, within the namespace's
    allowed["spec"]["scheduling"] = {"queueName": QUEUE, "nodeSelector": {INSTANCE_TYPE: "m6i.4xlarge"}}
    provision(live_cluster, ns, allowed)   # the checkpoints claim all of them name
    cases = one_rule_each(ns)

    with operator(live_cluster, ns, "--policy", str(tmp_path / "policy.yaml")):
        for name, (changes, _) in cases.items():
            live_cluster.create_training(ns, with_changes(allowed, name, changes))
        live_cluster.create_training(ns, allowed)
        wait_for(lambda: has_jobset(live_cluster, ns, "allowed"), "the allowed training's JobSet")
        # The JobSet is created before the status that says so is written.
        wait_for(lambda: (condition(live_cluster, ns, "allowed", "Valid") or {}).get("reason") == "SpecValid",
                 "the allowed training Valid")

        problems = []
        for name, (_, expected) in cases.items():
            valid = wait_for(lambda name=name: (c := condition(live_cluster, ns, name, "Valid"))
                             and c["status"] == "False" and c, f"{name}: Valid=False")
            # Its rule, and no other: each refusal ends with the policy it came from.
            if valid["reason"] != "ForbiddenByPolicy" or expected not in valid["message"] \
                    or valid["message"].count("(operator policy") != 1:
                problems.append(f"{name}: {valid['reason']}: {valid['message']}")
        assert not problems, "\n".join(problems)
        # Nothing was created for the refused ones.
        assert set(live_cluster.jobsets(ns)) == {"allowed"}
        assert set(live_cluster.configmaps(ns)) == {"allowed-config"}


def test_the_evaluation_job_is_judged_again_before_it_is_created(live_cluster, live_namespace, tmp_path):
    ns, name = live_namespace, "evaluated"
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump({"maxCpuPerPod": 2}))
    doc = small_training(ns, name)
    doc["spec"]["evaluation"] = {**doc["spec"]["evaluation"], "afterTraining": {"checkpoint": "final", "cpu": 1,
                                                                                 "memory": "1Gi"}}
    provision(live_cluster, ns, doc)
    batch = kubernetes.client.BatchV1Api(live_cluster.api)

    with operator(live_cluster, ns, "--policy", str(tmp_path / "policy.yaml")):
        live_cluster.create_training(ns, doc)
        jobset = wait_for(lambda: live_cluster.jobsets(ns).get(name), "the JobSet")
        # Whoever may patch JobSets rewrites the spec the evaluation Job would be built from.
        applied = json.loads(jobset["metadata"]["annotations"][APPLIED_SPEC])
        applied["evaluation"]["afterTraining"]["cpu"] = 16
        live_cluster.custom.patch_namespaced_custom_object(JS_GROUP, JS_VERSION, ns, JS_PLURAL, name, {
            "metadata": {"annotations": {APPLIED_SPEC: json.dumps(applied)}}})
        pods = wait_for(lambda: (p := running_pods(live_cluster, ns, name)) and len(p) == 2 and p, "2 running pods", 90)
        for pod in pods:
            live_cluster.end_pod(ns, pod.metadata.name, 0)

        done = wait_for(lambda: (s := status(live_cluster, ns, name)).get("evaluation") and s, "status.evaluation", 90)
        message = ("spec.evaluation.afterTraining.cpu: 16 of CPU for the evaluation pod; at most 2 per pod here "
                   "(operator policy)")
        assert done["phase"] == "Succeeded"  # the training itself did
        assert done["evaluation"] == {"phase": "Failed", "jobName": f"{name}-eval", "checkpoint": "final",
                                      "message": message}
        evaluated = condition(live_cluster, ns, name, "Evaluated")
        assert (evaluated["status"], evaluated["reason"], evaluated["message"]) == ("False", "ForbiddenByPolicy",
                                                                                      message)
        one_warning(live_cluster, ns, name, "ForbiddenByPolicy")
        assert batch.list_namespaced_job(ns, label_selector=f"rosetta.dev/evaluation={name}").items == []


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

    with operator(live_cluster, ns, "--quota-retry", "3") as op:
        live_cluster.create_training(ns, doc)
        created = wait_for(lambda: (c := condition(live_cluster, ns, "crowded", "Created")) and c, "Created")
        assert (created["status"], created["reason"]) == ("False", "QuotaExceeded")
        assert "exceeded quota: jobsets" in created["message"]
        assert status(live_cluster, ns, "crowded")["phase"] == "Pending"
        one_warning(live_cluster, ns, "crowded", "QuotaExceeded")

        # Room again: the retry (--quota-retry, 30 s unless set) creates it, with no spec change.
        live_cluster.core.patch_namespaced_resource_quota("jobsets", ns, {"spec": {"hard": {
            f"count/{JS_PLURAL}.{JS_GROUP}": "1"}}})
        wait_for(lambda: has_jobset(live_cluster, ns, "crowded"), "the JobSet once the quota has room", 30)
        wait_for(lambda: (condition(live_cluster, ns, "crowded", "Created") or {}).get("status") == "True",
                 "Created=True")
        assert op.reconciles().get("quota", 0) >= 1
        assert warnings(live_cluster, ns, "crowded", "QuotaExceeded") == 1
