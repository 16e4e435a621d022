"""The cluster as the `rosetta` verbs see it: kubectl's way of finding it, and the few calls they make.

Which cluster and namespace, as kubectl decides: `--kubeconfig`, else $KUBECONFIG (several files
joined by `:`), else ~/.kube/config; `--context`, else the file's current context; `-n`, else the
context's namespace, else `default`. Without any kubeconfig, inside a pod: the pod's ServiceAccount
and namespace.

Every failure is a `VerbError` carrying its exit status: 1 for what the cluster said or did not
say (not found, forbidden, unreachable, timed out, no TranslationTraining CRD, the training failed)
and for credentials that could not be had (the kubeconfig's exec plugin is not installed, or
fails); 2 for what the user typed or configured: a bad argument, or a kubeconfig that cannot be
used as written (not YAML, no such file or context, a context naming a cluster or user the file
lacks). A broken kubeconfig is input: no retry fixes it, and no request has been made.

One attempt per request, with a bounded connect: an unreachable server fails in seconds, with one
line naming the server, the context and the kubeconfig, not after urllib3's retries and warnings.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, cast

from rosetta_contract.resource import GROUP, KIND, PLURAL, VERSION

RESOURCE = f"{KIND.lower()}.{GROUP}"  # what kubectl prints: translationtraining.rosetta.dev/NAME
FIELD_MANAGER = "rosetta"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

FAILED, INVALID = 1, 2

# Seconds to open the TCP connection and finish the TLS handshake. Reads stay unbounded: watches
# and `logs -f` stream for as long as the training runs.
CONNECT_TIMEOUT = 10.0

INSTALL_CRD = "install the CRD (how: `kubectl apply -f manifests/crd.yaml` or the Helm chart)"

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


class VerbError(Exception):
    def __init__(self, message: str, exit_code: int = FAILED):
        super().__init__(message)
        self.exit_code = exit_code


def not_found(name: str, namespace: str) -> VerbError:
    return VerbError(f'{PLURAL}.{GROUP} "{name}" not found in namespace "{namespace}"')


@dataclass
class Cluster:
    """An API client and the namespace commands act in."""

    api: Any  # kubernetes.client.ApiClient
    namespace: str
    context: Optional[str] = None
    kubeconfig: Optional[str] = None  # the path it came from, for error messages

    @property
    def core(self) -> Any:  # kubernetes.client.CoreV1Api
        import kubernetes

        return kubernetes.client.CoreV1Api(self.api)

    @property
    def custom(self) -> Any:  # kubernetes.client.CustomObjectsApi
        import kubernetes

        return kubernetes.client.CustomObjectsApi(self.api)

    @property
    def server(self) -> str:
        return str(self.api.configuration.host)

    # ------------------------------------------------------------------ trainings

    def training(self, name: str) -> Optional[dict[str, Any]]:
        """The TranslationTraining, or None when there is none of that name."""
        from kubernetes.client.exceptions import ApiException

        try:
            return cast(dict[str, Any], self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name))
        except ApiException as exc:
            if exc.status == 404 and not resource_missing(exc):
                return None
            raise

    def existing_training(self, name: str) -> dict[str, Any]:
        obj = self.training(name)
        if obj is None:
            raise not_found(name, self.namespace)
        return obj

    def trainings(self, all_namespaces: bool = False) -> list[dict[str, Any]]:
        if all_namespaces:
            items = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
        else:
            items = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]
        return sorted(items, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))

    def delete_training(self, name: str) -> bool:
        """False when there was none."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404 and not resource_missing(exc):
                return False
            raise
        return True

    def watch_training(self, name: str, deadline: Optional[float]) -> Iterator[Optional[dict[str, Any]]]:
        """The training now, then again each time it changes (None once it is gone), until the
        `deadline` (time.monotonic()) passes; None as the deadline: for ever.

        A watch that ends (the server's timeout, a dropped connection, a resourceVersion too old)
        is followed by a fresh read, so no change is missed for long."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        while True:
            obj = self.training(name)
            yield obj
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            if obj is None:  # nothing to watch: a training of that name may yet be created
                time.sleep(min(1.0, left if left is not None else 1.0))
                continue
            w = watch.Watch()
            seconds = int(max(1, min(left if left is not None else 30, 30)))
            try:
                for event in w.stream(self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
                                      PLURAL, field_selector=f"metadata.name={name}",
                                      resource_version=obj["metadata"].get("resourceVersion"),
                                      timeout_seconds=seconds, _request_timeout=seconds + 10):
                    if event["type"] == "ERROR":
                        break
                    yield None if event["type"] == "DELETED" else event["object"]
                    if deadline is not None and time.monotonic() >= deadline:
                        return
            except (ApiException, HTTPError):
                time.sleep(0.5)  # then read it again
            finally:
                w.stop()

    def training_list(self, *, label_selector: Optional[str] = None, field_selector: Optional[str] = None,
                      all_namespaces: bool = False) -> tuple[list[dict[str, Any]], str]:
        """The trainings (sorted as `trainings`) and the list's resourceVersion, where a watch of
        what changes next starts."""
        selectors = {k: v for k, v in (("label_selector", label_selector), ("field_selector", field_selector)) if v}
        if all_namespaces:
            listed = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **selectors)
        else:
            listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, **selectors)
        items = sorted(listed["items"], key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items, str((listed.get("metadata") or {}).get("resourceVersion") or "")

    def watch_trainings(self, resource_version: str, *, label_selector: Optional[str] = None,
                        field_selector: Optional[str] = None, all_namespaces: bool = False,
                        deadline: Optional[float] = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """(ADDED|MODIFIED|DELETED, training) for every change after `resource_version`, until the
        `deadline` (time.monotonic(); None: for ever).

        A watch that ends is resumed from the last version seen; one the server no longer has
        (410 Gone) or a broken connection is followed by a fresh list, whose trainings come as
        MODIFIED: a change in between is shown late, not lost."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        selectors = {k: v for k, v in (("label_selector", label_selector), ("field_selector", field_selector)) if v}
        args: tuple[str, ...]
        if all_namespaces:
            call, args = self.custom.list_cluster_custom_object, (GROUP, VERSION, PLURAL)
        else:
            call, args = self.custom.list_namespaced_custom_object, (GROUP, VERSION, self.namespace, PLURAL)
        version: Optional[str] = resource_version
        while deadline is None or time.monotonic() < deadline:
            if version is None:
                items, version = self.training_list(all_namespaces=all_namespaces, **selectors)
                for obj in items:
                    yield "MODIFIED", obj
            left = None if deadline is None else deadline - time.monotonic()
            seconds = int(max(1, min(left if left is not None else 300, 300)))
            w = watch.Watch()
            try:
                for event in w.stream(call, *args, resource_version=version, timeout_seconds=seconds,
                                      _request_timeout=(CONNECT_TIMEOUT, seconds + 10), **selectors):
                    if event["type"] == "ERROR":  # 410 Gone: the version is too old to resume from
                        version = None
                        break
                    obj = event["object"]
                    version = obj["metadata"].get("resourceVersion") or version
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        yield event["type"], obj
                    if deadline is not None and time.monotonic() >= deadline:
                        return
            except (ApiException, HTTPError):
                version = None
                time.sleep(0.5)
            finally:
                w.stop()

    def patch_training(self, name: str, patch: dict[str, Any]) -> Optional[dict[str, Any]]:
        """A JSON merge patch of the training (None: there is none of that name)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return cast(dict[str, Any], self.custom.patch_namespaced_custom_object(  # a merge patch
                GROUP, VERSION, self.namespace, PLURAL, name, patch, field_manager=FIELD_MANAGER))
        except ApiException as exc:
            if exc.status == 404 and not resource_missing(exc):
                return None
            raise

    def events(self, involved: dict[str, set[str]]) -> list[dict[str, Any]]:
        """The namespace's events about these objects (kind → names), as plain dicts: one list per
        kind, filtered by name here (a field selector matches one name, not a set of them)."""
        out = []
        for kind, names in involved.items():
            listed = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.kind={kind}")
            out += [self.api.sanitize_for_serialization(e) for e in listed.items if e.involved_object.name in names]
        return out

    # ----------------------------------------------------------------------- pods

    def pods(self, jobset: str) -> list[dict[str, Any]]:
        """The JobSet's pods, as plain dicts (what the pure helpers read)."""
        items = self.core.list_namespaced_pod(self.namespace,
                                              label_selector=f"jobset.sigs.k8s.io/jobset-name={jobset}").items
        return [self.api.sanitize_for_serialization(p) for p in items]


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
            raise VerbError(f"{chosen}: {_one_line(exc)}", INVALID) from None
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
            raise VerbError(f"this pod's ServiceAccount: {_one_line(exc)}") from None
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
    return VerbError(f"{chosen}: its credential plugin failed ({_one_line(message)}); run `{run}` to see why "
                     "(usually a login that expired: log in again)")


def _client(configuration: Any) -> Any:
    """An ApiClient that makes one attempt per request and gives up connecting after CONNECT_TIMEOUT."""
    import kubernetes
    from urllib3.exceptions import InsecureRequestWarning

    configuration.retries = False
    if not configuration.verify_ssl:
        # The kubeconfig's own choice (insecure-skip-tls-verify), which kubectl honours without a word.
        warnings.filterwarnings("ignore", category=InsecureRequestWarning)
    api: Any = kubernetes.client.ApiClient(configuration)
    request = api.rest_client.request

    def bounded(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        return request(*args, _request_timeout=_request_timeout or (CONNECT_TIMEOUT, None), **kwargs)

    api.rest_client.request = bounded
    return api


def resource_missing(exc: Exception) -> bool:
    """A 404 for the resource rather than for one object: an apiserver answers a group, version or
    resource it does not serve with `404 page not found` (or a Status without details), and a missing
    object with a Status that names it."""
    import json

    if getattr(exc, "status", None) != 404:
        return False
    try:
        body = json.loads(getattr(exc, "body", None) or "")
    except (TypeError, ValueError):
        return True
    details = body.get("details") if isinstance(body, dict) else None
    return not (isinstance(details, dict) and details.get("name"))


def no_crd(cluster: Optional[Cluster] = None) -> VerbError:
    return VerbError(f"the cluster{_at(cluster)} has no {KIND} resource ({GROUP}/{VERSION}): {INSTALL_CRD}")


def api_error(exc: Exception, cluster: Optional[Cluster] = None) -> VerbError:
    """An API or connection failure in one line: what the server said, kubectl's way (`Error from
    server (Forbidden): …`); or why it said nothing, and what to do."""
    import json

    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException) and not exc.status and isinstance(exc.__context__, Exception):
        # The client library turns a failed TLS connection into an ApiException without a status.
        return _unreachable(exc.__context__, cluster)
    if isinstance(exc, ApiException):
        # The verbs read TranslationTrainings and pods only: the resource a cluster may lack is ours.
        if resource_missing(exc):
            return no_crd(cluster)
        if exc.status == 401:
            return VerbError(f"the cluster{_at(cluster)} did not accept the credentials (Unauthorized): log in "
                             "again, or fetch a fresh kubeconfig (EKS: `aws eks update-kubeconfig`, GKE: "
                             "`gcloud container clusters get-credentials`)")
        message, reason = str(exc.reason or ""), ""
        try:
            body = json.loads(exc.body or "{}")
            message, reason = body.get("message") or message, body.get("reason") or ""
        except (ValueError, AttributeError):
            pass
        return VerbError(_one_line(f"Error from server ({reason or exc.status}): {message}"))
    return _unreachable(exc, cluster)


def _unreachable(exc: Exception, cluster: Optional[Cluster]) -> VerbError:
    """A connection that failed, by its innermost cause, instead of urllib3's
    `HTTPSConnectionPool(...): Max retries exceeded with url ... (Caused by ...)`."""
    import socket
    import ssl

    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, ProxyError, ReadTimeoutError, SSLError

    if isinstance(exc, MaxRetryError) and isinstance(exc.reason, Exception):
        exc = exc.reason
    root = _root_cause(exc)
    if isinstance(exc, ProxyError):
        cause, todo = f"the proxy failed ({_one_line(root)})", "check HTTPS_PROXY, NO_PROXY and the kubeconfig's proxy-url"
    elif isinstance(root, ConnectionRefusedError):
        cause, todo = "the connection was refused", ("is the cluster running, and is that its API server's address "
                                                     "(`kubectl cluster-info` asks the same server)?")
    elif isinstance(root, socket.gaierror):
        cause, todo = "its host name does not resolve", "check the server address, and the VPN or DNS it needs"
    elif isinstance(root, ssl.SSLCertVerificationError):
        cause = f"its TLS certificate is not trusted ({root.verify_message})"
        todo = "the kubeconfig's certificate-authority must be the cluster's CA: fetch the kubeconfig again"
    elif isinstance(exc, SSLError) or isinstance(root, ssl.SSLError):
        cause, todo = f"TLS failed ({_one_line(root)})", "is the server address a Kubernetes API server's https URL?"
    elif isinstance(root, TimeoutError) and (isinstance(exc, ConnectTimeoutError) or "handshake" in str(root)):
        cause = f"no answer within {CONNECT_TIMEOUT:g} s"
        todo = "a firewall or VPN may be in the way (a private EKS or GKE endpoint answers only inside its network)"
    elif isinstance(exc, ReadTimeoutError):
        cause, todo = "it stopped answering", "try again; `kubectl cluster-info` asks the same server"
    else:
        cause = _one_line(getattr(root, "strerror", None) or root) or type(root).__name__
        todo = "check the server address and the network to it; `kubectl cluster-info` asks the same server"
    return VerbError(f"cannot reach the cluster{_at(cluster)}: {cause}; {todo}")


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost error: the socket's or the TLS library's own."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        reason = getattr(exc, "reason", None)
        inner = (reason if isinstance(reason, BaseException) else None) or exc.__cause__ or exc.__context__ or \
            next((a for a in exc.args if isinstance(a, BaseException)), None)
        if inner is None:
            break
        exc = inner
    return exc


def _at(cluster: Optional[Cluster]) -> str:
    """` at SERVER (context C, kubeconfig PATH)`: which cluster, and where that choice came from."""
    if cluster is None:
        return ""
    named = ", ".join(p for p in (cluster.context and f"context {cluster.context}",
                                  cluster.kubeconfig and f"kubeconfig {cluster.kubeconfig}") if p)
    return f" at {cluster.server}" + (f" ({named})" if named else "")


def _one_line(text: object, limit: int = 400) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 1] + "…"
