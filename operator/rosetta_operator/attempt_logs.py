"""`rosetta logs NAME --attempt N`, the pure part: which logs an attempt kept, where, and the pod that reads them.

The pod's launcher (rosetta_trainer.launch) tees each node's output of each attempt into
`$ROSETTA_OUTPUT/logs/attempt-N/node-R.log` (failures.attempt_log_path; the older half rotated once
to `node-R.log.1`) and, with checkpoint.s3, uploads it under the mirror's prefix at the same path.
Here: which nodes, which files, the header, the S3 keys, where the output directory is, the reader
pod and how to read its status. attempt_log_reader does the reading (S3, the reader pod).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from rosetta_contract.failures import attempt_log_path
from rosetta_contract.resource import API_VERSION, KIND
from rosetta_contract.trainer_pod import is_under
from rosetta_operator.kube import VerbError
from rosetta_operator.names import REPLICATED_JOB, label_value
from rosetta_operator.pod_logs import CONTAINER
from rosetta_operator.pod_template import container_security_context

ROTATED = ".1"  # the launcher's one rotation: node-R.log.1 holds the older bytes

# The reader pod. Not labelled rosetta.dev/training: the operator watches the pods that carry it.
READER_LABEL = "rosetta.dev/attempt-log-reader"
ATTEMPT_LABEL = "rosetta.dev/attempt"
READER_COMPONENT = "attempt-log-reader"
READER_RESOURCES = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "32Mi"}}
# Waiting reasons that no wait cures.
STUCK = frozenset({"ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError",
                   "CreateContainerError"})
_ATTEMPT_DIR = re.compile(r"^attempt-(\d+)/?$")
_NODE_FILE = re.compile(r"^node-(\d+)\.log(?:\.1)?$")


# ------------------------------------------------------------------------------- which logs


def attempt_record(training: Mapping[str, Any], attempt: int) -> Optional[Mapping[str, Any]]:
    """status.attempts' entry of that attempt (the operator's record of how it ended), if kept."""
    records = (training.get("status") or {}).get("attempts") or []
    found = [r for r in records if isinstance(r, Mapping) and r.get("attempt") == attempt]
    return found[-1] if found else None


def failing_rank(record: Optional[Mapping[str, Any]]) -> Optional[int]:
    rank = (record or {}).get("nodeRank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None


def chosen_ranks(nodes: int, record: Optional[Mapping[str, Any]], rank: Optional[int] = None,
                 all_ranks: bool = False) -> list[int]:
    """The nodes whose logs to print: the one asked for, every one, or node 0 and the node whose
    failure ended the attempt (status.attempts), which is where the traceback is."""
    if all_ranks:
        return list(range(nodes))
    if rank is not None:
        return [rank]
    failing = failing_rank(record)
    return [0, failing] if failing is not None and 0 < failing < nodes else [0]


def header(attempt: int, rank: int, record: Optional[Mapping[str, Any]]) -> str:
    """`==> attempt 1, node 1 (pod mt-node-0-1-x7k2p, OOMKilled, exit 137) <==` (tail's header) for
    the failing node; the others' without the parenthesis."""
    about = []
    if record is not None and failing_rank(record) == rank:
        about = [f"pod {record['pod']}" if record.get("pod") else "", str(record.get("reason") or ""),
                 f"exit {record['exitCode']}" if record.get("exitCode") is not None else ""]
    said = ", ".join(a for a in about if a)
    return f"==> attempt {attempt}, node {rank}{f' ({said})' if said else ''} <=="


def attempt_dir(attempt: int) -> str:
    """`logs/attempt-N`, relative to the output directory (failures.attempt_log_path's folder)."""
    return posixpath.dirname(attempt_log_path(attempt, 0))


def logs_dir() -> str:
    return posixpath.dirname(attempt_dir(0))


def file_names(attempt: int, rank: int) -> list[str]:
    """A node's files in its attempt's folder, oldest bytes first."""
    name = posixpath.basename(attempt_log_path(attempt, rank))
    return [name + ROTATED, name]


def kept_attempts(entries: Iterable[str]) -> list[int]:
    """The attempts of a `logs/` listing (`attempt-0`, or S3's common prefix `attempt-0/`)."""
    return sorted({int(m.group(1)) for e in entries if (m := _ATTEMPT_DIR.match(e.strip()))})


def ranks_with_log(files: Iterable[str]) -> list[int]:
    return sorted({int(m.group(1)) for f in files if (m := _NODE_FILE.match(f.strip()))})


def numbers(values: Iterable[int]) -> str:
    listed = list(values)
    return ", ".join(map(str, listed)) if listed else "none"


def split_lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


# ------------------------------------------------------------------------------------ S3


def s3_base(prefix: str) -> str:
    """The key prefix of the mirror (S3MirrorSpec.prefix has no slashes at either end)."""
    return f"{prefix}/" if prefix else ""


def s3_keys(prefix: str, attempt: int, rank: int) -> list[str]:
    """The keys of a node's log of an attempt: the launcher uploads the files at their path under
    the output directory, below the checkpoints' prefix."""
    folder = s3_base(prefix) + attempt_dir(attempt)
    return [f"{folder}/{name}" for name in file_names(attempt, rank)]


# --------------------------------------------------------------- the output directory's volume


@dataclass(frozen=True)
class Storage:
    """Where the training's pods write `$ROSETTA_OUTPUT`, and what a pod needs to mount it: all of it
    read off the trainer's pod template (the JobSet's, or rendered from the spec)."""

    output: str
    volume: Mapping[str, Any]
    mount: Mapping[str, Any]
    image: str
    image_pull_policy: Optional[str] = None
    image_pull_secrets: list[Any] = field(default_factory=list)
    security_context: Mapping[str, Any] = field(default_factory=dict)
    tolerations: list[Any] = field(default_factory=list)


def trainer_template(jobset: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The gang's pod template (replicated job `node`)."""
    for job in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        if job.get("name") == REPLICATED_JOB:
            return ((job.get("template") or {}).get("spec") or {}).get("template")
    return None


def storage_of(template: Mapping[str, Any]) -> Storage:
    pod = template.get("spec") or {}
    containers = pod.get("containers") or []
    container = next((c for c in containers if c.get("name") == CONTAINER), containers[0] if containers else {})
    env = {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, Mapping)}
    output = env.get("ROSETTA_OUTPUT")
    holders = [m for m in container.get("volumeMounts") or [] if output and m.get("mountPath")
               and is_under(output, m["mountPath"])]
    if not output or not holders:
        raise VerbError("the training's pod template does not say where its output directory is "
                        "($ROSETTA_OUTPUT on a volume mount): was it made by this version of the operator?")
    mount = max(holders, key=lambda m: len(m["mountPath"]))
    volume = next((v for v in pod.get("volumes") or [] if v.get("name") == mount.get("name")), None)
    if volume is None:
        raise VerbError(f"the training's pod template mounts volume {mount.get('name')} but does not define it")
    return Storage(output=output, volume=volume, mount=mount, image=container.get("image") or "",
                   image_pull_policy=container.get("imagePullPolicy"),
                   image_pull_secrets=list(pod.get("imagePullSecrets") or []),
                   security_context=pod.get("securityContext") or {}, tolerations=list(pod.get("tolerations") or []))


def not_shared(storage: Storage, attempt: int, mirrored: bool = False) -> Optional[str]:
    """Why no other pod can read the output directory: it is the pod's own (emptyDir) or a node's
    disk (hostPath, which a restricted pod may not mount); None for a volume that outlives pods."""
    where = f"{storage.output}/{attempt_dir(attempt)}/"
    if "emptyDir" in storage.volume:
        return (f"its output directory {storage.output} is on an emptyDir (volume {storage.volume['name']}), "
                "which is deleted with its pod: the logs were not kept beyond the pods"
                + ("" if mirrored else ". A checkpoints volume on a PersistentVolumeClaim, or checkpoint.s3, keeps them"))
    if "hostPath" in storage.volume:
        host = (storage.volume.get("hostPath") or {}).get("path", "?")
        return (f"its output directory {storage.output} is on hostPath {host} of each node that ran a pod, not on "
                f"a volume that another pod can mount: the logs are on those nodes' disks, at {where} under "
                f"{host} (as mounted at {storage.mount.get('mountPath')})")
    return None


def owner_reference(training: Mapping[str, Any]) -> dict[str, Any]:
    """The training owns the reader pod, so that it goes with it; neither `controller` (the operator
    controls nothing of it) nor `blockOwnerDeletion` (which needs update on the training's finalizers)."""
    meta = training["metadata"]
    return {"apiVersion": training.get("apiVersion", API_VERSION), "kind": training.get("kind", KIND),
            "name": meta["name"], "uid": meta["uid"]}


def reader_labels(name: str, attempt: int) -> dict[str, str]:
    return {"app.kubernetes.io/name": "rosetta", "app.kubernetes.io/component": READER_COMPONENT,
            READER_LABEL: label_value(name), ATTEMPT_LABEL: str(attempt)}


def reader_pod(training: Mapping[str, Any], storage: Storage, attempt: int, commands: Mapping[str, list[str]],
               *, deadline_seconds: int) -> dict[str, Any]:
    """A pod that runs each command (container name → argv, no shell) in the trainer image, with the
    output directory's volume mounted read-only where the training's pods mount it; what each one
    prints is its container's log. Pod Security `restricted`: non-root, RuntimeDefault seccomp, no
    privilege escalation, every capability dropped, a read-only root filesystem, no API token."""
    name = training["metadata"]["name"]
    volume = {k: v for k, v in storage.volume.items() if k != "name"}
    if "persistentVolumeClaim" in volume:
        volume["persistentVolumeClaim"] = {**volume["persistentVolumeClaim"], "readOnly": True}
    mount: dict[str, Any] = {"name": "output", "mountPath": storage.mount["mountPath"], "readOnly": True}
    if storage.mount.get("subPath"):
        mount["subPath"] = storage.mount["subPath"]
    security = {**storage.security_context, "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    container_base: dict[str, Any] = {"image": storage.image}
    if storage.image_pull_policy:
        container_base["imagePullPolicy"] = storage.image_pull_policy
    containers = [{"name": container, **container_base, "command": list(argv),
                   "securityContext": container_security_context(), "resources": READER_RESOURCES,
                   "volumeMounts": [mount]} for container, argv in commands.items()]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": deadline_seconds,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 1,
        "securityContext": security,
        "containers": containers,
        "volumes": [{"name": "output", **volume}],
    }
    if storage.image_pull_secrets:
        spec["imagePullSecrets"] = storage.image_pull_secrets
    if storage.tolerations:  # it may go where the training's pods went (a tainted pool), not only there
        spec["tolerations"] = storage.tolerations
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{name[:40].rstrip('-')}-attempt-{attempt}-logs-",
                         "namespace": training["metadata"].get("namespace"),
                         "labels": reader_labels(name, attempt), "ownerReferences": [owner_reference(training)]},
            "spec": spec}


def listing_commands(storage: Storage, attempt: int) -> dict[str, list[str]]:
    """`ls` of `logs/` (which attempts are kept) and of the attempt's folder (which nodes)."""
    return {"attempts": ["ls", "-1", "--", f"{storage.output}/{logs_dir()}"],
            "files": ["ls", "-1", "--", f"{storage.output}/{attempt_dir(attempt)}"]}


def cat_commands(storage: Storage, attempt: int, files: Iterable[str]) -> dict[str, list[str]]:
    """One container per file, `cat FILE`: its log is the file (and its exit status says it was there)."""
    return {reader_container_name(f): ["cat", "--", f"{storage.output}/{attempt_dir(attempt)}/{f}"] for f in files}


def reader_container_name(file: str) -> str:
    """The container of the reader pod that prints FILE: `node-1.log.1` → `node-1-rotated`."""
    return file.replace(".log", "").replace(ROTATED, "-rotated").replace(".", "-")


def waiting_problem(pod: Mapping[str, Any]) -> tuple[str, bool]:
    """(what the pod waits for, whether no wait cures it): its phase and the reason the scheduler or
    the kubelet gives."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"phase {phase}, {cond.get('reason') or 'not scheduled'}: {cond.get('message') or ''}".rstrip(": "), False
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            reason = str(waiting["reason"])
            said = f"phase {phase}, container {cs.get('name')} {reason}: {waiting.get('message') or ''}".rstrip(": ")
            return said, reason in STUCK
    if phase == "Failed":
        return f"phase Failed, {status.get('reason') or ''}: {status.get('message') or ''}".rstrip(": "), True
    return f"phase {phase}" + (", ContainerCreating" if phase == "Pending" and status.get("containerStatuses") else ""), False


def finished(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") not in ("Succeeded", "Failed"):
        return False
    return all((cs.get("state") or {}).get("terminated") is not None for cs in status.get("containerStatuses") or [])


def exit_codes(pod: Mapping[str, Any]) -> dict[str, Optional[int]]:
    out: dict[str, Optional[int]] = {}
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated") or {}
        out[cs.get("name")] = terminated.get("exitCode")
    return out
