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

from pathlib import Path

from pydantic import ValidationError

from rosetta_contract import strict_yaml
from rosetta_contract.document_io import format_errors
from rosetta_contract.strict_model import ConfigError
from rosetta_operator.policy_checks import normalized_image, rules_for, violations
from rosetta_operator.policy_fields import Policy, Rules


class PolicyError(ValueError):
    """A policy file that cannot be used; the message is one line that names the file."""


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


__all__ = ["Policy", "PolicyError", "PolicyViolation", "Rules", "load_policy", "normalized_image", "rules_for",
           "violations"]
