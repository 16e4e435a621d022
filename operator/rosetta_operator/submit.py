"""`rosetta submit -f FILE`: validate the TranslationTraining as the operator would, then server-side
apply every document of the file (an example's PersistentVolumeClaim too, as `kubectl apply -f`
would), in file order, with field manager `rosetta`.

The CLI creates only what the file holds; the operator creates the ConfigMap and the JobSet. What
is applied is the document as written (with `--set` overrides), not the validated model, so the
apiserver's defaults and the operator's apply as they would to `kubectl apply`.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from rosetta_contract.documents import apply_overrides, read_yaml
from rosetta_contract.resource import KIND
from rosetta_contract.strict_model import ConfigError
from rosetta_operator.kube import FIELD_MANAGER, INVALID, Cluster, VerbError


def checked_training(raw: Any, overrides: list[str], source: Optional[str] = None,
                     allow_host_path: bool = False) -> dict[str, Any]:
    """One TranslationTraining document with `overrides` applied, validated as the operator would
    validate it (a ConfigError, exit 2, names every problem); as written, not as the model reads it."""
    from rosetta_contract.spec import parse_training
    from rosetta_operator.render import render

    training = apply_overrides(raw, overrides, source)
    parsed = parse_training(training, source, allow_host_path=allow_host_path)
    # Rendering catches what only the child names reveal (a pod hostname over 63 characters).
    render(parsed.metadata.name, parsed.metadata.namespace or "default", parsed.spec)
    return dict(training)


def read_documents(path: str, overrides: list[str], allow_host_path: bool = False) -> list[dict[str, Any]]:
    """The file's documents, its TranslationTraining with `overrides` applied and validated (a
    ConfigError, exit 2, names every problem)."""
    from rosetta_contract import strict_yaml

    training = checked_training(read_yaml(path), overrides, str(path), allow_host_path)  # ConfigError on a bad file
    documents = [d for d in strict_yaml.load_all(strict_yaml.read_text(path)) if d is not None]
    if len(documents) == 1:
        return [training]
    out = []
    for doc in documents:
        if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind") or \
                not (doc.get("metadata") or {}).get("name"):
            raise ConfigError([("(file)", "every document needs apiVersion, kind and metadata.name")], str(path))
        out.append(training if doc.get("kind") == KIND else doc)
    return out


def kind_name(doc: dict[str, Any]) -> str:
    """kubectl's `translationtraining.rosetta.dev/NAME`, `persistentvolumeclaim/NAME`."""
    api_version = doc.get("apiVersion", "")
    group = api_version.split("/")[0] if "/" in api_version else ""
    return f"{doc['kind'].lower()}{'.' + group if group else ''}/{doc['metadata']['name']}"


def apply_documents(cluster: Cluster, documents: list[dict[str, Any]], *, force: bool = False,
                    namespace: Optional[str] = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Server-side apply each document; yields (`KIND/NAME created|configured|unchanged`, the object
    as the server returned it). `namespace`: the one given with -n, which a document's own must match."""
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

    from rosetta_operator.cluster_errors import no_crd

    client = DynamicClient(cluster.api)
    # Every kind looked up before anything is applied: a cluster without the CRD leaves no claim
    # of the file behind, and says so as every other verb does.
    resources = []
    for doc in documents:
        try:
            resources.append(client.resources.get(api_version=doc["apiVersion"], kind=doc["kind"]))
        except ResourceNotFoundError:
            if doc["kind"] == KIND:
                raise no_crd(cluster) from None
            raise VerbError(f"the cluster has no {doc['kind']} in {doc['apiVersion']}") from None
    for resource, doc in zip(resources, documents):
        name, ns = doc["metadata"]["name"], None
        if resource.namespaced:
            own = doc["metadata"].get("namespace")
            if own and namespace and own != namespace:
                raise VerbError(f"{kind_name(doc)} says namespace {own}, -n says {namespace}", INVALID)
            ns = own or cluster.namespace
            doc = {**doc, "metadata": {**doc["metadata"], "namespace": ns}}
        try:
            before = resource.get(name=name, namespace=ns).to_dict()
        except NotFoundError:
            before = None
        after = client.server_side_apply(resource, body=doc, name=name, namespace=ns, field_manager=FIELD_MANAGER,
                                         force_conflicts=force).to_dict()
        if before is None:
            verb = "created"
        elif before["metadata"].get("resourceVersion") == after["metadata"].get("resourceVersion"):
            verb = "unchanged"
        else:
            verb = "configured"
        yield f"{kind_name(doc)} {verb}", after
