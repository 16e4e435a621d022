"""The cluster as the `rosetta` verbs see it: the few calls they make (Cluster), and the error every
verb's failure becomes (VerbError).

A Cluster comes from kubeconfig.connect(), which finds it as kubectl does; cluster_errors.py says in
one line why a call failed.

Every failure is a `VerbError` carrying its exit status: 1 for what the cluster said or did not
say (not found, forbidden, unreachable, timed out, no TranslationTraining CRD, the training failed)
and for credentials that could not be had (the kubeconfig's exec plugin is not installed, or
fails); 2 for what the user typed or configured: a bad argument, or a kubeconfig that cannot be
used as written (not YAML, no such file or context, a context naming a cluster or user the file
lacks). A broken kubeconfig is input: no retry fixes it, and no request has been made.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional, cast

from rosetta_contract.resource import GROUP, KIND, PLURAL, VERSION

RESOURCE = f"{KIND.lower()}.{GROUP}"  # what kubectl prints: translationtraining.rosetta.dev/NAME
FIELD_MANAGER = "rosetta"

FAILED, INVALID = 1, 2

# Seconds to open the TCP connection and finish the TLS handshake. Reads stay unbounded: watches
# and `logs -f` stream for as long as the training runs. Read at call time (kubeconfig.py's client,
# cluster_errors.py's message), so that one setting governs them all.
CONNECT_TIMEOUT = 10.0


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
