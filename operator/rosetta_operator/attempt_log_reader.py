"""`rosetta logs NAME --attempt N`, the reading: an attempt's kept logs fetched after its pods are gone.

From S3 with the user's own AWS credentials, as the AWS CLI would find them, else from the checkpoints
volume through a short-lived reader pod that mounts the training's volume read-only and `cat`s the
files (the user, not the operator, creates it). Which nodes, files, keys and what the reader pod
looks like are attempt_logs' (pure); here are the two sources, the fallback from one to the other,
and `lines`, which the Python client's `attempt_logs` returns.
"""

from __future__ import annotations

import collections
import math
import os
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Protocol

from rosetta_operator.attempt_logs import (
    Storage,
    attempt_dir,
    attempt_record,
    cat_commands,
    chosen_ranks,
    exit_codes,
    file_names,
    finished,
    header,
    kept_attempts,
    listing_commands,
    logs_dir,
    not_shared,
    numbers,
    ranks_with_log,
    reader_container_name,
    reader_pod,
    s3_base,
    s3_keys,
    split_lines,
    storage_of,
    trainer_template,
    waiting_problem,
)
from rosetta_operator.kube import Cluster, VerbError
from rosetta_operator.pod_logs import node_count, rank_prefix

JOBSET_API = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
# The operator's default trainer image (handlers.DEFAULT_IMAGE_ENV, the chart's trainer.image), for
# a training whose JobSet is gone and whose spec names no image.
DEFAULT_IMAGE_ENV = "ROSETTA_DEFAULT_IMAGE"
READER_TIMEOUT = 180.0
# Seconds the reader pod may live past the wait, should the CLI die before it deletes it.
READER_GRACE = 60
# Nodes per reader pod (two `cat` containers each): a namespace's quota counts every container.
RANKS_PER_READER = 8
POLL = 1.0


# ---------------------------------------------------------------------------- the sources


class NotKept(Exception):
    """The source has no folder for the attempt; `kept` lists those it has."""

    def __init__(self, kept: list[int]):
        super().__init__(f"attempts kept: {numbers(kept)}")
        self.kept = kept


class Unavailable(Exception):
    """The source cannot be read (no boto3, no credentials, refused): another may be."""


class Source(Protocol):
    where: str

    def open(self, attempt: int, ranks: list[int]) -> list[int]:
        """The attempt's nodes that have a log; NotKept when the attempt has no folder."""

    def read(self, rank: int) -> str:
        """A node's log of the opened attempt, its rotated half first."""


class S3Source:
    """The mirror's copy: `<prefix>/logs/attempt-N/node-R.log`, read with the user's own credentials."""

    def __init__(self, mirror: Any, client: Any = None):  # rosetta_contract.checkpoint_fields.S3MirrorSpec
        self.mirror, self._client = mirror, client
        self.where = f"s3://{mirror.bucket}/{s3_base(mirror.prefix)}{logs_dir()}/"
        self.attempt = 0
        self.keys: set[str] = set()

    def client(self) -> Any:
        if self._client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise Unavailable(f"reading {self.where} needs boto3: pip install 'rosetta-mt[s3]'") from None
            options: dict[str, Any] = {"retries": {"mode": "standard", "total_max_attempts": 3},
                                       "connect_timeout": 10, "read_timeout": 60}
            # The spec's endpoint is the one the pods reach; the user's AWS_ENDPOINT_URL[_S3] wins.
            endpoint = None if os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") \
                else self.mirror.endpoint_url
            if endpoint:
                options["s3"] = {"addressing_style": "path"}
            self._client = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=self.mirror.region,
                                                          config=Config(**options))
        return self._client

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:  # botocore's errors, without importing botocore before it is needed
            raise Unavailable(f"{what}: {_s3_problem(exc)}") from exc

    def _list(self, prefix: str, delimiter: str = "") -> tuple[list[str], list[str]]:
        keys: list[str] = []
        prefixes: list[str] = []
        pages = self._call(f"listing s3://{self.mirror.bucket}/{prefix}", lambda: list(
            self.client().get_paginator("list_objects_v2").paginate(
                Bucket=self.mirror.bucket, Prefix=prefix, **({"Delimiter": delimiter} if delimiter else {}))))
        for page in pages:
            keys += [o["Key"] for o in page.get("Contents") or []]
            prefixes += [p["Prefix"] for p in page.get("CommonPrefixes") or []]
        return keys, prefixes

    def open(self, attempt: int, ranks: list[int]) -> list[int]:
        base = s3_base(self.mirror.prefix)
        folder = f"{base}{attempt_dir(attempt)}/"
        keys, _ = self._list(folder)
        if not keys:
            _, prefixes = self._list(f"{base}{logs_dir()}/", delimiter="/")
            raise NotKept(kept_attempts(p[len(base) + len(logs_dir()) + 1:] for p in prefixes))
        self.attempt, self.keys = attempt, set(keys)
        return ranks_with_log(k[len(folder):] for k in keys)

    def read(self, rank: int) -> str:
        parts = []
        for key in s3_keys(self.mirror.prefix, self.attempt, rank):
            if key in self.keys:
                parts.append(self._get(key).decode("utf-8", errors="replace"))
        return "".join(parts)

    def _get(self, key: str) -> bytes:
        return bytes(self._call(f"reading s3://{self.mirror.bucket}/{key}", lambda: self.client().get_object(
            Bucket=self.mirror.bucket, Key=key)["Body"].read()))


def _s3_problem(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        error = response.get("Error") or {}
        return f"{error.get('Code') or 'error'}: {error.get('Message') or exc}"
    if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        return ("no AWS credentials in this environment (found as the AWS CLI finds them: AWS_PROFILE, "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ~/.aws, SSO)")
    return " ".join(str(exc).split()) or type(exc).__name__


class VolumeSource:
    """The checkpoints volume, read by reader pods that mount it read-only and print the files."""

    def __init__(self, cluster: Cluster, training: Mapping[str, Any], storage: Storage, *, timeout: float,
                 say: Callable[[str], None], sleep: Callable[[float], None] = time.sleep):
        self.cluster, self.training, self.storage = cluster, training, storage
        self.timeout, self.say, self.sleep = timeout, say, sleep
        claim = (storage.volume.get("persistentVolumeClaim") or {}).get("claimName")
        self.where = f"volume {storage.volume.get('name')}" + (f" (claim {claim})" if claim else "") + \
            f" at {storage.output}/{logs_dir()}/"
        self.attempt, self.ranks = 0, [0]
        self.files: set[str] = set()
        self.texts: dict[int, str] = {}

    def open(self, attempt: int, ranks: list[int]) -> list[int]:
        self.attempt, self.ranks = attempt, ranks
        first = ranks[:RANKS_PER_READER]
        files = [f for r in first for f in file_names(attempt, r)]
        results = self._run({**listing_commands(self.storage, attempt), **cat_commands(self.storage, attempt, files)})
        code, attempts = results["attempts"]
        if code != 0:
            if "No such file" not in attempts:
                raise VerbError(f"the log reader could not list {self.storage.output}/{logs_dir()}: "
                                f"{' '.join(attempts.split())}")
            raise NotKept([])
        code, listed = results["files"]
        if code != 0:
            if "No such file" not in listed:
                raise VerbError(f"the log reader could not list {self.storage.output}/{attempt_dir(attempt)}: "
                                f"{' '.join(listed.split())}")
            raise NotKept(kept_attempts(split_lines(attempts)))
        self.files = {f.strip() for f in split_lines(listed) if f.strip()}
        self._keep(first, results)
        return ranks_with_log(self.files)

    def read(self, rank: int) -> str:
        if rank not in self.texts:
            i = self.ranks.index(rank)
            chunk = [r for r in self.ranks[i:i + RANKS_PER_READER] if r not in self.texts]
            files = [f for r in chunk for f in file_names(self.attempt, r) if f in self.files]
            self._keep(chunk, self._run(cat_commands(self.storage, self.attempt, files)) if files else {})
        return self.texts.pop(rank, "")

    def _keep(self, ranks: list[int], results: Mapping[str, tuple[Optional[int], str]]) -> None:
        for r in ranks:
            parts = []
            for f in file_names(self.attempt, r):
                code, text = results.get(reader_container_name(f), (None, ""))
                if f in self.files and code != 0:
                    raise VerbError(f"the log reader could not read {self.storage.output}/{attempt_dir(self.attempt)}/"
                                    f"{f}: {' '.join(text.split()) or f'exit {code}'}")
                if f in self.files:
                    parts.append(text)
            self.texts[r] = "".join(parts)

    def _run(self, commands: Mapping[str, list[str]]) -> dict[str, tuple[Optional[int], str]]:
        """Create the reader pod, wait for its containers to end, read each one's log, delete it:
        container name → (exit code, log)."""
        from kubernetes.client.exceptions import ApiException

        core, ns = self.cluster.core, self.cluster.namespace
        manifest = reader_pod(self.training, self.storage, self.attempt, commands,
                              deadline_seconds=math.ceil(self.timeout) + READER_GRACE)
        created = self.cluster.api.sanitize_for_serialization(core.create_namespaced_pod(ns, manifest))
        name = created["metadata"]["name"]
        try:
            pod = self._wait(name, created)
            codes = exit_codes(pod)
            return {c: (codes.get(c), self._log(name, c)) for c in commands}
        finally:
            try:
                core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    self.say(f"warning: the log reader pod {name} was not deleted ({exc.status} {exc.reason}): "
                             f"it ends within {math.ceil(self.timeout) + READER_GRACE} s and goes with the "
                             f"training, or `kubectl delete pod {name}`")

    def _wait(self, name: str, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        deadline = time.monotonic() + self.timeout
        while not finished(pod):
            problem, stuck = waiting_problem(pod)
            if stuck or time.monotonic() > deadline:
                after = "" if stuck else f"timed out after {self.timeout:.0f} s waiting for "
                raise VerbError(f"{after}the log reader pod {name} in namespace {self.cluster.namespace} "
                                f"({problem}){'' if stuck else '; --pod-running-timeout waits longer'}")
            self.sleep(POLL)
            pod = self.cluster.api.sanitize_for_serialization(
                self.cluster.core.read_namespaced_pod(name, self.cluster.namespace))
        return pod

    def _log(self, pod: str, container: str) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.cluster.core.read_namespaced_pod_log(pod, self.cluster.namespace, container=container,
                                                             _preload_content=False)
        except ApiException as exc:
            if exc.status in (400, 404):  # the container never started (the deadline came first)
                return ""
            raise
        try:
            return bytes(resp.data).decode("utf-8", errors="replace")
        finally:
            resp.release_conn()


# ------------------------------------------------------------------------------- reading


def _jobset(cluster: Cluster, name: str) -> Optional[dict[str, Any]]:
    """The training's JobSet, or None when it is gone (ttlSecondsAfterFinished) or may not be read."""
    from kubernetes.client.exceptions import ApiException

    try:
        found: dict[str, Any] = cluster.custom.get_namespaced_custom_object(*JOBSET_API[:2], cluster.namespace,
                                                                             JOBSET_API[2], name)
        return found
    except ApiException as exc:
        if exc.status in (403, 404):
            return None
        raise


def spec_and_template(cluster: Cluster, training: Mapping[str, Any]) -> tuple[Any, Mapping[str, Any]]:
    """The spec the pods ran with, and their pod template: the JobSet's while it exists (what ran,
    the operator's default image included), else rendered from the spec as the operator would."""
    from rosetta_contract.spec import parse_spec
    from rosetta_contract.strict_model import ConfigError
    from rosetta_operator import render
    from rosetta_operator.applied_spec import applied_spec_of, with_default_image

    name = training["metadata"]["name"]
    jobset_name = (training.get("status") or {}).get("jobSetName") or name
    jobset = _jobset(cluster, jobset_name)
    raw = applied_spec_of(jobset, training.get("spec") or {}) if jobset else training.get("spec") or {}
    try:
        spec = parse_spec(with_default_image(raw, os.environ.get(DEFAULT_IMAGE_ENV)), allow_host_path=True)
        template = trainer_template(jobset) if jobset else None
        if template is None:
            template = trainer_template(render.render(name, cluster.namespace, spec).jobset)
    except ConfigError as exc:
        raise VerbError(f"the spec of {name} is not valid ({exc.errors[0][0]}: {exc.errors[0][1]}): "
                        "its pods never ran") from None
    assert template is not None  # render makes one
    return spec, template


def _silent(_: str) -> None:
    pass


def lines(cluster: Cluster, name: str, attempt: int, *, rank: Optional[int] = None, all_ranks: bool = False,
          tail: Optional[int] = None, timeout: float = READER_TIMEOUT, on_header: Optional[Callable[[str], None]] = None,
          sleep: Callable[[float], None] = time.sleep, s3_client: Any = None) -> Iterator[str]:
    """The kept log of attempt `attempt`, node by node, as lines (no line ends); prefixed `[rank N] `
    when more than one node is chosen. `on_header` hears each node's `==> … <==` line before its
    lines, and notes (a source that could not be read and the one read instead)."""
    say: Callable[[str], None] = on_header or _silent
    training = cluster.existing_training(name)
    nodes = node_count(training)
    if rank is not None and not 0 <= rank < nodes:
        raise VerbError(f"--rank {rank}: {name} has {nodes} node{'s' * (nodes != 1)}, ranks 0 to {nodes - 1}", 2)
    record = attempt_record(training, attempt)
    ranks = chosen_ranks(nodes, record, rank, all_ranks)
    spec, template = spec_and_template(cluster, training)
    storage = storage_of(template)

    sources: list[Source] = []
    if spec.checkpoint.s3 is not None:
        sources.append(S3Source(spec.checkpoint.s3, s3_client))
    unshared = not_shared(storage, attempt, mirrored=bool(sources))
    if unshared is None:
        sources.append(VolumeSource(cluster, training, storage, timeout=timeout, say=say, sleep=sleep))
    problems: list[tuple[str, Exception]] = []
    for source in sources:
        try:
            present = source.open(attempt, ranks)
        except (NotKept, Unavailable) as exc:
            problems.append((source.where, exc))
            continue
        if problems:
            why = "; ".join(f"{where}: {exc}" if isinstance(exc, NotKept) else str(exc) for where, exc in problems)
            say(f"note: {why}; read {source.where} instead")
        break
    else:
        alone = len(problems) == 1 and unshared is None
        said = [f"{where}: {exc}" if isinstance(exc, NotKept) and not alone else str(exc)
                for where, exc in problems] + ([unshared] if unshared is not None else [])
        if problems and all(isinstance(exc, Unavailable) for _, exc in problems):
            raise VerbError(f"cannot read the kept log of attempt {attempt} of training {name} ({'; '.join(said)})")
        raise VerbError(f"training {name} has no kept log for attempt {attempt} ({'; '.join(said)})")

    found = [r for r in ranks if r in present]
    if not found:
        raise VerbError(f"training {name} has no kept log of node{'s' * (len(ranks) > 1)} {numbers(ranks)} in "
                        f"attempt {attempt} (nodes with a log: {numbers(present)})")
    missing = [r for r in ranks if r not in present]
    if missing and not all_ranks:
        say(f"note: no kept log of node{'s' * (len(missing) > 1)} {numbers(missing)} in attempt {attempt}")
    prefixed = all_ranks or len(ranks) > 1
    for r in found:
        text = source.read(r)
        say(header(attempt, r, record))
        kept: Iterable[str] = split_lines(text)
        if tail is not None:
            kept = collections.deque(kept, maxlen=max(tail, 0))
        prefix = rank_prefix(r) if prefixed else ""
        for line in kept:
            yield prefix + line
