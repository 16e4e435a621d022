"""A real Kubernetes control plane for tests: etcd + kube-apiserver (+ controller manager, scheduler).

The binaries are built once from Go modules by build-cluster.sh, at the versions pinned in
versions.env, into ${ROSETTA_CLUSTER_CACHE:-~/.cache/rosetta/cluster}; later runs find them there.
Binaries in $KUBEBUILDER_ASSETS (the envtest convention: one folder holding kube-apiserver, etcd,
kubectl, ...) are used instead of building those, and only the missing ones are built.

Everything binds to 127.0.0.1 on free ports, except that a cluster with a real node (node.py) puts the
apiserver on the node network's gateway address, the one address both the host and pods can reach. The apiserver runs with RBAC and a static token file:
`admin` is in system:masters, so tests can create anything and still ask RBAC questions about other
subjects (SubjectAccessReview, or impersonation).

    with ControlPlane(find_assets()) as cp:
        cp.start_controller_manager()   # after installing CRDs: it discovers resources only every ~30 s
        cp.start_scheduler()
        subprocess.run([cp.kubectl, "--kubeconfig", cp.kubeconfig, "get", "ns"])

controllers.py adds the JobSet controller, Kueue and kwok on top of it.
"""

from __future__ import annotations

import ctypes
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build-cluster.sh"
VERSIONS_FILE = HERE / "versions.env"
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl",
            "etcd", "jobset-controller", "kueue", "kwok", "helm", "containerd", "containerd-shim-runc-v2", "ctr", "runc",
            "coredns", "pause")


class ControlPlaneError(RuntimeError):
    pass


@dataclass(frozen=True)
class Assets:
    """The built cluster: bin/<binary> and manifests/<component>/ (CRDs, webhooks, kwok stages)."""

    folder: Path
    origin: str  # where they came from, for error messages

    def bin(self, name: str) -> Path:
        return self.folder / "bin" / name

    @property
    def manifests(self) -> Path:
        return self.folder / "manifests"


def versions() -> dict[str, str]:
    """versions.env as a dict: the pins every component is built at."""
    pairs = re.findall(r"^([A-Z_]+)=(\S+)", VERSIONS_FILE.read_text(), re.M)
    return dict(pairs)


def jobset_crd() -> Path:
    """The JobSet CRD of the pinned release: from the built cluster when there is one, else from the
    Go module itself (a download of seconds, no build), so unit tests need no cluster."""
    built = cache_dir() / "manifests" / "jobset" / "jobset.x-k8s.io_jobsets.yaml"
    if built.exists():
        return built
    module = f"sigs.k8s.io/jobset@{versions()['JOBSET_VERSION']}"
    go_cache = Path(os.environ.get("ROSETTA_GO_CACHE") or "~/.cache/rosetta/go").expanduser()
    env = {**os.environ, "GOMODCACHE": str(go_cache / "mod"), "GOFLAGS": "-mod=mod"}
    try:
        go = shutil.which("go") or "/usr/local/go/bin/go"  # where Go's own installer puts it
        out = subprocess.run([go, "mod", "download", "-json", module], env=env, capture_output=True, text=True,
                             timeout=300, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ControlPlaneError(f"cannot download {module} for its CRD (needs Go on PATH): {exc}") from exc
    folder = Path(re.search(r'"Dir": "([^"]+)"', out).group(1))
    return folder / "config" / "components" / "crd" / "bases" / "jobset.x-k8s.io_jobsets.yaml"


def cache_dir() -> Path:
    return Path(os.environ.get("ROSETTA_CLUSTER_CACHE") or "~/.cache/rosetta/cluster").expanduser()


def _complete(folder: Path) -> bool:
    stamp = folder / "versions.env"
    return (stamp.exists() and stamp.read_text() == VERSIONS_FILE.read_text()
            and all(os.access(folder / "bin" / b, os.X_OK) for b in BINARIES))


def find_assets(build: bool = True, log: Optional[Path] = None) -> Assets:
    """The cache, built (or completed from $KUBEBUILDER_ASSETS) first when it is not current."""
    folder = cache_dir()
    origin = str(folder)
    if os.environ.get("KUBEBUILDER_ASSETS"):
        origin += f" (with binaries from KUBEBUILDER_ASSETS={os.environ['KUBEBUILDER_ASSETS']})"
    if not _complete(folder):
        if not build:
            raise ControlPlaneError(f"no cluster built from {VERSIONS_FILE} in {folder}; "
                                    f"run {BUILD_SCRIPT} {folder}")
        build_assets(folder, log)
    return Assets(folder, origin)


def find_helm(log: Optional[Path] = None) -> Path:
    """helm from the cache, built alone when the cache is not complete: linting a chart needs no
    cluster, and where the cache is empty (a fresh machine's `make test-fast`) building all of one
    for it took longer than the test's timeout."""
    folder = cache_dir()
    if not _complete(folder):
        build_assets(folder, log, components=["helm"])
    return Assets(folder, str(folder)).bin("helm")


def build_assets(folder: Path, log: Optional[Path] = None, components: Optional[list[str]] = None) -> None:
    """Build (or complete) the cache; only `components` (build-cluster.sh's names) when given."""
    log = log or folder.parent / "build-cluster.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    what = ", ".join(components) if components else "the test cluster"
    how_long = "" if components else " (first run only, ~25 min on 2 cores)"
    # pytest captures output; a silent twenty-minute pause would look like a hang.
    print(f"\nbuilding {what} into {folder}{how_long}; log: {log}", file=sys.__stderr__, flush=True)
    started = time.monotonic()
    env = {**os.environ, "ROSETTA_CLUSTER_COMPONENTS": " ".join(components)} if components else None
    with open(log, "ab") as out:
        rc = subprocess.call([str(BUILD_SCRIPT), str(folder)], stdout=out, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed (exit {rc}); last lines of {log}:\n{_tail(log)}")
    print(f"{what} built in {time.monotonic() - started:.0f} s", file=sys.__stderr__, flush=True)


# ------------------------------------------------------------------------------ helpers


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def answers(url: str) -> bool:
    """Whether a plain-HTTP server answers `url` with 200 (a helper server's readiness)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_until(ready, what: str, timeout: float = 60, interval: float = 0.1) -> None:
    """Poll `ready()` until it is true; ControlPlaneError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{what} after {timeout:.0f} s")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # If pytest is killed (timeout, ^C twice), the servers must not outlive it holding ports and disk.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ControlPlane:
    def __init__(self, assets: Assets, workdir: Optional[Path] = None, address: str = "127.0.0.1"):
        self.assets = assets
        self.address = address
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="rosetta-envtest-"))
        self.token = secrets.token_hex(16)
        self.procs: dict[str, subprocess.Popen] = {}
        self.port = 0
        self.kubeconfig = self.workdir / "kubeconfig"
        self._etcd_url = ""

    # -------------------------------------------------------------------------- lifecycle

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def kubectl(self) -> str:
        return str(self.assets.bin("kubectl"))

    def __enter__(self) -> "ControlPlane":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 60) -> None:
        try:
            self._write_credentials()
            self._etcd_url = self._start_etcd()
            self._start_apiserver(self._etcd_url)
            self._wait_ready(timeout)
            self._write_kubeconfig()
        except BaseException:
            self.stop()
            raise

    def start_controller_manager(self, controllers: str = "*") -> None:
        """Every default controller (Job, garbage collector, namespace, service accounts, node
        lifecycle, ...). Start it once the CRDs exist: it rediscovers API resources only every ~30 s,
        and children of unknown kinds are not collected until then."""
        if "kube-controller-manager" in self.procs:
            return
        w = self.workdir
        self.spawn("kube-controller-manager", [
            str(self.assets.bin("kube-controller-manager")),
            f"--kubeconfig={self.kubeconfig}",
            f"--controllers={controllers}",
            "--leader-elect=false",
            # No serving at all: nothing scrapes it, and fixed default ports would collide.
            "--secure-port=0",
            "--concurrent-gc-syncs=5",
            # The default client limit (20 requests/s) makes the Job controller the bottleneck of a
            # burst of trainings (each Job is pod creates plus status updates); large clusters raise it.
            "--kube-api-qps=200", "--kube-api-burst=400",
            # Service-account tokens and the kube-root-ca.crt ConfigMap that every pod mounts.
            f"--service-account-private-key-file={w / 'sa.key'}",
            f"--root-ca-file={w / 'certs' / 'apiserver.crt'}",
            "--use-service-account-credentials=false",
            # Simulated nodes come and go with the tests; no cloud provider, no node IPAM.
            "--cluster-cidr=10.244.0.0/16", "--allocate-node-cidrs=false",
            "--node-monitor-grace-period=40s",
        ])
        time.sleep(0.5)
        self.check_alive("kube-controller-manager")

    def start_scheduler(self) -> None:
        if "kube-scheduler" in self.procs:
            return
        self.spawn("kube-scheduler", [
            str(self.assets.bin("kube-scheduler")),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
        ])
        time.sleep(0.5)
        self.check_alive("kube-scheduler")

    def stop_process(self, name: str, grace: float = 30) -> None:
        """SIGTERM one process, SIGKILL after `grace` seconds; the others keep running."""
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_apiserver(self) -> None:
        """SIGTERM the kube-apiserver alone (etcd keeps the state), as a rolling upgrade does."""
        self.stop_process("kube-apiserver")

    def start_apiserver(self, timeout: float = 60) -> None:
        """A new kube-apiserver on the same port, certificates and token: clients need no change."""
        self._start_apiserver(self._etcd_url, port=self.port)
        self._wait_ready(timeout)

    def restart_apiserver(self, down_for: float = 0.0, timeout: float = 60) -> None:
        self.stop_apiserver()
        time.sleep(down_for)
        self.start_apiserver(timeout)

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop_process(name, grace=10)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ---------------------------------------------------------------------------- pieces

    def _write_credentials(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "tokens.csv").write_text(f'{self.token},admin,admin,"system:masters"\n')
        key = self.workdir / "sa.key"
        # Service-account token signing keys: required flags since 1.20, and needed once tests
        # create tokens for the operator's ServiceAccount.
        for cmd in (["openssl", "genrsa", "-out", str(key), "2048"],
                    ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(self.workdir / "sa.pub")]):
            try:
                subprocess.run(cmd, check=True, capture_output=True)
            except FileNotFoundError:
                raise ControlPlaneError(
                    "openssl is needed to make service-account keys (apt-get install openssl)") from None

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        self.spawn("etcd", [
            str(self.assets.bin("etcd")),
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            # Test data is thrown away; fsync per write only slows every API call.
            "--unsafe-no-fsync",
        ], env={"ETCD_UNSUPPORTED_ARCH": os.uname().machine.replace("aarch64", "arm64")})
        return url

    def _start_apiserver(self, etcd_url: str, port: int = 0) -> None:
        self.port = port or free_port()
        w = self.workdir
        self.spawn("kube-apiserver", [
            str(self.assets.bin("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={self.address}", f"--advertise-address={self.address}",
            f"--secure-port={self.port}",
            f"--cert-dir={w / 'certs'}",
            f"--token-auth-file={w / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={w / 'sa.pub'}",
            f"--service-account-signing-key-file={w / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            # 10 s instead of 5 min before a pod on a lost node is evicted: node-failure tests.
            "--default-not-ready-toleration-seconds=10", "--default-unreachable-toleration-seconds=10",
            "--enable-priority-and-fairness=false",
            # Logs and exec reach a real node's kubelet by its address: test nodes have no DNS name.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
        ])

    def spawn(self, name: str, argv: list[str], env: Optional[dict] = None) -> None:
        # Appended to: a restarted server's log follows its predecessor's.
        log = open(self.workdir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, preexec_fn=_die_with_parent)
        log.close()

    def check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise ControlPlaneError(
                f"{name} exited with {proc.returncode}:\n{_tail(self.workdir / f'{name}.log')}")

    def _wait_ready(self, timeout: float) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        request = urllib.request.Request(f"{self.server}/readyz",
                                         headers={"Authorization": f"Bearer {self.token}"})
        deadline = time.monotonic() + timeout
        while True:
            for name in self.procs:
                self.check_alive(name)
            try:
                with urllib.request.urlopen(request, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"kube-apiserver not ready after {timeout} s:\n"
                                        f"{_tail(self.workdir / 'kube-apiserver.log')}")
            time.sleep(0.25)

    def _write_kubeconfig(self) -> None:
        # The apiserver's serving certificate is self-signed in --cert-dir; trusting it explicitly
        # keeps TLS verification on (its SANs include the address via --advertise-address).
        ca = self.workdir / "certs" / "apiserver.crt"
        cluster = (f"    certificate-authority: {ca}\n" if ca.exists()
                   else "    insecure-skip-tls-verify: true\n")
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: envtest\n  cluster:\n    server: {self.server}\n{cluster}"
            f"users:\n- name: admin\n  user:\n    token: {self.token}\n"
            "contexts:\n- name: envtest\n  context:\n    cluster: envtest\n    user: admin\n"
            "current-context: envtest\n")

    def logs(self, name: str, lines: int = 40) -> str:
        return _tail(self.workdir / f"{name}.log", lines)


if __name__ == "__main__":
    # `python tests/envtest/control_plane.py` builds (if needed) and serves until ^C: handy to poke at.
    with ControlPlane(find_assets()) as cp:
        cp.start_controller_manager()
        cp.start_scheduler()
        print(f"export KUBECONFIG={cp.kubeconfig}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
