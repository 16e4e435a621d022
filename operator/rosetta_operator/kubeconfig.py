"""Which cluster and namespace the `rosetta` verbs act on, found as kubectl finds them, and the API
client that talks to it.

`--kubeconfig`, else $KUBECONFIG (several files joined by `:`), else ~/.kube/config; `--context`,
else the file's current context; `-n`, else the context's namespace, else `default`. Without any
kubeconfig, inside a pod: the pod's ServiceAccount and namespace.

The kubeconfig is checked before the client library reads it: a malformed one, or a credential
plugin that is not installed, is one line naming the file and the context (exit 2 or 1), not a
traceback or a logged errno followed by a misleading connection error. One attempt per request,
with a bounded connect: an unreachable server fails in seconds, not after urllib3's retries and
warnings.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from rosetta_operator import kube
from rosetta_operator.cluster_errors import one_line
from rosetta_operator.kube import INVALID, Cluster, VerbError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# Where the credential plugins of managed clusters' kubeconfigs come from, for when one is missing.
EXEC_PLUGINS = {
    "aws": "the AWS CLI v2 (https://aws.amazon.com/cli/)",
    "aws-iam-authenticator": "aws-iam-authenticator (https://github.com/kubernetes-sigs/aws-iam-authenticator)",
    "gke-gcloud-auth-plugin": "it with `gcloud components install gke-gcloud-auth-plugin` (or the OS package "
                              "google-cloud-cli-gke-gcloud-auth-plugin)",
    "gcloud": "the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)",
    "kubelogin": "Azure's kubelogin, e.g. with `az aks install-cli` (https://azure.github.io/kubelogin/)",
    "az": "the Azure CLI (https://learn.microsoft.com/cli/azure/install-azure-cli)",
}


def connect(kubeconfig: Optional[str] = None, context: Optional[str] = None,
            namespace: Optional[str] = None) -> Cluster:
    import kubernetes
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig or os.environ.get("KUBECONFIG") or ""
    default = Path("~/.kube/config").expanduser()
    if not path and default.exists():
        path = str(default)
    if path:
        chosen = _choose_context(path, context, "--kubeconfig" if kubeconfig else "KUBECONFIG")
        _check_exec_plugin(chosen)
        configuration = kubernetes.client.Configuration()
        try:
            with _plugin_failures() as failures:
                kubernetes.config.load_kube_config(config_file=path, context=chosen.name,
                                                   client_configuration=configuration)
        except ConfigException as exc:  # what the file points at: a certificate file that is not there
            raise VerbError(f"{chosen}: {one_line(exc)}", INVALID) from None
        if failures:
            raise _plugin_failed(chosen, failures[0])
        return Cluster(_client(configuration), namespace or chosen.namespace or "default", chosen.name, path)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        if context:
            raise VerbError("--context needs a kubeconfig; none was found", INVALID)
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise VerbError(f"this pod's ServiceAccount: {one_line(exc)}") from None
        ns_file = SERVICE_ACCOUNT_DIR / "namespace"
        ns = namespace or (ns_file.read_text().strip() if ns_file.exists() else "default")
        return Cluster(_client(configuration), ns)
    raise VerbError("no cluster: pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config "
                    "(kubectl's own configuration)")


@dataclass(frozen=True)
class _Context:
    """The context a kubeconfig resolves to: what error messages name, and its user's settings."""

    path: str
    name: str
    namespace: Optional[str]
    user: dict[str, Any]

    def __str__(self) -> str:
        return f'context "{self.name}" of kubeconfig {self.path}'


def _choose_context(path: str, context: Optional[str], source: str) -> _Context:
    """The context as kubectl resolves it, checked before the client library reads the files: the
    library stops a malformed one with a traceback or with a message about its own internals."""
    entries, current = _read_kubeconfig(path, source)
    contexts, clusters, users = entries["contexts"], entries["clusters"], entries["users"]
    if not contexts:
        raise VerbError(f"kubeconfig {path} has no contexts: `aws eks update-kubeconfig --name CLUSTER` or "
                        "`gcloud container clusters get-credentials CLUSTER` writes one for a cloud cluster, "
                        "`kubectl config set-context` any other", INVALID)
    name = context or current
    if not name:
        raise VerbError(f"kubeconfig {path} has no current context: pass --context (one of {_names(contexts)}) "
                        "or choose one with `kubectl config use-context NAME`", INVALID)
    if name not in contexts:
        said = "--context" if context else "its current-context"
        raise VerbError(f'kubeconfig {path} has no context "{name}" ({said}); its contexts: {_names(contexts)}',
                        INVALID)
    where = f'context "{name}" of kubeconfig {path}'
    ctx = contexts[name].get("context")
    if not isinstance(ctx, dict) or not ctx.get("cluster"):
        raise VerbError(f"{where} names no cluster", INVALID)
    cluster = clusters.get(str(ctx["cluster"]))
    if cluster is None:
        raise VerbError(f'{where} names cluster "{ctx["cluster"]}", which the kubeconfig does not define; '
                        f"its clusters: {_names(clusters)}", INVALID)
    if not isinstance(cluster.get("cluster"), dict) or not cluster["cluster"].get("server"):
        raise VerbError(f'cluster "{ctx["cluster"]}" of kubeconfig {path} has no server address', INVALID)
    user: dict[str, Any] = {}
    if ctx.get("user"):
        entry = users.get(str(ctx["user"]))
        if entry is None:
            raise VerbError(f'{where} names user "{ctx["user"]}", which the kubeconfig does not define; '
                            f"its users: {_names(users)}", INVALID)
        user = entry["user"] if isinstance(entry.get("user"), dict) else {}
    return _Context(path, name, ctx.get("namespace"), user)


def _read_kubeconfig(path: str, source: str) -> tuple[dict[str, dict[str, dict[str, Any]]], Optional[str]]:
    """The clusters, contexts and users of every file of `path` by name, and the current context, merged
    as kubectl merges $KUBECONFIG: the first file to name an entry, or to set current-context, wins."""
    import yaml

    files = [os.path.expanduser(p) for p in path.split(os.pathsep) if p]
    present = [f for f in files if os.path.exists(f)]
    if not present:
        raise VerbError(f"{source} {path}: no such file", INVALID)
    entries: dict[str, dict[str, dict[str, Any]]] = {"clusters": {}, "contexts": {}, "users": {}}
    current = None
    for file in present:
        try:
            doc = yaml.safe_load(Path(file).read_text())
        except OSError as exc:
            raise VerbError(f"kubeconfig {file} cannot be read: {exc.strerror}", INVALID) from None
        except UnicodeDecodeError:
            raise VerbError(f"kubeconfig {file} is not a text file", INVALID) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise VerbError(f"kubeconfig {file} is not valid YAML ({getattr(exc, 'problem', None) or exc}{at}): "
                            "fix it, or point --kubeconfig or KUBECONFIG at another file", INVALID) from None
        if not isinstance(doc, dict):
            what = "empty" if doc is None else f"a YAML {type(doc).__name__}"
            raise VerbError(f"kubeconfig {file} is {what}, not a kubeconfig (a mapping with clusters, contexts "
                            "and users)", INVALID)
        for kind, known in entries.items():
            items = doc.get(kind) or []
            if not isinstance(items, list) or not all(isinstance(i, dict) and i.get("name") for i in items):
                raise VerbError(f"kubeconfig {file}: {kind} must be a list of entries, each with a name", INVALID)
            for item in items:
                known.setdefault(str(item["name"]), item)
        if current is None and doc.get("current-context"):
            current = str(doc["current-context"])
    return entries, current


def _names(entries: dict[str, Any]) -> str:
    names = list(entries)
    return ", ".join(names[:10]) + (", …" if len(names) > 10 else "") if names else "none"


def _check_exec_plugin(chosen: _Context) -> None:
    """Refuse a credential plugin that is not installed before the client library runs it: the
    library only logs the errno and goes on without credentials, so the first request then fails as
    something else (Unauthorized, or seemingly an unreachable server)."""
    plugin = chosen.user.get("exec")
    if not isinstance(plugin, dict) or not plugin.get("command"):
        return
    command = str(plugin["command"])
    env = {str(e.get("name")): str(e.get("value")) for e in plugin.get("env") or [] if isinstance(e, dict)}
    if os.sep in command:
        # A relative path starts from the kubeconfig's folder; its run reports it (_plugin_failures).
        installed = not os.path.isabs(command) or os.access(command, os.X_OK)
    else:
        installed = shutil.which(command, path=env.get("PATH") or os.environ.get("PATH")) is not None
    if installed:
        return
    known = EXEC_PLUGINS.get(os.path.basename(command))
    install = " ".join(str(plugin.get("installHint") or "").split()).rstrip(".") or \
        f"install {known or f'`{command}`'}"
    raise VerbError(f"{chosen} gets its credentials from `{command}`, which is not installed (not on PATH): "
                    f"{install}; or choose another context with --context")


@contextlib.contextmanager
def _plugin_failures() -> Iterator[list[str]]:
    """What the client library says of a credential plugin that failed while it loads the kubeconfig.
    It says so only with logging.error() on the root logger, then goes on without credentials. The
    handler keeps logging.error() from setting up logging to stderr (basicConfig) for the rest of
    the command; the filter keeps the records for one `error:` line of our own."""
    failures: list[str] = []

    def keep(record: logging.LogRecord) -> bool:
        if record.module in ("kube_config", "exec_provider"):
            failures.append(record.getMessage())
            return False
        return True

    root, quiet = logging.getLogger(), logging.NullHandler()
    root.addFilter(keep)
    root.addHandler(quiet)
    try:
        yield failures
    finally:
        root.removeHandler(quiet)
        root.removeFilter(keep)


def _plugin_failed(chosen: _Context, message: str) -> VerbError:
    plugin = chosen.user.get("exec") or {}
    run = " ".join(str(a) for a in [plugin.get("command", ""), *(plugin.get("args") or [])])
    return VerbError(f"{chosen}: its credential plugin failed ({one_line(message)}); run `{run}` to see why "
                     "(usually a login that expired: log in again)")


def _client(configuration: Any) -> Any:
    """An ApiClient that makes one attempt per request and gives up connecting after kube.CONNECT_TIMEOUT."""
    import kubernetes
    from urllib3.exceptions import InsecureRequestWarning

    configuration.retries = False
    if not configuration.verify_ssl:
        # The kubeconfig's own choice (insecure-skip-tls-verify), which kubectl honours without a word.
        warnings.filterwarnings("ignore", category=InsecureRequestWarning)
    api: Any = kubernetes.client.ApiClient(configuration)
    request = api.rest_client.request

    def bounded(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        return request(*args, _request_timeout=_request_timeout or (kube.CONNECT_TIMEOUT, None), **kwargs)

    api.rest_client.request = bounded
    return api
