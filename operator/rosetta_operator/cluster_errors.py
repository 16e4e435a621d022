"""Why a cluster call failed, in one line that names the cluster and says what to do: what the
apiserver answered, kubectl's way (`Error from server (Forbidden): …`), a cluster without the
TranslationTraining CRD, credentials it refused; or, for a connection that failed, its innermost
cause instead of urllib3's `HTTPSConnectionPool(...): Max retries exceeded with url ...`.
"""

from __future__ import annotations

from typing import Optional

from rosetta_contract.resource import GROUP, KIND, VERSION
from rosetta_operator import kube
from rosetta_operator.kube import Cluster, VerbError, resource_missing

INSTALL_CRD = "install the CRD (how: `kubectl apply -f manifests/crd.yaml` or the Helm chart)"


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
        return VerbError(one_line(f"Error from server ({reason or exc.status}): {message}"))
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
        cause, todo = f"the proxy failed ({one_line(root)})", "check HTTPS_PROXY, NO_PROXY and the kubeconfig's proxy-url"
    elif isinstance(root, ConnectionRefusedError):
        cause, todo = "the connection was refused", ("is the cluster running, and is that its API server's address "
                                                     "(`kubectl cluster-info` asks the same server)?")
    elif isinstance(root, socket.gaierror):
        cause, todo = "its host name does not resolve", "check the server address, and the VPN or DNS it needs"
    elif isinstance(root, ssl.SSLCertVerificationError):
        cause = f"its TLS certificate is not trusted ({root.verify_message})"
        todo = "the kubeconfig's certificate-authority must be the cluster's CA: fetch the kubeconfig again"
    elif isinstance(exc, SSLError) or isinstance(root, ssl.SSLError):
        cause, todo = f"TLS failed ({one_line(root)})", "is the server address a Kubernetes API server's https URL?"
    elif isinstance(root, TimeoutError) and (isinstance(exc, ConnectTimeoutError) or "handshake" in str(root)):
        cause = f"no answer within {kube.CONNECT_TIMEOUT:g} s"
        todo = "a firewall or VPN may be in the way (a private EKS or GKE endpoint answers only inside its network)"
    elif isinstance(exc, ReadTimeoutError):
        cause, todo = "it stopped answering", "try again; `kubectl cluster-info` asks the same server"
    else:
        cause = one_line(getattr(root, "strerror", None) or root) or type(root).__name__
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


def one_line(text: object, limit: int = 400) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 1] + "…"
