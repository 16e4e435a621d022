"""The operator at scale: N TranslationTrainings against a real control plane.

Starts etcd + kube-apiserver (tests/envtest/control_plane.py; the cluster that
tests/envtest/versions.env pins, built on first use), installs the TranslationTraining CRD and the
JobSet CRD of the pinned release, runs `rosetta operator` as a separate process, then creates --count
trainings spread over --namespaces namespaces at --rate per second (in bursts of --burst) and measures:

- create→JobSet latency per training: from the create call returning to the JobSet's ADDED event
  on a cluster-wide JobSet watch started before the first create (p50/p90/p99/max);
- total wall time until every JobSet exists, and until every training has status.phase;
- the operator process's RSS (peak, sampled every 0.5 s; with all N live; after --settle seconds
  idle) and its CPU seconds (user+sys), plus the apiserver's and etcd's CPU seconds for context;
- correctness: exactly N JobSets (no duplicates, each owned by its training), N ConfigMaps, and
  status.phase on every training.

Without --live no controller runs, so the JobSets stay without status and the trainings stay Pending
(their steady state until the cluster schedules the gang): the operator's own cost. With --live the
whole stack acts as in tests/cluster: the controller manager (Job controller, garbage collector), the
scheduler, the JobSet controller with its webhooks and kwok nodes, and the bench also measures
create→all-pods-Running per training (from a cluster-wide pod watch) and the time until every training
is Running; the control plane's CPU is then reported per component (each namespace then gets the
template's PVCs, bound to hostPath volumes). The spec is the quickstart's (2 nodes, checkpoints on a
PVC, metrics.port 0); --spec-metrics-port 9400 gives every training a progress daemon too.

    .venv/bin/python bench/operator_scale.py                       # 1000 trainings, 1 namespace
    .venv/bin/python bench/operator_scale.py --live --output bench/results/operator_scale_live.json
    .venv/bin/python bench/operator_scale.py --count 200 --rate 20 --namespaces 4 --all-namespaces
    make bench-operator OPERATOR_BENCH_ARGS="--count 500"

Prints a JSON summary and writes it to --output (default bench/results/operator_scale.json).
Needs psutil (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "envtest"))
sys.path[:0] = [str(REPO / "contract"), str(REPO / "operator")]
sys.path.insert(0, str(REPO / "trainer"))

import psutil  # noqa: E402

from control_plane import ControlPlane, find_assets, free_port  # noqa: E402
from controllers import NodePool, install_crds, start_jobset, start_kwok  # noqa: E402

# Roomy simulated nodes: the bench measures the control loop, not bin-packing.
BENCH_POOL = NodePool("bench", {"cpu": "1000", "memory": "8000Gi", "pods": "500", "ephemeral-storage": "100Ti"},
                      {"node.kubernetes.io/instance-type": "bench"})
GROUP, VERSION, PLURAL = "rosetta.dev", "v1alpha1", "translationtrainings"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JS_GROUP, JS_VERSION, JS_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
SAMPLE_EVERY = 0.5


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> Optional[float]:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, int(-(-q * len(ordered) // 100)))  # ceil(q/100 * n)
    return ordered[min(rank, len(ordered)) - 1]


def ms(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x * 1000, 1)


def mib(n: Optional[int]) -> Optional[float]:
    return None if n is None else round(n / 2**20, 1)


# ------------------------------------------------------------------------------ cluster


def training_body(name: str, namespace: str, template: dict) -> dict:
    body = copy.deepcopy(template)
    body["metadata"] = {"name": name, "namespace": namespace}
    return body


def load_template(path: Path, nodes: int, metrics_port: int) -> dict:
    from rosetta_contract.documents import read_yaml

    doc = read_yaml(path)  # the TranslationTraining, also from a file that ships its PVC beside it
    doc["spec"]["nodes"] = nodes
    doc["spec"].setdefault("metrics", {})["port"] = metrics_port
    return doc


def bind_claims(core, namespace: str, template: dict, size: str = "1Gi") -> None:
    """The template's PVCs in `namespace`, each bound to a hostPath volume made for it, so that the
    scheduler places the pods (kwok runs them; nothing is mounted)."""
    for volume in template["spec"].get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if not claim:
            continue
        pv = f"{namespace}-{claim}"[:63]
        core.create_persistent_volume({"metadata": {"name": pv}, "spec": {
            "capacity": {"storage": size}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": f"/tmp/rosetta-pv/{pv}"},
            "claimRef": {"namespace": namespace, "name": claim}}})
        core.create_namespaced_persistent_volume_claim(namespace, {"metadata": {"name": claim}, "spec": {
            "accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
            "resources": {"requests": {"storage": size}}}})


class JobSetWatch(threading.Thread):
    """A cluster-wide watch on JobSets: the monotonic time of each object's first ADDED event."""

    def __init__(self, api_client):
        super().__init__(daemon=True, name="jobset-watch")
        import kubernetes

        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.watch = kubernetes.watch.Watch()
        self.added: dict[tuple[str, str], float] = {}
        self.added_count: dict[tuple[str, str], int] = {}
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.stopping = False
        self.restarts = 0
        listing = self.custom.list_cluster_custom_object(JS_GROUP, JS_VERSION, JS_PLURAL)
        self.resource_version = listing["metadata"]["resourceVersion"]
        self.ready = threading.Event()

    def run(self) -> None:
        while not self.stopping:
            try:
                stream = self.watch.stream(self.custom.list_cluster_custom_object, JS_GROUP, JS_VERSION,
                                           JS_PLURAL, resource_version=self.resource_version,
                                           timeout_seconds=3600, allow_watch_bookmarks=True)
                self.ready.set()
                for event in stream:
                    now = time.monotonic()
                    obj = event["object"]
                    meta = obj.get("metadata", {}) if isinstance(obj, dict) else {}
                    if meta.get("resourceVersion"):
                        self.resource_version = meta["resourceVersion"]
                    if event["type"] == "ADDED":
                        key = (meta["namespace"], meta["name"])
                        with self.changed:
                            self.added.setdefault(key, now)
                            self.added_count[key] = self.added_count.get(key, 0) + 1
                            self.changed.notify_all()
                    if self.stopping:
                        return
            except Exception as exc:  # a dropped stream: resume from the last version seen
                if self.stopping:
                    return
                self.restarts += 1
                log(f"JobSet watch restarted ({type(exc).__name__}: {exc})")
                time.sleep(0.2)

    def wait_for(self, keys: set, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not keys.issubset(self.added.keys()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
        return True

    def stop(self) -> None:
        self.stopping = True
        self.watch.stop()


class PodWatch(threading.Thread):
    """A cluster-wide watch on the trainings' pods: the monotonic time at which every pod of a
    JobSet was first Running at once."""

    def __init__(self, api_client, pods_per_jobset: int):
        super().__init__(daemon=True, name="pod-watch")
        import kubernetes

        self.core = kubernetes.client.CoreV1Api(api_client)
        self.watch = kubernetes.watch.Watch()
        self.want = pods_per_jobset
        self.running: dict[tuple[str, str], set[str]] = {}
        self.all_running: dict[tuple[str, str], float] = {}
        self.lock = threading.Lock()
        self.stopping = False
        self.resource_version = self.core.list_pod_for_all_namespaces(limit=1).metadata.resource_version
        self.ready = threading.Event()

    def run(self) -> None:
        while not self.stopping:
            try:
                stream = self.watch.stream(self.core.list_pod_for_all_namespaces, label_selector=JOBSET_NAME_LABEL,
                                           resource_version=self.resource_version, timeout_seconds=3600)
                self.ready.set()
                for event in stream:
                    now = time.monotonic()
                    pod = event["object"]
                    self.resource_version = pod.metadata.resource_version
                    key = (pod.metadata.namespace, pod.metadata.labels[JOBSET_NAME_LABEL])
                    with self.lock:
                        running = self.running.setdefault(key, set())
                        if event["type"] != "DELETED" and pod.status.phase == "Running":
                            running.add(pod.metadata.name)
                        else:
                            running.discard(pod.metadata.name)
                        if len(running) >= self.want:
                            self.all_running.setdefault(key, now)
                    if self.stopping:
                        return
            except Exception as exc:  # a dropped stream: resume from the last version seen
                if self.stopping:
                    return
                log(f"pod watch restarted ({type(exc).__name__}: {exc})")
                time.sleep(0.2)

    def wait_for(self, keys: set, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if keys.issubset(self.all_running.keys()):
                    return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        self.stopping = True
        self.watch.stop()


class Sampler(threading.Thread):
    """RSS and CPU of the operator (and the control plane's processes) every SAMPLE_EVERY seconds."""

    def __init__(self, pid: int, others: dict[str, int], t0: float):
        super().__init__(daemon=True, name="sampler")
        self.proc = psutil.Process(pid)
        self.others = {name: psutil.Process(p) for name, p in others.items()}
        self.t0 = t0
        self.peak_rss = 0
        self.timeline: list[dict] = []
        self.stopping = threading.Event()

    def sample(self) -> dict:
        mem = self.proc.memory_info()
        cpu = self.proc.cpu_times()
        self.peak_rss = max(self.peak_rss, mem.rss)
        return {"t": round(time.monotonic() - self.t0, 2), "rss": mem.rss,
                "cpu": round(cpu.user + cpu.system, 2), "threads": self.proc.num_threads()}

    def cpu_of(self, name: str) -> Optional[float]:
        try:
            cpu = self.others[name].cpu_times()
            return round(cpu.user + cpu.system, 2)
        except (KeyError, psutil.Error):
            return None

    def run(self) -> None:
        while not self.stopping.wait(SAMPLE_EVERY):
            try:
                self.timeline.append(self.sample())
            except psutil.Error:
                return


def wait_http(url: str, timeout: float, proc: subprocess.Popen, logfile: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"operator exited with {proc.returncode}:\n{tail(logfile)}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"operator metrics at {url} not up after {timeout} s:\n{tail(logfile)}")


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def scrape(url: str) -> dict[str, float]:
    """The operator's own rosetta_operator_* samples (name{labels} → value)."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("rosetta_operator_") and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            if "_bucket{" in key or key.endswith("_created") or "_created{" in key:
                continue
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


# --------------------------------------------------------------------------------- main


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1000, help="TranslationTrainings to create (default 1000)")
    ap.add_argument("--rate", type=float, default=20.0,
                    help="creates per second (default 20); 0: as fast as --create-threads allow")
    ap.add_argument("--burst", type=int, default=1,
                    help="create in bursts of this many at once, bursts spaced to keep --rate (default 1: steady)")
    ap.add_argument("--namespaces", type=int, default=1, help="spread the trainings over this many namespaces")
    ap.add_argument("--all-namespaces", action="store_true",
                    help="run the operator cluster-wide (default: one --namespace flag per namespace)")
    ap.add_argument("--nodes", type=int, default=2, help="spec.nodes of each training (default 2)")
    ap.add_argument("--spec-metrics-port", type=int, default=0,
                    help="spec.metrics.port (default 0 as in the quickstart: no progress daemon per training)")
    ap.add_argument("--template", type=Path, default=REPO / "examples" / "quickstart.yaml")
    ap.add_argument("--create-threads", type=int, default=4, help="client threads issuing creates")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for all JobSets and phases")
    ap.add_argument("--settle", type=float, default=40,
                    help="seconds to idle after everything is done before the last RSS sample "
                         "(past kopf's per-object worker idle timeout)")
    ap.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "operator_scale.json")
    ap.add_argument("--keep-logs", type=Path, help="copy the operator and control-plane logs here")
    ap.add_argument("--live", action="store_true",
                    help="run the controller manager, scheduler, JobSet controller and kwok nodes too, and "
                         "measure create→all-pods-Running")
    ap.add_argument("--kwok-nodes", type=int, default=8, help="with --live: simulated nodes (500 pods each)")
    args = ap.parse_args(argv)

    import kubernetes

    from rosetta_operator.crd import build_crd

    template = load_template(args.template, args.nodes, args.spec_metrics_port)
    namespaces = [f"bench-{i}" for i in range(args.namespaces)]
    warmup_ns = "bench-warmup"
    names = [(namespaces[i % len(namespaces)], f"tt-{i:05d}") for i in range(args.count)]

    assets = find_assets(build=True)
    workdir = Path(tempfile.mkdtemp(prefix="rosetta-bench-"))
    cp = ControlPlane(assets, workdir / "cp")
    operator: Optional[subprocess.Popen] = None
    watch: Optional[JobSetWatch] = None
    pod_watch: Optional[PodWatch] = None
    sampler: Optional[Sampler] = None
    try:
        log(f"starting the control plane ({assets.origin})")
        cp.start()
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = args.create_threads + 4
        api = kubernetes.client.ApiClient(cfg)
        core = kubernetes.client.CoreV1Api(api)
        custom = kubernetes.client.CustomObjectsApi(api)
        install_crds(cp, assets, components=("jobset",), extra=[build_crd()])
        if args.live:
            log("starting the controller manager, scheduler, JobSet controller and kwok")
            cp.start_controller_manager()
            cp.start_scheduler()
            start_jobset(cp, assets)
            start_kwok(cp, assets).add_nodes(BENCH_POOL, args.kwok_nodes)
        for ns in [warmup_ns, *namespaces]:
            core.create_namespace({"metadata": {"name": ns}})
            if args.live:  # the checkpoints PVC a training on more than one node needs
                bind_claims(core, ns, template)

        metrics_port = free_port()
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        env["KUBECONFIG"] = str(cp.kubeconfig)
        env["PYTHONUNBUFFERED"] = "1"
        scope = ["--all-namespaces"] if args.all_namespaces else \
            [a for ns in [warmup_ns, *namespaces] for a in ("--namespace", ns)]
        cmd = [sys.executable, "-m", "rosetta_cli", "operator", *scope,
               "--liveness-port", "0", "--metrics-port", str(metrics_port)]
        op_log = workdir / "operator.log"
        log(f"starting the operator: {' '.join(cmd[1:])}")
        with open(op_log, "wb") as out:
            operator = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, cwd=str(REPO))
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        wait_http(metrics_url, 120, operator, op_log)

        watch = JobSetWatch(api)
        watch.start()
        watch.ready.wait(30)
        if args.live:
            pod_watch = PodWatch(api, args.nodes)
            pod_watch.start()
            pod_watch.ready.wait(30)
        # One training first, in its own namespace: the operator's watches are up once it has a JobSet.
        started = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, warmup_ns, PLURAL,
                                               training_body("warmup", warmup_ns, template))
        if not watch.wait_for({(warmup_ns, "warmup")}, 120):
            raise RuntimeError(f"the operator made no JobSet for the warm-up training:\n{tail(op_log)}")
        warmup_latency = watch.added[(warmup_ns, "warmup")] - started
        time.sleep(2)
        log(f"operator ready (warm-up JobSet after {warmup_latency * 1000:.0f} ms); "
            f"creating {args.count} trainings at {args.rate or 'max'}/s in bursts of {args.burst}")

        t0 = time.monotonic()
        sampler = Sampler(operator.pid, {n: p.pid for n, p in cp.procs.items()}, t0)
        base = sampler.sample()
        base_cp_cpu = {n: sampler.cpu_of(n) for n in cp.procs}
        sampler.start()

        created: dict[tuple[str, str], float] = {}
        call_seconds: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()

        def create(key: tuple[str, str]) -> None:
            ns, name = key
            start = time.monotonic()
            try:
                custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, training_body(name, ns, template))
            except Exception as exc:  # noqa: BLE001  (counted, reported)
                with lock:
                    errors.append(f"{ns}/{name}: {exc}")
                return
            done = time.monotonic()
            with lock:
                created[key] = done
                call_seconds.append(done - start)

        behind = 0.0
        with concurrent.futures.ThreadPoolExecutor(args.create_threads) as pool:
            futures = []
            for first in range(0, args.count, args.burst):
                if args.rate > 0:
                    due = t0 + first / args.rate
                    wait = due - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    else:
                        behind = max(behind, -wait)
                futures += [pool.submit(create, k) for k in names[first:first + args.burst]]
            concurrent.futures.wait(futures)
        create_done = time.monotonic()
        log(f"{len(created)} created in {create_done - t0:.1f} s ({len(errors)} errors); waiting for JobSets")
        all_live = set(created)
        got_all = watch.wait_for(all_live, args.timeout)
        jobsets_done = time.monotonic()
        with watch.lock:
            added = dict(watch.added)
        log(f"JobSets: {sum(k in added for k in all_live)}/{len(all_live)} after {jobsets_done - t0:.1f} s")

        # Every training has a status.phase: the operator's status write follows the JobSet create.
        def phases() -> tuple[dict, list]:
            counts: dict[str, int] = {}
            missing = []
            for ns in namespaces:
                items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
                for item in items:
                    phase = (item.get("status") or {}).get("phase")
                    counts[phase or "<none>"] = counts.get(phase or "<none>", 0) + 1
                    if not phase:
                        missing.append(f"{ns}/{item['metadata']['name']}")
            return counts, missing

        deadline = time.monotonic() + max(60.0, args.timeout - (jobsets_done - t0))
        while True:
            phase_counts, no_phase = phases()
            if not no_phase or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        phases_done = time.monotonic()
        running_done, to_running = None, []
        if pod_watch is not None:
            pod_watch.wait_for(all_live, max(60.0, args.timeout - (phases_done - t0)))
            while True:  # and the operator has said so: every training Running
                phase_counts, _ = phases()
                if phase_counts.get("Running", 0) >= len(all_live) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            running_done = time.monotonic()
            with pod_watch.lock:
                to_running = [pod_watch.all_running[k] - created[k] for k in created if k in pod_watch.all_running]
            log(f"pods Running for {len(to_running)}/{len(all_live)} trainings after {running_done - t0:.1f} s")
        live = sampler.sample()
        live_cp_cpu = {n: sampler.cpu_of(n) for n in cp.procs}
        log(f"phases: {phase_counts} after {phases_done - t0:.1f} s; RSS {mib(live['rss'])} MiB; "
            f"settling {args.settle:.0f} s")
        time.sleep(args.settle)
        settled = sampler.sample()
        sampler.stopping.set()
        sampler.join()

        # Correctness: exactly N JobSets, one per training, owned by it; N ConfigMaps.
        jobsets, configmaps, unowned = [], 0, []
        for ns in namespaces:
            items = custom.list_namespaced_custom_object(JS_GROUP, JS_VERSION, ns, JS_PLURAL)["items"]
            jobsets += [(ns, j["metadata"]["name"]) for j in items]
            unowned += [f"{ns}/{j['metadata']['name']}" for j in items
                        if not any(r.get("kind") == "TranslationTraining"
                                   for r in j["metadata"].get("ownerReferences") or [])]
            configmaps += sum(1 for c in core.list_namespaced_config_map(ns).items
                              if c.metadata.name.endswith("-config"))
        duplicates = len(jobsets) - len(set(jobsets))
        multi_added = sum(1 for k, n in watch.added_count.items() if n > 1 and k in all_live)
        op_metrics = scrape(metrics_url)

        latencies = [added[k] - created[k] for k in created if k in added]
        summary: dict[str, Any] = {
            "date": datetime.date.today().isoformat(),
            "host": {"hostname": socket.gethostname(), "cpus": os.cpu_count(),
                     "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
                     "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                     "python": platform.python_version()},
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "params": {"count": args.count, "rate_per_s": args.rate, "burst": args.burst,
                       "namespaces": args.namespaces, "all_namespaces": args.all_namespaces,
                       "nodes": args.nodes, "spec_metrics_port": args.spec_metrics_port, "live": args.live,
                       "create_threads": args.create_threads},
            "operator_command": " ".join(["rosetta", *cmd[3:]]),
            "warmup_latency_ms": ms(warmup_latency),
            "created": len(created),
            "create_errors": len(errors),
            "create_error_examples": errors[:5],
            "create_call_ms": {"p50": ms(percentile(call_seconds, 50)), "p99": ms(percentile(call_seconds, 99)),
                               "max": ms(max(call_seconds, default=None))},
            "creator_max_behind_schedule_s": round(behind, 2),
            "create_to_jobset_ms": {
                "n": len(latencies),
                "min": ms(min(latencies, default=None)),
                "mean": ms(statistics.fmean(latencies)) if latencies else None,
                "p50": ms(percentile(latencies, 50)), "p90": ms(percentile(latencies, 90)),
                "p99": ms(percentile(latencies, 99)), "max": ms(max(latencies, default=None)),
            },
            "create_to_all_pods_running_ms": None if pod_watch is None else {
                "n": len(to_running),
                "p50": ms(percentile(to_running, 50)), "p90": ms(percentile(to_running, 90)),
                "p99": ms(percentile(to_running, 99)), "max": ms(max(to_running, default=None)),
            },
            "wall_s": {
                "creates": round(create_done - t0, 2),
                "all_jobsets": round(jobsets_done - t0, 2),
                "all_phases": round(phases_done - t0, 2),
                "all_running": None if running_done is None else round(running_done - t0, 2),
            },
            "operator_rss_mib": {
                "before": mib(base["rss"]), "peak": mib(sampler.peak_rss),
                "all_live": mib(live["rss"]), f"after_{args.settle:.0f}s_idle": mib(settled["rss"]),
            },
            "operator_threads": {"before": base["threads"], "all_live": live["threads"],
                                 "after_idle": settled["threads"]},
            "operator_cpu_s": {
                "during_run": round(live["cpu"] - base["cpu"], 2),
                "per_training_ms": round((live["cpu"] - base["cpu"]) / max(1, len(created)) * 1000, 2),
                "during_idle": round(settled["cpu"] - live["cpu"], 2),
                "total_incl_startup": settled["cpu"],
            },
            "control_plane_cpu_s_during_run": {
                n: (round(live_cp_cpu[n] - base_cp_cpu[n], 2)
                    if live_cp_cpu.get(n) is not None and base_cp_cpu.get(n) is not None else None)
                for n in cp.procs},
            "verify": {
                "all_jobsets_seen": got_all,
                "jobsets": len(jobsets), "unique_jobsets": len(set(jobsets)), "duplicates": duplicates,
                "jobsets_added_more_than_once": multi_added,
                "jobsets_without_owner": len(unowned),
                "configmaps": configmaps,
                "phases": phase_counts, "trainings_without_phase": len(no_phase),
                "ok": (got_all and len(created) == args.count and len(jobsets) == args.count
                       and duplicates == 0 and not unowned and not no_phase and configmaps == args.count
                       and (pod_watch is None or (len(to_running) == args.count
                                                  and phase_counts.get("Running", 0) == args.count))),
            },
            "operator_metrics": {k: v for k, v in op_metrics.items()
                                 if any(s in k for s in ("reconciles_total", "reconcile_errors_total",
                                                         "jobsets_created_total", "status_patches_total",
                                                         "reconcile_seconds_sum", "reconcile_seconds_count",
                                                         "trainings{"))},
            "watch_restarts": watch.restarts,
            "rss_timeline": [{"t": s["t"], "rss_mib": mib(s["rss"]), "cpu_s": s["cpu"]}
                             for s in sampler.timeline[::max(1, len(sampler.timeline) // 60)]],
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps({k: v for k, v in summary.items() if k != "rss_timeline"}, indent=2))
        log(f"written to {args.output}")
        return 0 if summary["verify"]["ok"] else 1
    finally:
        if sampler is not None:
            sampler.stopping.set()
        if watch is not None:
            watch.stop()
        if pod_watch is not None:
            pod_watch.stop()
        if operator is not None and operator.poll() is None:
            operator.terminate()
            try:
                operator.wait(15)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for f in [workdir / "operator.log", *(workdir / "cp").glob("*.log")]:
                if f.exists():
                    (args.keep_logs / f.name).write_bytes(f.read_bytes())
        cp.stop()
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
