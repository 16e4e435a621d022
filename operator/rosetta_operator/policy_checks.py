"""The admin policy's rules held against a spec: `violations(spec, policy, namespace)` returns every
rule a spec breaks as (field path, message saying what is allowed), each message ending with where
the rule came from (the cluster-wide policy or a namespace's entry).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, Callable, Iterable

from rosetta_contract.profiles import PROFILES
from rosetta_contract.quantities import quantity_value
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_operator.policy_fields import Policy, Rules

# The ServiceAccount a pod runs as when the spec names none (Kubernetes' default).
DEFAULT_SERVICE_ACCOUNT = "default"
# The node labels (and taint keys) of control-plane nodes: kubeadm's, and the name before 1.24.
CONTROL_PLANE_KEYS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
# Node affinity operators that keep pods off the nodes with a label rather than aim at them.
AVOIDING = ("NotIn", "DoesNotExist")

Problems = list[tuple[str, str]]


def violations(spec: TranslationTrainingSpec, policy: Policy | None, namespace: str) -> Problems:
    """Every rule that `spec`, in `namespace`, breaks, as (field path, message saying what is allowed).
    No policy: the defaults."""
    rules = rules_for(policy, namespace)
    return [problem for rule in RULES for problem in rule(spec, rules)]


def rules_for(policy: Policy | None, namespace: str) -> Rules:
    return (policy or Policy()).for_namespace(namespace)


def normalized_image(image: str) -> str:
    """The reference as Docker resolves it: `ubuntu` → docker.io/library/ubuntu, `org/x` →
    docker.io/org/x. A first component with a '.' or ':' (or `localhost`) is a registry host."""
    first, slash, rest = image.partition("/")
    if not slash or ("." not in first and ":" not in first and first != "localhost"):
        first, rest = "docker.io", image
    if first == "index.docker.io":
        first = "docker.io"
    if first == "docker.io" and "/" not in rest:
        rest = f"library/{rest}"
    return f"{first}/{rest}"


def _under(value: str, prefix: str, separators: str) -> bool:
    """`value` starts with `prefix` at a component boundary (one of `separators`)."""
    if prefix.endswith(tuple(separators)):
        return value.startswith(prefix)
    return value == prefix or (value.startswith(prefix) and value[len(prefix)] in separators)


def _allowed(items: Iterable[str], limit: int = 10) -> str:
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f", … ({len(items)} in all)" if len(items) > limit else "")


def _shown(value: str, limit: int = 120) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "…")


def _image(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    if not rules.allowed_registries:
        return []
    image = normalized_image(spec.image)
    if any(_under(image, prefix, "/:@") for prefix in rules.allowed_registries):
        return []
    default = "" if "image" in spec.model_fields_set else " (the default image)"
    read = f" (read as {_shown(image)})" if image != spec.image else ""
    return [("spec.image", f"{_shown(spec.image)}{default}{read} is not from an allowed registry; allowed: "
                           f"{_allowed(rules.allowed_registries)} {rules.suffix}")]


def _service_account(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    out = []
    account = spec.service_account_name or DEFAULT_SERVICE_ACCOUNT
    if rules.allowed_service_accounts and account not in rules.allowed_service_accounts:
        what = (_shown(account) if spec.service_account_name else
                f"unset, so the pods would run as the namespace's {DEFAULT_SERVICE_ACCOUNT!r} ServiceAccount, which")
        out.append(("spec.serviceAccountName", f"{what} is not allowed here; allowed: "
                                               f"{_allowed(rules.allowed_service_accounts)} {rules.suffix}"))
    if spec.pod_security.automount_service_account_token and not rules.allow_service_account_token:
        out.append(("spec.podSecurity.automountServiceAccountToken",
                    f"the ServiceAccount's API token may not be mounted into training pods here; remove it or "
                    f"set it to false {rules.suffix}"))
    return out


def _priority_class(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    name = spec.scheduling.priority_class_name
    if not name or not rules.allowed_priority_classes or name in rules.allowed_priority_classes:
        return []
    return [("spec.scheduling.priorityClassName", f"{_shown(name)} is not allowed here; allowed: "
                                                  f"{_allowed(rules.allowed_priority_classes)} {rules.suffix}")]


def _queue(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    queue, allowed = spec.scheduling.queue_name, rules.allowed_queues
    listed = f"; allowed: {_allowed(allowed)}" if allowed else ""
    if queue is None and rules.require_queue:
        return [("spec.scheduling.queueName", f"unset; trainings here must wait for Kueue to admit them: name "
                                              f"a LocalQueue of the namespace{listed} {rules.suffix}")]
    if queue is not None and allowed and queue not in allowed:
        return [("spec.scheduling.queueName", f"{_shown(queue)} is not allowed here{listed} {rules.suffix}")]
    return []


def _control_plane(rules: Rules) -> str:
    return f"control-plane nodes, which run the cluster itself and take no trainings here (allowControlPlane: false) {rules.suffix}"


def _tolerations(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    out = []
    keys = rules.allowed_toleration_keys
    for i, toleration in enumerate(spec.scheduling.tolerations):
        path = f"spec.scheduling.tolerations[{i}]"
        if not toleration.key and toleration.operator == "Exists":
            if keys or not rules.allow_tolerate_all:
                allowed = f"; allowed keys: {_allowed(keys)}" if keys else ""
                out.append((path, "an empty key with operator Exists tolerates every taint (control-plane and "
                                  f"system nodes included), which is not allowed here{allowed} {rules.suffix}"))
        elif toleration.key in CONTROL_PLANE_KEYS and not rules.allow_control_plane:
            out.append((f"{path}.key", f"{_shown(toleration.key)} tolerates the taint of "
                                       f"{_control_plane(rules)}"))
        elif keys and (toleration.key or "") not in keys:
            out.append((f"{path}.key", f"{_shown(toleration.key or '')} is not allowed here; allowed: "
                                       f"{_allowed(keys)} {rules.suffix}"))
    return out


def _node_label(key: str, operator: str, values: list[str], rules: Rules) -> str | None:
    """Why selecting nodes by label `key` (a node selector is operator In, one value) is not allowed
    here, or None."""
    if key in CONTROL_PLANE_KEYS:
        if operator in AVOIDING:
            return None  # keeping off the control plane is never refused
        if not rules.allow_control_plane:
            return f"selects {_control_plane(rules)}"
    keys = rules.allowed_node_selector_keys
    if keys and key not in keys:
        return f"selects nodes by {_shown(key)}, which is not allowed here; allowed keys: {_allowed(keys)} {rules.suffix}"
    allowed = rules.allowed_node_selector_values.get(key)
    if allowed is not None and (operator != "In" or not set(values) <= set(allowed)):
        how = f"= {_shown(values[0])}" if operator == "In" and len(values) == 1 else " ".join([operator, *values])
        return (f"selects {_shown(key)} {how}, which is not allowed here; allowed values: {_allowed(allowed)}"
                f"{' (operator In)' if operator != 'In' else ''} {rules.suffix}")
    return None


def _node_selector(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    out = []
    profile = spec.network.profile
    for key, value in {**PROFILES[profile].node_selector, **spec.scheduling.node_selector}.items():
        problem = _node_label(key, "In", [value], rules)
        if problem is None:
            continue
        if key in spec.scheduling.node_selector:
            out.append((f"spec.scheduling.nodeSelector.{key}", problem))
        else:
            out.append(("spec.network.profile", f"{profile} {problem}"))
    return out


def _node_affinity(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    # Terms are checked one by one, required and preferred alike: a preference steers pods as surely
    # as a requirement once the nodes it names have room. Pod (anti-)affinity aims at pods, not nodes.
    base = "spec.scheduling.affinity.nodeAffinity"
    node_affinity = (spec.scheduling.affinity or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms: list[tuple[str, Any]] = [
        (f"{base}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]", term)
        for i, term in enumerate(required.get("nodeSelectorTerms") or [])]
    terms += [(f"{base}.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference", p.get("preference") or {})
              for i, p in enumerate(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or [])]
    out = []
    for path, term in terms:
        for kind in ("matchExpressions", "matchFields"):
            for j, expression in enumerate(term.get(kind) or []):
                values = [str(v) for v in expression.get("values") or []]
                problem = _node_label(str(expression.get("key", "")), str(expression.get("operator", "")), values, rules)
                if problem is not None:
                    out.append((f"{path}.{kind}[{j}]", problem))
    return out


def _gpu_resource(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    name, allowed = spec.resources.gpu_resource, rules.allowed_gpu_resources
    if not spec.gpus_per_node or not allowed or name in allowed:
        return []
    default = "" if "gpu_resource" in spec.resources.model_fields_set else " (the default)"
    return [("spec.resources.gpuResource", f"{_shown(name)}{default} is not allowed here; allowed: "
                                           f"{_allowed(allowed)} {rules.suffix}")]


def _efa(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    if rules.max_efa_per_node is None or spec.mode == "evaluate":  # one evaluation pod gets no EFA
        return []
    profile = spec.network.profile
    own = spec.resources.efa is not None
    efa = spec.resources.efa if spec.resources.efa is not None else PROFILES[profile].efa_devices
    if efa <= rules.max_efa_per_node:
        return []
    if own:
        return [("spec.resources.efa", f"{efa} EFA devices per pod; at most {rules.max_efa_per_node} here "
                                       f"{rules.suffix}")]
    return [("spec.network.profile", f"{profile} asks for {efa} EFA devices per pod; at most "
                                     f"{rules.max_efa_per_node} here: set resources.efa or choose another "
                                     f"profile {rules.suffix}")]


def _more(value: str, limit: str) -> bool:
    return quantity_value(value) > quantity_value(limit)


def _cpu_and_memory(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    out = []
    pods = 1 if spec.mode == "evaluate" else spec.nodes
    for field, what, per_pod, per_training in (("cpu", "CPU", rules.max_cpu_per_pod, rules.max_cpu_per_training),
                                               ("memory", "memory", rules.max_memory_per_pod,
                                                rules.max_memory_per_training)):
        value = getattr(spec.resources, field)
        path = f"spec.resources.{field}"
        limits = [f"{limit} {where}" for limit, where in ((per_pod, "per pod"), (per_training, "per training"))
                  if limit is not None]
        if not limits:
            continue
        if value is None:
            if field == "memory":  # unset is no memory limit at all; an unset CPU request reserves nothing
                out.append((path, f"unset, so the pods' memory would not be limited; set it: at most "
                                  f"{' and '.join(limits)} here {rules.suffix}"))
            continue
        if per_pod is not None and _more(value, per_pod):
            out.append((path, f"{value} of {what} per pod; at most {per_pod} here {rules.suffix}"))
        elif per_training is not None and quantity_value(value) * pods > quantity_value(per_training):
            out.append((path, f"{pods} pods × {value} of {what} is more than the {per_training} a training may "
                              f"have here {rules.suffix}"))
    after = spec.evaluation.after_training
    if after is not None and spec.mode != "evaluate":
        for field, what, per_pod in (("cpu", "CPU", rules.max_cpu_per_pod), ("memory", "memory", rules.max_memory_per_pod)):
            value = getattr(after, field)
            if per_pod is not None and _more(value, per_pod):
                default = "" if field in after.model_fields_set else " (the default)"
                out.append((f"spec.evaluation.afterTraining.{field}",
                            f"{value}{default} of {what} for the evaluation pod; at most {per_pod} per pod here "
                            f"{rules.suffix}"))
    shm = spec.resources.shm_size
    if rules.max_shm_size is not None and _more(shm, rules.max_shm_size):
        default = "" if "shm_size" in spec.resources.model_fields_set else " (the default)"
        out.append(("spec.resources.shmSize", f"{shm}{default}; at most {rules.max_shm_size} here {rules.suffix}"))
    return out


def _host_paths(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    # Reached only when hostPath volumes are allowed at all (spec.py refuses them otherwise), by
    # --allow-host-path or the policy. A namespace entry that says otherwise is the narrower word.
    out = []
    volumes = [(i, vol.host_path.path) for i, vol in enumerate(spec.volumes) if vol.host_path is not None]
    if not rules.allows_host_path and rules.overrides & {"allow_host_path", "allowed_host_paths"}:
        return [(f"spec.volumes[{i}].hostPath", f"hostPath volumes are not allowed here; use a "
                                                f"persistentVolumeClaim {rules.suffix}") for i, _ in volumes]
    if not rules.allowed_host_paths:
        return []
    # The path is compared as written, '..' resolved; symlinks on the node are the node's to keep in check.
    for i, written in volumes:
        path = posixpath.normpath(re.sub("/+", "/", written))
        if not any(_under(path, posixpath.normpath(p), "/") for p in rules.allowed_host_paths):
            read = f" (read as {_shown(path)})" if path != written else ""
            out.append((f"spec.volumes[{i}].hostPath.path",
                        f"{_shown(written)}{read} is not under an allowed node path; allowed: "
                        f"{_allowed(rules.allowed_host_paths)} {rules.suffix}"))
    return out  # a subPath stays inside the volume: spec.py refuses '..' and absolute ones


def _size(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    out = []
    if rules.max_nodes is not None and spec.nodes > rules.max_nodes:
        out.append(("spec.nodes", f"{spec.nodes} nodes; at most {rules.max_nodes} per training here {rules.suffix}"))
    if rules.max_gpus_per_node is not None and spec.gpus_per_node > rules.max_gpus_per_node:
        out.append(("spec.gpusPerNode", f"{spec.gpus_per_node} GPUs per node; at most {rules.max_gpus_per_node} "
                                        f"here {rules.suffix}"))
    gpus = spec.nodes * spec.gpus_per_node
    if rules.max_gpus_per_training is not None and gpus > rules.max_gpus_per_training:
        out.append(("spec.gpusPerNode", f"{spec.nodes} nodes × {spec.gpus_per_node} GPUs = {gpus} GPUs; at most "
                                        f"{rules.max_gpus_per_training} per training here {rules.suffix}"))
    return out


def _root_group(spec: TranslationTrainingSpec, rules: Rules) -> Problems:
    if rules.allow_root_group:
        return []
    sec = spec.pod_security
    return [(f"spec.podSecurity.{field}", f"group 0 (root's group) is not allowed here {rules.suffix}")
            for field, value in (("runAsGroup", sec.run_as_group), ("fsGroup", sec.fs_group)) if value == 0]


RULES: tuple[Callable[[TranslationTrainingSpec, Rules], Problems], ...] = (
    _image, _service_account, _priority_class, _queue, _tolerations, _node_selector, _node_affinity,
    _gpu_resource, _efa, _cpu_and_memory, _host_paths, _size, _root_group,
)
