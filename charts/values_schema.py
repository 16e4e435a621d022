"""charts/rosetta/values.schema.json, generated from values.yaml: the type of each default, plus the
few facts a default cannot say (below). Helm checks the values of `install`, `upgrade`, `template`
and `lint` against the schema, so a wrong type fails with the value's path before anything renders.

    .venv/bin/python charts/values_schema.py > charts/rosetta/values.schema.json

A key the chart does not know is refused in the chart's own objects (a typo such as `watchNamespace`
would otherwise be ignored in silence); the free-form Kubernetes objects (`resources`, `affinity`,
`podSecurityContext`, labels and annotations, ...) take anything. tests/unit/project/test_values_schema.py
fails when the committed file differs from this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent / "rosetta"

PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
COUNT_OR_NULL = {"type": ["integer", "null"], "minimum": 0}
DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h|d|w|y))+$"}  # a Prometheus duration
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
FREE_OBJECT = {"type": "object"}
OBJECT_LIST = {"type": "array", "items": {"type": "object"}}
STRING_LIST = {"type": "array", "items": {"type": "string"}}
QUANTITY_OR_NULL = {"type": ["string", "integer", "null"]}  # a Kubernetes quantity: 96, "7500m", "512Gi"

# What the defaults cannot say: free-form Kubernetes fields, nullable limits, enums, ranges. A path
# is dot-separated keys of values.yaml.
OVERRIDES: dict[str, dict] = {
    "imagePullSecrets": STRING_LIST,
    "image.pullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]},
    "watchNamespaces": {"type": "array", "items": {"type": "string", "minLength": 1}},
    "operator.livenessPort": PORT,
    "operator.metricsPort": PORT,
    "operator.extraArgs": STRING_LIST,
    "operator.extraEnv": OBJECT_LIST,
    # The choices of `rosetta operator --log-level` and `--log-format`.
    "logging.level": {"type": "string", "enum": ["debug", "info", "warning", "error"]},
    "logging.format": {"type": "string", "enum": ["text", "json"]},
    "policy.allowedRegistries": STRING_LIST,
    "policy.allowedServiceAccounts": STRING_LIST,
    "policy.allowedPriorityClasses": STRING_LIST,
    "policy.allowedQueues": STRING_LIST,
    "policy.allowedTolerationKeys": STRING_LIST,
    "policy.allowedNodeSelectorKeys": STRING_LIST,
    "policy.allowedNodeSelectorValues": {"type": "object", "additionalProperties": STRING_LIST},
    "policy.allowedGpuResources": STRING_LIST,
    "policy.maxEfaPerNode": COUNT_OR_NULL,
    "policy.allowedHostPaths": STRING_LIST,
    "policy.maxNodes": COUNT_OR_NULL,
    "policy.maxGpusPerNode": COUNT_OR_NULL,
    "policy.maxGpusPerTraining": COUNT_OR_NULL,
    **{f"policy.{name}": QUANTITY_OR_NULL for name in ("maxCpuPerPod", "maxMemoryPerPod", "maxShmSize",
                                                        "maxCpuPerTraining", "maxMemoryPerTraining")},
    # The operator checks each entry's fields when it loads the policy (rosetta_operator/policy.py).
    "policy.namespaces": {"type": "object", "additionalProperties": {"type": "object"}},
    "networkPolicy.metricsFrom": OBJECT_LIST,
    "networkPolicy.apiServerPorts": {"type": "array", "items": PORT},
    "networkPolicy.apiServerCIDRs": STRING_LIST,
    "networkPolicy.extraEgress": OBJECT_LIST,
    "replicaCount": {"type": "integer", "minimum": 1},
    "serviceAccount.annotations": STRING_MAP,
    "podAnnotations": STRING_MAP,
    "podLabels": STRING_MAP,
    "podSecurityContext": FREE_OBJECT,
    "securityContext": FREE_OBJECT,
    "resources": FREE_OBJECT,
    "nodeSelector": STRING_MAP,
    "tolerations": OBJECT_LIST,
    "affinity": FREE_OBJECT,
    "service.type": {"type": "string", "enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
    "service.port": PORT,
    "monitoring.podMonitor.labels": STRING_MAP,
    "monitoring.podMonitor.interval": DURATION,
    "monitoring.serviceMonitor.labels": STRING_MAP,
    "monitoring.serviceMonitor.interval": DURATION,
    "monitoring.prometheusRule.labels": STRING_MAP,
    "monitoring.prometheusRule.runbookBaseUrl": {"type": "string", "pattern": "^https?://"},
    "monitoring.prometheusRule.noProgressMinutes": {"type": "integer", "minimum": 1},
    "monitoring.prometheusRule.pauseMinutes": {"type": "integer", "minimum": 1},
    "monitoring.prometheusRule.restartsThreshold": {"type": "integer", "minimum": 1},
    "monitoring.prometheusRule.restartsWindow": DURATION,
    "monitoring.prometheusRule.operatorDownFor": DURATION,
    "monitoring.prometheusRule.severity": {"type": "string", "enum": ["info", "warning", "critical"]},
    "monitoring.dashboards.annotations": STRING_MAP,
    "monitoring.dashboards.labelValue": {"type": "string"},
    "jobset.version": {"type": "string", "pattern": "^v[0-9]+\\.[0-9]+\\.[0-9]+"},
}

# Probes: kubelet timings, all positive integers.
for _probe in ("livenessProbe", "readinessProbe"):
    for _field in ("initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold"):
        OVERRIDES[f"{_probe}.{_field}"] = {"type": "integer", "minimum": 0 if _field == "initialDelaySeconds" else 1}


def _type_of(value: Any, path: str) -> dict:
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        raise SystemExit(f"values_schema.py: {path} is a list; say its items in OVERRIDES")
    if value is None:
        raise SystemExit(f"values_schema.py: {path} defaults to null; say its type in OVERRIDES")
    raise SystemExit(f"values_schema.py: {path}: no JSON type for {type(value).__name__}")


def schema_of(value: Any, path: str = "") -> dict:
    if path in OVERRIDES:
        return dict(OVERRIDES[path])
    if isinstance(value, dict):
        return {"type": "object", "additionalProperties": False,
                "properties": {key: schema_of(child, f"{path}.{key}" if path else key)
                               for key, child in value.items()}}
    return _type_of(value, path)


def build(values_path: Path = CHART / "values.yaml") -> dict:
    values = yaml.safe_load(values_path.read_text())
    unused = [p for p in OVERRIDES if not _has(values, p)]
    if unused:
        raise SystemExit(f"values_schema.py: OVERRIDES names paths values.yaml lacks: {unused}")
    schema = schema_of(values)
    return {"$schema": "http://json-schema.org/draft-07/schema#",
            "title": "Values of the rosetta chart (generated by charts/values_schema.py from values.yaml)",
            **schema}


def _has(values: dict, path: str) -> bool:
    node: Any = values
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def text() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(text())
