"""The cluster admin's policy: what a TranslationTraining may ask of this cluster.

spec.py says what a training can be anywhere; a policy says what it may be here. A policy is a
YAML mapping of the fields of `Policy` (camelCase, unknown keys refused), read once at startup:

    rosetta operator --policy policy.yaml          # the Helm chart's `policy:` values, from a ConfigMap
    rosetta validate -f training.yaml --policy policy.yaml     # the same check, before `kubectl apply`

Without a file the defaults apply, and an empty file is the defaults: a shared cluster's limits
(at most 16 nodes and 128 GPUs a training, no toleration of every taint, nothing aimed at the
control plane), everything else open. `namespaces` maps a namespace name or glob to rules of its
own: the fields an entry sets replace the cluster-wide ones for trainings in a matching namespace
(an exact name first, else the first glob in the file's order; one entry, never several).

`violations(spec, policy, namespace)` returns every rule a spec breaks as (field path, message); the
operator reports them like an invalid spec (condition Valid=False, reason ForbiddenByPolicy) and
creates nothing, and checks the spec again before it creates the after-training evaluation Job.
"""

from __future__ import annotations

import posixpath
import re
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Optional

from pydantic import Field, PrivateAttr, StrictInt, StringConstraints, ValidationError

from rosetta_contract import strict_yaml
from rosetta_contract.documents import format_errors
from rosetta_contract.labels import LabelKey, LabelValue
from rosetta_contract.profiles import PROFILES
from rosetta_contract.quantities import Quantity, quantity_value
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_contract.strict_model import ConfigError, Model

# Said after every violation, so a user can tell a policy refusal from a spec error.
SUFFIX = "(operator policy)"
# The ServiceAccount a pod runs as when the spec names none (Kubernetes' default).
DEFAULT_SERVICE_ACCOUNT = "default"
# The node labels (and taint keys) of control-plane nodes: kubeadm's, and the name before 1.24.
CONTROL_PLANE_KEYS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
# Node affinity operators that keep pods off the nodes with a label rather than aim at them.
AVOIDING = ("NotIn", "DoesNotExist")
# A shared cluster's defaults: one training takes at most 16 pods, 16 full 8-GPU machines, before
# an admin says more (per namespace, if only one team should); the largest shipped examples (4
# nodes; 2 × 8 GPUs) fit 4 and 8 times over.
DEFAULT_MAX_NODES = 16
DEFAULT_MAX_GPUS_PER_TRAINING = 128

Name = Annotated[str, StringConstraints(min_length=1, max_length=317, pattern=r"^\S+$")]
HostPath = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^/")]
# A namespace name, or a glob of one (team-*, ml-?, [ab]-dev).
NamespacePattern = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9*?\[\]!-]+$")]
# Strict: `maxNodes: true` is a mistake, not 1.
Limit = Optional[StrictInt]


class PolicyError(ValueError):
    """A policy file that cannot be used; the message is one line that names the file."""


class Rules(Model):
    """What an admin allows, cluster-wide or in one namespace. Lists: empty means any; numbers and
    quantities: null means no limit."""

    allowed_registries: list[Name] = Field(
        default_factory=list, max_length=256,
        description="Image reference prefixes the trainer image must start with, as Docker reads the "
                    "reference (`ubuntu` is docker.io/library/ubuntu), e.g. ghcr.io/rosetta-dev/ or "
                    "123456789012.dkr.ecr.us-east-1.amazonaws.com/. A prefix not ending in '/', ':' or '@' "
                    "matches up to one of them: ghcr.io/org matches ghcr.io/org/x, not ghcr.io/organic/x.",
    )
    allowed_service_accounts: list[Name] = Field(
        default_factory=list, max_length=256,
        description="ServiceAccounts the pods may run as. A training without serviceAccountName runs as "
                    "the namespace's 'default': list it to allow that.",
    )
    allow_service_account_token: bool = Field(
        True, description="Allow podSecurity.automountServiceAccountToken: true (the account's API token "
                          "in every pod).",
    )
    allowed_priority_classes: list[Name] = Field(
        default_factory=list, max_length=256,
        description="PriorityClasses scheduling.priorityClassName may name; unset is always allowed.",
    )
    allowed_toleration_keys: list[Name] = Field(
        default_factory=list, max_length=256,
        description="Taint keys scheduling.tolerations may tolerate. With a list, a toleration with an "
                    "empty key (operator Exists: every taint) is refused too. The toleration the operator "
                    "adds for the GPU resource's taint is allowedGpuResources' to limit.",
    )
    allow_tolerate_all: bool = Field(
        False, description="Allow a toleration with an empty key and operator Exists, which tolerates every "
                           "taint: control-plane, system and other teams' nodes included.",
    )
    allow_control_plane: bool = Field(
        False, description="Allow a training to aim at control-plane nodes: a node selector, node affinity "
                           "term (In, Exists) or toleration on node-role.kubernetes.io/control-plane or "
                           "node-role.kubernetes.io/master. Keeping off them (NotIn, DoesNotExist) is always "
                           "allowed.",
    )
    allowed_node_selector_keys: list[LabelKey] = Field(
        default_factory=list, max_length=256,
        description="Node label keys the pods may select nodes by: scheduling.nodeSelector, the network "
                    "profile's selector and the node affinity's terms (required and preferred).",
    )
    allowed_node_selector_values: dict[LabelKey, list[LabelValue]] = Field(
        default_factory=dict, max_length=256,
        description="For these node label keys, the values a node selector may ask for; a node affinity "
                    "term on such a key must use operator In with values among them.",
    )
    allowed_gpu_resources: list[Name] = Field(
        default_factory=list, max_length=64,
        description="Extended resource names resources.gpuResource may name when gpusPerNode > 0, e.g. "
                    "nvidia.com/gpu.",
    )
    max_efa_per_node: Limit = Field(
        None, ge=0, description="At most this many EFA devices per pod (resources.efa, else the network "
                                "profile's: eks-p4d 4, eks-p5 32); 0 allows none.",
    )
    allow_host_path: bool = Field(
        False, description="Allow hostPath volumes, as `--allow-host-path` does (either one is enough).",
    )
    allowed_host_paths: list[HostPath] = Field(
        default_factory=list, max_length=256,
        description="Node paths hostPath volumes must be under. Listing any allows hostPath volumes, "
                    "under these paths only.",
    )
    max_nodes: Limit = Field(DEFAULT_MAX_NODES, ge=1, description="At most this many nodes (pods) per training.")
    max_gpus_per_node: Limit = Field(None, ge=0, description="At most this many GPUs per pod.")
    max_gpus_per_training: Limit = Field(
        DEFAULT_MAX_GPUS_PER_TRAINING, ge=0,
        description="At most this many GPUs per training (nodes × gpusPerNode).",
    )
    max_cpu_per_pod: Optional[Quantity] = Field(
        None, description="At most this CPU request per pod (resources.cpu; the after-training evaluation's "
                          "afterTraining.cpu), e.g. 96 or 7500m.",
    )
    max_memory_per_pod: Optional[Quantity] = Field(
        None, description="At most this memory per pod (resources.memory, which must then be set; the "
                          "after-training evaluation's afterTraining.memory), e.g. 512Gi.",
    )
    max_shm_size: Optional[Quantity] = Field(None, description="At most this resources.shmSize (/dev/shm), e.g. 64Gi.")
    max_cpu_per_training: Optional[Quantity] = Field(
        None, description="At most this CPU request per training (nodes × resources.cpu).",
    )
    max_memory_per_training: Optional[Quantity] = Field(
        None, description="At most this memory per training (nodes × resources.memory, which must then be set).",
    )
    require_queue: bool = Field(
        False, description="Refuse a training without scheduling.queueName: every training waits for Kueue "
                           "to admit it.",
    )
    allowed_queues: list[Name] = Field(
        default_factory=list, max_length=256,
        description="Kueue LocalQueues scheduling.queueName may name.",
    )
    allow_root_group: bool = Field(
        True, description="Allow podSecurity.runAsGroup: 0 or fsGroup: 0 (root's group; files root's "
                          "group may write become writable).",
    )

    # Where these rules came from: "" cluster-wide, else the `namespaces` key that matched, and the
    # fields that entry set.
    _entry: str = PrivateAttr("")
    _overrides: frozenset[str] = PrivateAttr(frozenset())

    @property
    def allows_host_path(self) -> bool:
        return self.allow_host_path or bool(self.allowed_host_paths)

    @property
    def overrides(self) -> frozenset[str]:
        """The fields the matching `namespaces` entry set (none for the cluster-wide rules)."""
        return self._overrides

    @property
    def suffix(self) -> str:
        if not self._entry:
            return SUFFIX
        what = "namespaces" if any(c in self._entry for c in "*?[") else "namespace"
        return f"(operator policy for {what} {self._entry!r})"


# The values that limit nothing, for the fields whose defaults limit something.
UNLIMITED = {"max_nodes": None, "max_gpus_per_training": None, "allow_tolerate_all": True,
             "allow_control_plane": True}


class Policy(Rules):
    """The cluster-wide rules, and per-namespace ones (`namespaces`)."""

    namespaces: dict[NamespacePattern, Rules] = Field(
        default_factory=dict, max_length=1024,
        description="Rules for the trainings of some namespaces: a namespace name or glob (team-*) → any of "
                    "the fields above. The fields an entry sets replace the cluster-wide ones there (a list "
                    "replaces the list; null lifts a limit); the rest are the cluster-wide ones. A namespace "
                    "takes its exact name's entry, else the first glob that matches, in the file's order.",
    )

    def for_namespace(self, namespace: str) -> Rules:
        """The rules for a training in `namespace`: the cluster-wide ones, with its entry's fields over them."""
        key = namespace if namespace in self.namespaces else next(
            (k for k in self.namespaces if fnmatchcase(namespace, k)), None)
        values = {name: getattr(self, name) for name in Rules.model_fields}
        if key is None:
            return Rules.model_construct(**values)
        entry = self.namespaces[key]
        rules = Rules.model_construct(**{**values, **{name: getattr(entry, name) for name in entry.model_fields_set}})
        rules._entry, rules._overrides = key, frozenset(entry.model_fields_set)
        return rules

    def limits(self) -> list[str]:
        """The fields that limit something (for the startup log), `namespaces` last when it has entries."""
        unlimited = Rules().model_copy(update=UNLIMITED)
        return [field.alias or name for name, field in Rules.model_fields.items()
                if getattr(self, name) != getattr(unlimited, name)] + (["namespaces"] if self.namespaces else [])


def load_policy(path: str | Path) -> Policy:
    """The policy in a YAML file; PolicyError with one line saying what is wrong and where."""
    where = f"policy {path}"
    try:
        raw = strict_yaml.load(strict_yaml.read_text(path, what="the policy file"))
    except FileNotFoundError:
        raise PolicyError(f"{where}: no such file") from None
    except strict_yaml.YamlError as exc:
        raise PolicyError(f"{where}: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: expected a mapping of policy fields (allowedRegistries, maxNodes, …)")
    try:
        return Policy.model_validate(raw, by_alias=True, by_name=False)
    except ValidationError as exc:
        problems = "; ".join(f"{p}: {m}" for p, m in format_errors(exc))
        raise PolicyError(f"{where}: {problems}") from None


class PolicyViolation(ConfigError):
    """A spec that is valid but not allowed here; `errors` as ConfigError's, one per rule broken."""

    def __init__(self, errors: list[tuple[str, str]], source: str | None = None, policy: str | None = None,
                 default: bool = False):
        super().__init__(errors, source)
        where = f" in {source}" if source else ""
        by = (f" by policy {policy}" if policy else
              " by the operator's default policy (no --policy)" if default else " by the operator's policy")
        head = f"TranslationTraining{where} is not allowed{by}"
        if len(self.errors) == 1:
            text = f"{head}: {self.errors[0][0]}: {self.errors[0][1]}"
        else:
            text = "\n".join([f"{head} ({len(self.errors)} rules broken):",
                              *(f"  {p}: {m}" for p, m in self.errors)])
        self.args = (text,)


# ------------------------------------------------------------------------------ the rules

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

__all__ = ["Policy", "PolicyError", "PolicyViolation", "Rules", "load_policy", "normalized_image", "rules_for",
           "violations"]
