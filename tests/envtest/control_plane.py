"""A real Kubernetes control plane for tests: etcd + kube-apiserver (+ kube-controller-manager).

Binaries come from $KUBEBUILDER_ASSETS when set (the envtest convention: one folder holding
kube-apiserver, etcd, kubectl and optionally kube-controller-manager). Otherwise they are built once,
offline, from Debian's packages by build-control-plane.sh into
${ROSETTA_ENVTEST_CACHE:-~/.cache/rosetta/envtest}; later runs find them there.

Everything binds to 127.0.0.1 on free ports. The apiserver runs with RBAC and a static token file:
`admin` is in system:masters, so tests can create anything and still ask RBAC questions about other
subjects (SubjectAccessReview, or impersonation).

    with ControlPlane(find_assets()) as cp:
        cp.start_controller_manager()   # after installing CRDs: it discovers resources only every ~30 s
        subprocess.run([cp.kubectl, "--kubeconfig", cp.kubeconfig, "get", "ns"])
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

BUILD_SCRIPT = Path(__file__).with_name("build-control-plane.sh")
REQUIRED = ("kube-apiserver", "etcd")
OPTIONAL = ("kube-controller-manager", "kubectl")


class ControlPlaneError(RuntimeError):
    pass


@dataclass(frozen=True)
class Assets:
    kube_apiserver: Path
    etcd: Path
    kube_controller_manager: Optional[Path]
    kubectl: Optional[Path]
    origin: str  # where they came from, for error messages and skip reasons


def recipe() -> str:
    """The build recipe's version (RECIPE= in the script); the cache records the one it was built by."""
    match = re.search(r"^RECIPE=(\S+)", BUILD_SCRIPT.read_text(), re.M)
    return match.group(1) if match else ""


def cache_dir() -> Path:
    return Path(os.environ.get("ROSETTA_ENVTEST_CACHE") or "~/.cache/rosetta/envtest").expanduser()


def _pick(folder: Path, names: tuple[str, ...]) -> dict[str, Optional[Path]]:
    return {n: (folder / n if os.access(folder / n, os.X_OK) else None) for n in names}


def _assets(found: dict[str, Optional[Path]], origin: str) -> Assets:
    return Assets(found["kube-apiserver"], found["etcd"], found["kube-controller-manager"],
                  found["kubectl"], origin)


def find_assets(build: bool = True, log: Optional[Path] = None) -> Assets:
    """KUBEBUILDER_ASSETS if set (never mixed with other binaries: versions must match), else the
    cache, building it first when it is incomplete."""
    env = os.environ.get("KUBEBUILDER_ASSETS")
    if env:
        found = _pick(Path(env), REQUIRED + OPTIONAL)
        missing = [n for n in REQUIRED if found[n] is None]
        if missing:
            raise ControlPlaneError(f"KUBEBUILDER_ASSETS={env} lacks {', '.join(missing)}")
        return _assets(found, f"KUBEBUILDER_ASSETS={env}")

    folder = cache_dir()
    found = _pick(folder, REQUIRED + OPTIONAL)
    stamp = folder / ".recipe"
    current = stamp.read_text().strip() if stamp.exists() else ""
    if any(p is None for p in found.values()) or current != recipe():
        if not build:
            raise ControlPlaneError(f"no control plane built by the current recipe in {folder}; "
                                    f"run {BUILD_SCRIPT} {folder}")
        build_assets(folder, log)
        found = _pick(folder, REQUIRED + OPTIONAL)
    return _assets(found, str(folder))


def build_assets(folder: Path, log: Optional[Path] = None) -> None:
    log = log or folder.parent / "build-control-plane.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # pytest captures output; a silent five-minute pause would look like a hang.
    print(f"\nbuilding the test control plane into {folder} (first run only, ~5 min); log: {log}",
          file=sys.__stderr__, flush=True)
    started = time.monotonic()
    with open(log, "wb") as out:
        rc = subprocess.call([str(BUILD_SCRIPT), str(folder)], stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed (exit {rc}); last lines of {log}:\n{_tail(log)}")
    print(f"control plane built in {time.monotonic() - started:.0f} s", file=sys.__stderr__, flush=True)


# ------------------------------------------------------------------------------ helpers


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


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
    def __init__(self, assets: Assets, workdir: Optional[Path] = None):
        self.assets = assets
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
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubectl(self) -> Optional[str]:
        return str(self.assets.kubectl) if self.assets.kubectl else None

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

    def start_controller_manager(self) -> None:
        """Garbage collection (ownerReferences) and namespace deletion. Start it once the CRDs exist:
        it rediscovers API resources only every ~30 s, and children of unknown kinds are not collected."""
        if "kube-controller-manager" in self.procs:
            return
        if self.assets.kube_controller_manager is None:
            raise ControlPlaneError(f"no kube-controller-manager in {self.assets.origin}")
        self._spawn("kube-controller-manager", [
            str(self.assets.kube_controller_manager),
            f"--kubeconfig={self.kubeconfig}",
            "--controllers=garbagecollector,namespace",
            "--leader-elect=false",
            # No serving at all: nothing scrapes it, and fixed default ports would collide.
            "--port=0", "--secure-port=0",
            "--concurrent-gc-syncs=5",
        ])
        time.sleep(0.5)
        self._check_alive("kube-controller-manager")

    def stop_apiserver(self) -> None:
        """SIGTERM the kube-apiserver alone (etcd keeps the state), as a rolling upgrade does."""
        proc = self.procs.pop("kube-apiserver")
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

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
            proc = self.procs.pop(name)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
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
                raise ControlPlaneError("openssl is needed to make service-account keys (apt-get install openssl)")

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        self._spawn("etcd", [
            str(self.assets.etcd),
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
        self._spawn("kube-apiserver", [
            str(self.assets.kube_apiserver),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}", "--insecure-port=0",
            f"--cert-dir={w / 'certs'}",
            f"--token-auth-file={w / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={w / 'sa.pub'}",
            f"--service-account-signing-key-file={w / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            # No ServiceAccount controller runs, so pods would wait forever for their SA token.
            "--disable-admission-plugins=ServiceAccount",
            "--enable-priority-and-fairness=false",
        ])

    def _spawn(self, name: str, argv: list[str], env: Optional[dict] = None) -> None:
        # Appended to: a restarted server's log follows its predecessor's.
        log = open(self.workdir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, preexec_fn=_die_with_parent)
        log.close()

    def _check_alive(self, name: str) -> None:
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
                self._check_alive(name)
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
        # keeps TLS verification on (its SANs include 127.0.0.1 via --advertise-address).
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
        print(f"export KUBECONFIG={cp.kubeconfig}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
