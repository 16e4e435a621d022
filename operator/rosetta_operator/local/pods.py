"""Turn the rendered JobSet into local processes: one `LocalPod` per pod of the replicated job.

The pod template is used as the kubelet would use it: the container's command with `$(VAR)`
expanded from its env, the env resolved (node rank from the job completion index), and
every volume mounted. A process cannot mount directories, so mounts become a path map:
each container path under a mount is rewritten to the local directory behind it, in the
env, in the command and in the ConfigMap's trainer config (data and checkpoint paths in
the YAML usually point into mounted volumes).

Volumes are local directories, shared as a cluster shares them: a persistentVolumeClaim is one
directory (under the run's output dir) that every pod mounts and that outlives restarts; a
hostPath is the host path (all local pods are on one node); an emptyDir is each pod's own, a new
directory for every pod of every restart attempt (see `Mounts`). So the trainer config, whose
paths may point into an emptyDir, is translated per pod when it has to be.

What differs from a cluster is explicit and small: the master address is 127.0.0.1 with a
free port, /dev/shm, /tmp and the home directory are the host's, GPUs are the ones this
machine has (see `fit_hardware`), and `--volume NAME=DIR` puts a volume in a directory of
your choice (shared by the pods, even an emptyDir: you asked for it, and are told).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast

import yaml

from rosetta_contract import strict_yaml
from rosetta_operator.names import COMPLETION_INDEX, CONFIG_KEY, REPLICATED_JOB, STAGE_JOB
from rosetta_operator.pod_template import SCRATCH_MOUNTS
from rosetta_operator.render import Rendered

# JobSet exposes the restart count of the gang on every pod; the trainer reports it.
RESTART_ATTEMPT_ENV = "ROSETTA_RESTART_ATTEMPT"
_VAR_REF = re.compile(r"\$\((\w+)\)")
# Launchers that the container image has on its PATH, mapped to this interpreter's modules,
# so the same command works from a virtualenv that is not activated. The image's `python` is this
# interpreter; the trainer pod's `python -m rosetta_trainer.launch torchrun` maps torchrun itself.
_LAUNCHER_MODULES = {"torchrun": "torch.distributed.run", "deepspeed": "deepspeed.launcher.runner"}
_PYTHONS = ("python", "python3")


class LocalRunError(RuntimeError):
    """The rendered pod cannot be run as a local process; the message says why."""


@dataclass(frozen=True)
class Hardware:
    """What the pods get here: GPUs per pod (0 = CPU) and processes per pod."""

    gpus_per_pod: int
    procs_per_pod: int
    note: str | None = None  # set when the spec asked for more than this machine has


@dataclass
class PathMap:
    """Container path prefixes → local directories, longest prefix first."""

    mounts: list[tuple[str, Path]] = field(default_factory=list)

    def add(self, container_path: str, local: Path) -> None:
        self.mounts.append((container_path.rstrip("/") or "/", local))
        self.mounts.sort(key=lambda m: len(m[0]), reverse=True)

    def local(self, value: str) -> str:
        for prefix, local in self.mounts:
            if value == prefix:
                return str(local)
            if value.startswith(prefix + "/"):
                return str(local / value[len(prefix) + 1:])
        return value

    def rewrite(self, text: str) -> str:
        """Rewrite a path, or each path inside an argument such as --output=/checkpoints/x."""
        if text.startswith("/"):
            return self.local(text)
        flag, sep, value = text.partition("=")
        if sep and value.startswith("/"):
            return f"{flag}={self.local(value)}"
        return text


@dataclass(frozen=True)
class LocalPod:
    name: str
    index: int
    argv: list[str]
    env: dict[str, str]  # only what the pod sets; the runner adds the parent's environment
    paths: PathMap = field(default_factory=PathMap)  # this pod's mounts


@dataclass
class Mounts:
    """Where the pod template's mounts are on this machine.

    `shared` maps the mounts every pod sees the same, for the whole run: persistentVolumeClaims,
    hostPaths and `--volume` directories. Each emptyDir is per pod and per restart attempt, as a
    new pod gets a new one: <output>/pods/attempt-A/pod-I/<volume> (a new run into the same output
    starts without the last run's, as new pods do). The ConfigMap's trainer config goes to
    <output>/config/ when it reads the same for every pod, else to each pod's own config/.
    """

    output: Path
    shared: PathMap = field(default_factory=PathMap)
    empty_dirs: list[tuple[str, str, str]] = field(default_factory=list)  # (mountPath, volume, subPath)
    config_mount: str | None = None
    config_text: str | None = None  # the ConfigMap's trainer config, container paths

    def pod_dir(self, attempt: int, index: int) -> Path:
        return self.output / "pods" / f"attempt-{attempt}" / f"pod-{index}"

    def for_pod(self, attempt: int, index: int) -> PathMap:
        """Create pod `index`'s emptyDirs for restart attempt `attempt`, write its config; its path map."""
        paths = PathMap(list(self.shared.mounts))
        for mount_path, name, sub_path in self.empty_dirs:
            local = self.pod_dir(attempt, index) / name
            local = local / sub_path if sub_path else local
            local.mkdir(parents=True, exist_ok=True)
            paths.add(mount_path, local.resolve())
        if self.config_mount is not None and self.config_text is not None:
            text = _translate_config(self.config_text, paths)
            same_for_all = text == _translate_config(self.config_text, self.shared)
            config_dir = self.output / "config" if same_for_all else self.pod_dir(attempt, index) / "config"
            config_dir.mkdir(parents=True, exist_ok=True)
            path = config_dir / CONFIG_KEY
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            paths.add(self.config_mount, config_dir.resolve())
        return paths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def fit_hardware(nodes: int, gpus_per_node: int, procs_per_node: int, available_gpus: int) -> Hardware:
    """GPUs per pod that this machine can give; never silently fewer than asked."""
    if gpus_per_node == 0:
        return Hardware(0, procs_per_node)
    wanted = nodes * gpus_per_node
    if available_gpus >= wanted:
        return Hardware(gpus_per_node, gpus_per_node)
    asked = f"the spec asks for {nodes} node(s) x {gpus_per_node} GPU(s), this machine has {available_gpus}"
    if available_gpus >= nodes:
        per_pod = available_gpus // nodes
        return Hardware(per_pod, per_pod, f"{asked}: running {per_pod} GPU process(es) per pod")
    return Hardware(0, 1, f"{asked}: running on CPU (gloo), 1 process per pod")


def _expand(value: str, env: dict[str, str]) -> str:
    # Kubernetes semantics: $(VAR) of a defined variable is replaced, anything else stays.
    return _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def _translate_config(text: str, paths: PathMap) -> str:
    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str) and value.startswith("/"):
            return paths.local(value)
        return value
    # The ConfigMap render.py wrote; read as strictly as the file it came from.
    return str(yaml.safe_dump(walk(strict_yaml.load(text)), sort_keys=False, allow_unicode=True))


def _replicated_job(rendered: Rendered, name: str) -> dict[str, Any] | None:
    return next((job for job in rendered.jobset["spec"]["replicatedJobs"] if job["name"] == name), None)


def _pod_template(rendered: Rendered) -> dict[str, Any]:
    """The gang's pod (the stage job's, when there is one, runs before it: plan_stage)."""
    job = _replicated_job(rendered, REPLICATED_JOB)
    if job is None:
        names = [job["name"] for job in rendered.jobset["spec"]["replicatedJobs"]]
        raise LocalRunError(f"expected a replicated job named {REPLICATED_JOB}, the JobSet has {names}")
    return cast(dict[str, Any], job["template"]["spec"]["template"]["spec"])


def plan_stage(rendered: Rendered, mounts: Mounts, warn: Callable[[str], None] = print) -> LocalPod | None:
    """The stage job's pod (model.source, data.source) as a local process, None without one. What it
    copies is on the shared volumes (spec.py), so the first pod's config and mounts serve."""
    job = _replicated_job(rendered, STAGE_JOB)
    if job is None:
        return None
    container = job["template"]["spec"]["template"]["spec"]["containers"][0]
    paths = mounts.for_pod(0, 0)
    name = f"{rendered.names.jobset}-{STAGE_JOB}-0-0"
    env = pod_env(container, 0, name, paths, {}, warn)
    argv = [paths.rewrite(_expand(arg, env)) for arg in container["command"] + container.get("args", [])]
    return LocalPod(name=name, index=0, argv=_launcher_argv(argv), env=env, paths=paths)


def mount_volumes(rendered: Rendered, output: Path, volume_dirs: dict[str, Path],
                  warn: Callable[[str], None] = print) -> Mounts:
    """Create the local directory of every shared volume; emptyDirs come per pod (`Mounts.for_pod`)."""
    pod = _pod_template(rendered)
    container = pod["containers"][0]
    sources = {v["name"]: v for v in pod.get("volumes", [])}
    unknown = sorted(set(volume_dirs) - set(sources))
    if unknown:
        raise LocalRunError(f"--volume {', '.join(unknown)}: no such volume; the pod has "
                            f"{', '.join(sorted(n for n in sources if n not in ('config', 'dshm', 'tmp', 'home')))}")
    mounts = Mounts(output=output)
    shutil.rmtree(output / "pods", ignore_errors=True)  # the emptyDirs of the last run's pods
    for mount in container.get("volumeMounts", []):
        name, source = mount["name"], sources[mount["name"]]
        if mount["mountPath"] == "/dev/shm" or mount["mountPath"] in SCRATCH_MOUNTS:
            continue  # the host's shared memory, /tmp and home serve the same purpose
        if "configMap" in source:
            mounts.config_mount = mount["mountPath"]
            mounts.config_text = rendered.configmap["data"][CONFIG_KEY]
            continue
        if name in volume_dirs:
            local = volume_dirs[name]
            if "emptyDir" in source:
                warn(f"--volume {name}: an emptyDir, which each pod gets its own of on a cluster; "
                     f"here every pod shares {local}, and keeps it across restarts")
        elif "emptyDir" in source:
            mounts.empty_dirs.append((mount["mountPath"], name, mount.get("subPath") or ""))
            continue
        elif "hostPath" in source:
            local = Path(source["hostPath"]["path"])  # already a path on this machine, the pods' one node
        else:  # a persistentVolumeClaim: one volume every pod mounts, kept across restarts
            local = output / "volumes" / name
        if mount.get("subPath"):
            local = local / mount["subPath"]
        local.mkdir(parents=True, exist_ok=True)
        mounts.shared.add(mount["mountPath"], local.resolve())
    return mounts


def _launcher_argv(argv: list[str]) -> list[str]:
    if argv[0] in _PYTHONS:
        return [sys.executable, *argv[1:]]
    module = _LAUNCHER_MODULES.get(argv[0])
    if module:
        return [sys.executable, "-m", module, *argv[1:]]
    found = shutil.which(argv[0], path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if not found:
        raise LocalRunError(f"the container runs '{argv[0]}', which is not installed here")
    return [found, *argv[1:]]


def pod_env(container: dict[str, Any], index: int, pod_name: str, paths: PathMap,
            fixed: dict[str, str], warn: Callable[[str], None]) -> dict[str, str]:
    """The container's env as the kubelet would resolve it, with `fixed` values replacing the launcher's."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        name = var["name"]
        if name in fixed:
            env[name] = fixed[name]
        elif "value" in var:
            env[name] = paths.rewrite(_expand(var["value"], env))
        else:
            ref = var.get("valueFrom", {})
            field_path = ref.get("fieldRef", {}).get("fieldPath", "")
            if COMPLETION_INDEX in field_path:
                env[name] = str(index)
            elif field_path == "metadata.name":
                env[name] = pod_name
            elif field_path == "spec.nodeName":
                env[name] = socket.gethostname()  # every local pod's one node
            elif name in os.environ:
                env[name] = os.environ[name]  # a secret the user exported locally
            else:
                kind = next(iter(ref), "valueFrom")
                warn(f"{name} comes from a {kind} on a cluster; export it to pass it to the local pods")
    for name, value in fixed.items():
        env.setdefault(name, value)
    return env


def plan_pods(rendered: Rendered, nodes: int, mounts: Mounts, hardware: Hardware, *, master_port: int,
              attempt: int, warn: Callable[[str], None] = print) -> list[LocalPod]:
    """One LocalPod per node, for restart attempt `attempt` of the set (each with new emptyDirs)."""
    container = _pod_template(rendered)["containers"][0]
    total_procs = nodes * hardware.procs_per_pod
    pods = []
    for index in range(nodes):
        name = rendered.names.pod_hostname(index)
        paths = mounts.for_pod(attempt, index)
        fixed = {
            "ROSETTA_MASTER_ADDR": "127.0.0.1",
            "ROSETTA_MASTER_PORT": str(master_port),
            "ROSETTA_NPROC_PER_NODE": str(hardware.procs_per_pod),
            RESTART_ATTEMPT_ENV: str(attempt),
        }
        if hardware.gpus_per_pod:
            first = index * hardware.gpus_per_pod
            fixed["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(hardware.gpus_per_pod))
        else:
            fixed["CUDA_VISIBLE_DEVICES"] = ""
        if "OMP_NUM_THREADS" not in os.environ:
            # Pods share this machine's cores; oversubscribed BLAS threads slow every rank down.
            fixed["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // total_procs))
        env = pod_env(container, index, name, paths, fixed, warn)
        argv = [paths.rewrite(_expand(arg, env)) for arg in container["command"] + container.get("args", [])]
        unresolved = sorted({m for arg in argv for m in _VAR_REF.findall(arg)})
        if unresolved:
            raise LocalRunError(f"the container command uses undefined variables: {', '.join(unresolved)}")
        pods.append(LocalPod(name=name, index=index, argv=_launcher_argv(argv), env=env, paths=paths))
    return pods


def plan_evaluation(job: dict[str, Any], mounts: Mounts, warn: Callable[[str], None] = print,
                    only: bool = False) -> LocalPod:
    """The after-training evaluation Job's pod (evaluation_job.render_evaluation_job) as a local process:
    the training's shared volumes and its trainer config (as pod 0 of the last attempt saw them).
    `only` (spec.mode evaluate): the Job is the whole run, with its own emptyDirs and config, and
    the GPUs the machine has when the spec asks for them."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    if only:
        paths = mounts.for_pod(0, 0)
    else:
        paths = PathMap(list(mounts.shared.mounts))
    if mounts.config_mount is not None and not only:
        paths.add(mounts.config_mount, (mounts.output / "config").resolve()
                  if (mounts.output / "config" / CONFIG_KEY).exists() else mounts.pod_dir(0, 0) / "config")
    cpu_only = any(e["name"] == "CUDA_VISIBLE_DEVICES" for e in container.get("env", []))
    env = pod_env(container, 0, job["metadata"]["name"], paths, {"CUDA_VISIBLE_DEVICES": ""} if cpu_only else {},
                  warn)
    argv = [paths.rewrite(_expand(arg, env)) for arg in container["command"] + container.get("args", [])]
    return LocalPod(name=job["metadata"]["name"], index=0, argv=_launcher_argv(argv), env=env, paths=paths)


def trainer_output(rendered: Rendered, paths: PathMap) -> Path:
    """Where rank 0 writes metrics, evaluations and the summary (the trainer's --output), locally:
    `paths` of the first pod (rank 0's), which differ per attempt when the output is an emptyDir."""
    env = {var["name"]: var.get("value") for var in _pod_template(rendered)["containers"][0].get("env", [])}
    return Path(paths.local(env["ROSETTA_OUTPUT"]))
