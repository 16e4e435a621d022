"""Render charts/rosetta with Helm's own template engine (the helm-python-sdk wheel bundles Helm's Go
SDK as a shared library: no helm binary, no network), for the chart tests and manifests/operator.yaml;
and the `helm install` commands of the docs, read out of their code blocks, for the tests that render
exactly what a reader following a guide would install.

    .venv/bin/python tests/support/chart.py > manifests/operator.yaml     # regenerate the raw manifests
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
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
_ORDER = ["Namespace", "PodDisruptionBudget", "ServiceAccount", "Secret", "ConfigMap", "CustomResourceDefinition", "ClusterRole",
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


# ------------------------------------------------------------- the guides' helm install commands

GUIDES = {"eks": REPO / "docs" / "eks.md", "gke": REPO / "docs" / "gke.md"}
_FENCE = re.compile(r"^```(?:sh|bash)\n(.*?)^```", re.S | re.M)
_ASSIGNMENT = r"[A-Z_][A-Z0-9_]*=[^\s#]+"
_VARIABLES_LINE = re.compile(rf"^\s*{_ASSIGNMENT}(?:\s+{_ASSIGNMENT})*\s*(?:#.*)?$")


@dataclass
class HelmInstall:
    """A `helm install RELEASE charts/rosetta ...` of a page, with the page's shell variables expanded."""
    page: Path
    command: str
    namespace: str = "default"
    values_files: list[Path] = field(default_factory=list)
    values: dict = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)   # -f and --set, as `helm lint` or `helm template` take them


def shell_blocks(page: Path) -> list[str]:
    """The commands of a page's sh/bash code blocks, continuation lines joined."""
    return [block.replace("\\\n", " ") for block in _FENCE.findall(page.read_text())]


def page_variables(page: Path) -> dict[str, str]:
    """The variables a page sets on lines of nothing but assignments (`ACCOUNT=123 REGION=us-east-1`)."""
    found: dict[str, str] = {}
    for block in shell_blocks(page):
        for line in block.splitlines():
            if _VARIABLES_LINE.match(line):
                for word in shlex.split(line, comments=True):
                    name, _, value = word.partition("=")
                    found[name] = value
    return found


def expand(text: str, variables: dict[str, str], page: Path) -> str:
    def one(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise ValueError(f"{page.name}: ${name} is used but never set on a line of its own")
        return variables[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, text)


def helm_installs(page: Path) -> list[HelmInstall]:
    """Every `helm install ... charts/rosetta` of a page, parsed as Helm parses its flags."""
    variables = page_variables(page)
    installs = []
    for block in shell_blocks(page):
        for line in block.splitlines():
            if line.split()[:2] != ["helm", "install"]:
                continue
            words = shlex.split(expand(line, variables, page), comments=True)
            if "charts/rosetta" not in words:
                continue
            install = HelmInstall(page, " ".join(words))
            rest = [w for w in words[2:] if w != "charts/rosetta"][1:]  # the release name first
            while rest:
                flag = rest.pop(0)
                if flag in ("-n", "--namespace"):
                    install.namespace = rest.pop(0)
                elif flag in ("--create-namespace", "--wait"):
                    pass
                elif flag in ("-f", "--values"):
                    path = REPO / rest.pop(0)
                    install.values_files.append(path)
                    install.flags += ["-f", str(path)]
                elif flag in ("--set", "--set-string"):
                    assignment = rest.pop(0)
                    install.values = deep_merge(install.values, parse_set(assignment, strings=flag == "--set-string"))
                    install.flags += [flag, assignment]
                else:
                    raise ValueError(f"{page.name}: `{install.command}`: {flag} is a flag tests/support/chart.py "
                                     "does not read; teach helm_installs() what Helm does with it")
            installs.append(install)
    return installs


def parse_set(text: str, strings: bool = False) -> dict:
    """`--set a.b=v,c={x,y}` as Helm reads it (pkg/strvals, the parts the docs use): `\\.` is a dot
    inside a key; true, false, null and integers are typed unless --set-string; {x,y} is a list."""
    values: dict = {}
    for assignment in re.split(r"(?<!\\),(?![^{]*})", text):
        key, sep, value = assignment.partition("=")
        if not sep:
            raise ValueError(f"--set {text}: {assignment!r} has no `=`")
        if "[" in key:
            raise ValueError(f"--set {text}: list indexes are not read here")
        keys = [k.replace("\\.", ".") for k in re.split(r"(?<!\\)\.", key)]
        node = values
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = _typed(value.replace("\\,", ","), strings)
    return values


def _typed(value: str, strings: bool) -> Any:
    if value.startswith("{") and value.endswith("}"):
        return [_typed(v, strings) for v in value[1:-1].split(",")] if value != "{}" else []
    if strings:
        return value
    if value in ("true", "false"):
        return value == "true"
    if value == "null":
        return None
    if re.fullmatch(r"-?(0|[1-9][0-9]*)", value):
        return int(value)
    return value


def render_install(install: HelmInstall, **kwargs: Any) -> list[dict]:
    """What the command would install (the monitors' CRDs served, as the guides require)."""
    return render(install.values, values_files=install.values_files, namespace=install.namespace,
                  api_versions=kwargs.pop("api_versions", MONITORING_APIS), **kwargs)


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
