"""Render charts/rosetta with Helm's own template engine (the helm-python-sdk wheel bundles Helm's Go
SDK as a shared library: no helm binary, no network), for the chart tests and manifests/operator.yaml.

    .venv/bin/python tests/support/chart.py > manifests/operator.yaml     # regenerate the raw manifests
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

import yaml

from rosetta_contract.documents import deep_merge

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rosetta"
OPERATOR_MANIFEST = REPO / "manifests" / "operator.yaml"
RAW_NAMESPACE = "rosetta-system"
# What manifests/operator.yaml is rendered with: the defaults (monitors off), minus the CRD, which
# kubectl users apply from manifests/crd.yaml.
RAW_VALUES: dict = {"crd": {"install": False}}
REGENERATE = "python tests/support/chart.py > manifests/operator.yaml"

MONITORING_APIS = tuple(f"monitoring.coreos.com/v1/{kind}" for kind in ("PodMonitor", "ServiceMonitor", "PrometheusRule"))

# Helm's install order (pkg/release/util/kind_sorter.go), enough of it for this chart.
_ORDER = ["Namespace", "ServiceAccount", "Secret", "ConfigMap", "CustomResourceDefinition", "ClusterRole",
          "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment"]


class RenderError(Exception):
    """A template failed (e.g. `fail` with a message); str() is Helm's message."""


def load_values(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def render_files(values: Optional[dict] = None, *, namespace: str = RAW_NAMESPACE, release: str = "rosetta",
                 api_versions: Iterable[str] = (), kube_version: Optional[str] = None) -> dict[str, str]:
    """Template path → rendered text, as `helm template RELEASE charts/rosetta -n NAMESPACE
    --api-versions ... --kube-version ...` renders it (an install: .Release.IsInstall)."""
    import helm_python
    from helm_python import _native

    chart = helm_python.Chart.load(str(CHART))
    # Chart.render() has no api_versions argument; the library's render options do.
    opts: dict[str, Any] = {"name": release, "namespace": namespace, "is_install": True,
                            "api_versions": list(api_versions)}
    if kube_version:
        opts["kube_version"] = kube_version
    try:
        return json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values or {}),
                                              json.dumps(opts)))
    except helm_python.HelmError as exc:
        raise RenderError(str(exc)) from exc
    finally:
        chart.close()


def render(values: Optional[dict] = None, *, values_files: Iterable[Path] = (), tests: bool = False,
           **kwargs: Any) -> list[dict]:
    """The chart's objects (NOTES.txt left out; `helm test`'s pods only with tests=True, as
    `helm install` keeps them for `helm test`), in Helm's install order."""
    merged: dict = {}
    for path in values_files:
        merged = deep_merge(merged, load_values(path))  # Helm -f semantics
    merged = deep_merge(merged, values or {})
    objects = []
    for path, text in sorted(render_files(merged, **kwargs).items()):
        if path.endswith("NOTES.txt") or ("/templates/tests/" in path and not tests):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return sort_objects(objects)


def sort_objects(objects: list[dict]) -> list[dict]:
    def key(obj: dict) -> tuple:
        kind = obj["kind"]
        return (_ORDER.index(kind) if kind in _ORDER else len(_ORDER), kind,
                obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
    return sorted(objects, key=key)


def raw_manifests() -> list[dict]:
    """manifests/operator.yaml: the namespace, then the chart's objects."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RAW_NAMESPACE}}
    return [namespace] + render(RAW_VALUES, namespace=RAW_NAMESPACE)


def raw_manifest_text() -> str:
    header = ("# The Rosetta operator for kubectl users: the Helm chart charts/rosetta rendered with its\n"
              f"# default values in namespace {RAW_NAMESPACE} (no CRD: apply manifests/crd.yaml first; no\n"
              "# monitors or dashboards: see docs/helm.md). Generated; do not edit. Regenerate with\n"
              f"#   {REGENERATE}\n"
              "#\n"
              "#   kubectl apply -f manifests/crd.yaml\n"
              "#   kubectl apply -f manifests/operator.yaml\n")
    return header + yaml.safe_dump_all(raw_manifests(), sort_keys=False, width=120, explicit_start=True)


if __name__ == "__main__":
    sys.stdout.write(raw_manifest_text())
