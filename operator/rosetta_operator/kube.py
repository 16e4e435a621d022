"""The cluster as the `rosetta` verbs see it: kubectl's way of finding it, and the few calls they make.

Which cluster and namespace, as kubectl decides: `--kubeconfig`, else $KUBECONFIG (several files
joined by `:`), else ~/.kube/config; `--context`, else the file's current context; `-n`, else the
context's namespace, else `default`. Without any kubeconfig, inside a pod: the pod's ServiceAccount
and namespace.

Every failure is a `VerbError` carrying its exit status: 1 for what the cluster said or did not
say (not found, forbidden, unreachable, timed out, the training failed), 2 for what the user typed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, cast

from rosetta_contract.resource import GROUP, KIND, PLURAL, VERSION

RESOURCE = f"{KIND.lower()}.{GROUP}"  # what kubectl prints: translationtraining.rosetta.dev/NAME
FIELD_MANAGER = "rosetta"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

FAILED, INVALID = 1, 2


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
            if exc.status == 404:
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
            if exc.status == 404:
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
    try:
        if path:
            api = kubernetes.config.new_client_from_config(config_file=path, context=context)
            contexts, current = kubernetes.config.list_kube_config_contexts(config_file=path)
            chosen = next((c for c in contexts if c["name"] == context), current) if context else current
            ns = namespace or ((chosen or {}).get("context") or {}).get("namespace") or "default"
            return Cluster(api, ns, (chosen or {}).get("name"))
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            if context:
                raise VerbError("--context needs a kubeconfig; none was found", INVALID)
            configuration = kubernetes.client.Configuration()
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            ns_file = SERVICE_ACCOUNT_DIR / "namespace"
            ns = namespace or (ns_file.read_text().strip() if ns_file.exists() else "default")
            return Cluster(kubernetes.client.ApiClient(configuration), ns)
    except ConfigException as exc:
        raise VerbError(f"kubeconfig: {exc}") from None
    raise VerbError("no cluster: pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config "
                    "(kubectl's own configuration)")


def api_error(exc: Exception, cluster: Optional[Cluster] = None) -> VerbError:
    """An API or connection failure in one line, kubectl's way: `Error from server (Forbidden): …`."""
    import json

    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        message, reason = str(exc.reason or ""), ""
        try:
            body = json.loads(exc.body or "{}")
            message, reason = body.get("message") or message, body.get("reason") or ""
        except (ValueError, AttributeError):
            pass
        return VerbError(f"Error from server ({reason or exc.status}): {message}")
    where = f" at {cluster.server}" if cluster is not None else ""
    return VerbError(f"cannot reach the cluster{where}: {exc}")
