"""The cluster admin's policy: what a TranslationTraining may ask of this cluster.

spec.py says what a training can be anywhere; a policy says what it may be here. Without one,
creating a TranslationTraining is as strong as creating a pod in its namespace: any image, any
ServiceAccount, any PriorityClass, any toleration. A policy is a YAML mapping of the fields of
`Policy` (camelCase, unknown keys refused), read once at startup:

    rosetta operator --policy policy.yaml          # the Helm chart's `policy:` values, from a ConfigMap
    rosetta validate -f training.yaml --policy policy.yaml     # the same check, before `kubectl apply`

Every field left out sets no limit, so an empty file allows what no file allows. `violations`
returns every rule a spec breaks as (field path, message); the operator reports them like an
invalid spec (condition Valid=False, reason ForbiddenByPolicy) and creates nothing.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Annotated, Callable, Iterable, Optional

from pydantic import Field, StrictInt, StringConstraints, ValidationError

from rosetta_contract import strict_yaml
from rosetta_contract.documents import format_errors
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_contract.strict_model import ConfigError, Model

# Said after every violation, so a user can tell a policy refusal from a spec error.
SUFFIX = "(operator policy)"
# The ServiceAccount a pod runs as when the spec names none (Kubernetes' default).
DEFAULT_SERVICE_ACCOUNT = "default"

Name = Annotated[str, StringConstraints(min_length=1, max_length=317, pattern=r"^\S+$")]
HostPath = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^/")]
# Strict: `maxNodes: true` is a mistake, not 1.
Limit = Optional[StrictInt]


class PolicyError(ValueError):
    """A policy file that cannot be used; the message is one line that names the file."""


class Policy(Model):
    """What an admin allows. Lists: empty means any; numbers: unset means no limit."""

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
                    "empty key (operator Exists: every taint) is refused too.",
    )
    allow_tolerate_all: bool = Field(
        True, description="Allow a toleration with an empty key and operator Exists, which tolerates every "
                          "taint: control-plane, system and other teams' nodes included.",
    )
    allow_host_path: bool = Field(
        False, description="Allow hostPath volumes, as `--allow-host-path` does (either one is enough).",
    )
    allowed_host_paths: list[HostPath] = Field(
        default_factory=list, max_length=256,
        description="Node paths hostPath volumes must be under. Listing any allows hostPath volumes, "
                    "under these paths only.",
    )
    max_nodes: Limit = Field(None, ge=1, description="At most this many nodes (pods) per training.")
    max_gpus_per_node: Limit = Field(None, ge=0, description="At most this many GPUs per pod.")
    max_gpus_per_training: Limit = Field(
        None, ge=0, description="At most this many GPUs per training (nodes × gpusPerNode).",
    )
    allow_root_group: bool = Field(
        True, description="Allow podSecurity.runAsGroup: 0 or fsGroup: 0 (root's group; files root's "
                          "group may write become writable).",
    )

    @property
    def allows_host_path(self) -> bool:
        return self.allow_host_path or bool(self.allowed_host_paths)

    def limits(self) -> list[str]:
        """The fields that restrict something (for the startup log)."""
        default = Policy()
        return [field.alias or name for name, field in type(self).model_fields.items()
                if getattr(self, name) != getattr(default, name)]


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

    def __init__(self, errors: list[tuple[str, str]], source: str | None = None, policy: str | None = None):
        super().__init__(errors, source)
        where = f" in {source}" if source else ""
        by = f" by policy {policy}" if policy else " by the operator's policy"
        head = f"TranslationTraining{where} is not allowed{by}"
        if len(self.errors) == 1:
            text = f"{head}: {self.errors[0][0]}: {self.errors[0][1]}"
        else:
            text = "\n".join([f"{head} ({len(self.errors)} rules broken):",
                              *(f"  {p}: {m}" for p, m in self.errors)])
        self.args = (text,)


# ------------------------------------------------------------------------------ the rules


def violations(spec: TranslationTrainingSpec, policy: Policy) -> list[tuple[str, str]]:
    """Every rule of `policy` that `spec` breaks, as (field path, message saying what is allowed)."""
    return [problem for rule in RULES for problem in rule(spec, policy)]


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


def _image(spec: TranslationTrainingSpec, policy: Policy) -> list[tuple[str, str]]:
    if not policy.allowed_registries:
        return []
    image = normalized_image(spec.image)
    if any(_under(image, prefix, "/:@") for prefix in policy.allowed_registries):
        return []
    default = "" if "image" in spec.model_fields_set else " (the default image)"
    read = f" (read as {_shown(image)})" if image != spec.image else ""
    return [("spec.image", f"{_shown(spec.image)}{default}{read} is not from an allowed registry; allowed: "
                           f"{_allowed(policy.allowed_registries)} {SUFFIX}")]


def _service_account(spec: TranslationTrainingSpec, policy: Policy) -> list[tuple[str, str]]:
    out = []
    account = spec.service_account_name or DEFAULT_SERVICE_ACCOUNT
    if policy.allowed_service_accounts and account not in policy.allowed_service_accounts:
        what = (_shown(account) if spec.service_account_name else
                f"unset, so the pods would run as the namespace's {DEFAULT_SERVICE_ACCOUNT!r} ServiceAccount, which")
        out.append(("spec.serviceAccountName", f"{what} is not allowed here; allowed: "
                                               f"{_allowed(policy.allowed_service_accounts)} {SUFFIX}"))
    if spec.pod_security.automount_service_account_token and not policy.allow_service_account_token:
        out.append(("spec.podSecurity.automountServiceAccountToken",
                     f"the ServiceAccount's API token may not be mounted into training pods here; remove it or "
                     f"set it to false {SUFFIX}"))
    return out


def _priority_class(spec: TranslationTrainingSpec, policy: Policy) -> list[tuple[str, str]]:
    name = spec.scheduling.priority_class_name
    if not name or not policy.allowed_priority_classes or name in policy.allowed_priority_classes:
        return []
    return [("spec.scheduling.priorityClassName", f"{_shown(name)} is not allowed here; allowed: "
                                                  f"{_allowed(policy.allowed_priority_classes)} {SUFFIX}")]


def _tolerations(spec: TranslationTrainingSpec, policy: Policy) -> list[tuple[str, str]]:
    out = []
    keys = policy.allowed_toleration_keys
    for i, toleration in enumerate(spec.scheduling.tolerations):
        path = f"spec.scheduling.tolerations[{i}]"
        if not toleration.key and toleration.operator == "Exists":
            if keys or not policy.allow_tolerate_all:
                allowed = f"; allowed keys: {_allowed(keys)}" if keys else ""
                out.append((path, "an empty key with operator Exists tolerates every taint (control-plane and "
                                  f"system nodes included), which is not allowed here{allowed} {SUFFIX}"))
        elif keys and (toleration.key or "") not in keys:
            out.append((f"{path}.key", f"{_shown(toleration.key or '')} is not allowed here; allowed: "
                                       f"{_allowed(keys)} {SUFFIX}"))
    return out


def _host_paths(spec: TranslationTrainingSpec, policy: Policy) -> list[tuple[str, str]]:
    # Reached only when hostPath volumes are allowed at all (spec.py refuses them otherwise). The path
    # is compared as written, '..' resolved; symlinks on the node are the node's to keep in check.
    if not policy.allowed_host_paths:
        return []
    out = []
    for i, vol in enumerate(spec.volumes):
        if vol.host_path is None:
            continue
        path = posixpath.normpath(re.sub("/+", "/", vol.host_path.path))
        if not any(_under(path, posixpath.normpath(p), "/") for p in policy.allowed_host_paths):
            read = f" (read as {_shown(path)})" if path != vol.host_path.path else ""
            out.append((f"spec.volumes[{i}].hostPath.path",
                        f"{_shown(vol.host_path.path)}{read} is not under an allowed node path; allowed: "
                        f"{_allowed(policy.allowed_host_paths)} {SUFFIX}"))
    return out  # a subPath stays inside the volume: spec.py refuses '..' and absolute ones


def _size(spec: TranslationTrainingSpec, policy: Policy) -> list[tuple[str, str]]:
    out = []
    if policy.max_nodes is not None and spec.nodes > policy.max_nodes:
        out.append(("spec.nodes", f"{spec.nodes} nodes; at most {policy.max_nodes} per training here {SUFFIX}"))
    if policy.max_gpus_per_node is not None and spec.gpus_per_node > policy.max_gpus_per_node:
        out.append(("spec.gpusPerNode", f"{spec.gpus_per_node} GPUs per node; at most {policy.max_gpus_per_node} "
                                        f"here {SUFFIX}"))
    gpus = spec.nodes * spec.gpus_per_node
    if policy.max_gpus_per_training is not None and gpus > policy.max_gpus_per_training:
        out.append(("spec.gpusPerNode", f"{spec.nodes} nodes × {spec.gpus_per_node} GPUs = {gpus} GPUs; at most "
                                        f"{policy.max_gpus_per_training} per training here {SUFFIX}"))
    return out


def _root_group(spec: TranslationTrainingSpec, policy: Policy) -> list[tuple[str, str]]:
    if policy.allow_root_group:
        return []
    sec = spec.pod_security
    return [(f"spec.podSecurity.{field}", f"group 0 (root's group) is not allowed here {SUFFIX}")
            for field, value in (("runAsGroup", sec.run_as_group), ("fsGroup", sec.fs_group)) if value == 0]


RULES: tuple[Callable[[TranslationTrainingSpec, Policy], list[tuple[str, str]]], ...] = (
    _image, _service_account, _priority_class, _tolerations, _host_paths, _size, _root_group,
)

__all__ = ["Policy", "PolicyError", "PolicyViolation", "load_policy", "normalized_image", "violations"]
