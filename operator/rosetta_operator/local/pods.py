"""Turn the rendered JobSet into local processes: one `LocalPod` per pod of the replicated job.

The pod template is used as the kubelet would use it: the container's command with `$(VAR)`
expanded from its env, the env resolved (node rank from the job completion index), and
every volume mounted. A process cannot mount directories, so mounts become a path map:
each container path under a mount is rewritten to the local directory behind it, in the
env, in the command and in the ConfigMap's trainer config (data and checkpoint paths in
the YAML usually point into mounted volumes).

What differs from a cluster is explicit and small: the master address is 127.0.0.1 with a
free port, /dev/shm is the host's, GPUs are the ones this machine has (see `fit_hardware`),
and volumes are local directories (by default under the run's output dir, shared by all
pods and kept across restarts, like a PVC).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from rosetta_operator.render import COMPLETION_INDEX, CONFIG_KEY, SCRATCH_MOUNTS, Rendered

# JobSet exposes the restart count of the gang on every pod; the trainer reports it.
RESTART_ATTEMPT_ENV = "ROSETTA_RESTART_ATTEMPT"
_VAR_REF = re.compile(r"\$\((\w+)\)")
# Launchers that the container image has on its PATH, mapped to this interpreter's modules,
# so the same command works from a virtualenv that is not activated.
_LAUNCHER_MODULES = {"torchrun": "torch.distributed.run", "deepspeed": "deepspeed.launcher.runner"}


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    return yaml.safe_dump(walk(yaml.safe_load(text)), sort_keys=False, allow_unicode=True)


def _pod_template(rendered: Rendered) -> dict:
    jobs = rendered.jobset["spec"]["replicatedJobs"]
    if len(jobs) != 1:
        raise LocalRunError(f"expected one replicated job, the JobSet has {len(jobs)}")
    return jobs[0]["template"]["spec"]["template"]["spec"]


def mount_volumes(rendered: Rendered, output: Path, volume_dirs: dict[str, Path]) -> PathMap:
    """Create the local directory of every volume and write the ConfigMap into its own."""
    pod = _pod_template(rendered)
    container = pod["containers"][0]
    sources = {v["name"]: v for v in pod.get("volumes", [])}
    unknown = sorted(set(volume_dirs) - set(sources))
    if unknown:
        raise LocalRunError(f"--volume {', '.join(unknown)}: no such volume; the pod has "
                            f"{', '.join(sorted(n for n in sources if n not in ('config', 'dshm', 'tmp', 'home')))}")
    paths = PathMap()
    config_dir: Path | None = None
    for mount in container.get("volumeMounts", []):
        name, source = mount["name"], sources[mount["name"]]
        if mount["mountPath"] == "/dev/shm" or mount["mountPath"] in SCRATCH_MOUNTS:
            continue  # the host's shared memory, /tmp and home serve the same purpose
        if "configMap" in source:
            config_dir = output / "config"
            local = config_dir
        elif name in volume_dirs:
            local = volume_dirs[name]
        elif "hostPath" in source:
            local = Path(source["hostPath"]["path"])  # already a path on this machine
        else:
            local = output / "volumes" / name
        if mount.get("subPath"):
            local = local / mount["subPath"]
        local.mkdir(parents=True, exist_ok=True)
        paths.add(mount["mountPath"], local.resolve())
    if config_dir is not None:
        text = rendered.configmap["data"][CONFIG_KEY]
        (config_dir / CONFIG_KEY).write_text(_translate_config(text, paths))
    return paths


def _launcher_argv(argv: list[str]) -> list[str]:
    module = _LAUNCHER_MODULES.get(argv[0])
    if module:
        return [sys.executable, "-m", module, *argv[1:]]
    found = shutil.which(argv[0], path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if not found:
        raise LocalRunError(f"the container runs '{argv[0]}', which is not installed here")
    return [found, *argv[1:]]


def pod_env(container: dict, index: int, pod_name: str, paths: PathMap,
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
            elif name in os.environ:
                env[name] = os.environ[name]  # a secret the user exported locally
            else:
                kind = next(iter(ref), "valueFrom")
                warn(f"{name} comes from a {kind} on a cluster; export it to pass it to the local pods")
    for name, value in fixed.items():
        env.setdefault(name, value)
    return env


def plan_pods(rendered: Rendered, nodes: int, paths: PathMap, hardware: Hardware, *, master_port: int,
              attempt: int, warn: Callable[[str], None] = print) -> list[LocalPod]:
    """One LocalPod per node, for restart attempt `attempt` of the set."""
    container = _pod_template(rendered)["containers"][0]
    total_procs = nodes * hardware.procs_per_pod
    pods = []
    for index in range(nodes):
        name = rendered.names.pod_hostname(index)
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
        pods.append(LocalPod(name=name, index=index, argv=_launcher_argv(argv), env=env))
    return pods


def trainer_output(rendered: Rendered, paths: PathMap) -> Path:
    """Where rank 0 writes metrics, evaluations and the summary (the trainer's --output), locally."""
    env = {var["name"]: var.get("value") for var in _pod_template(rendered)["containers"][0].get("env", [])}
    return Path(paths.local(env["ROSETTA_OUTPUT"]))
