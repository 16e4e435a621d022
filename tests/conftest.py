"""Control planes for the operator's tests, shared by every folder below tests/.

Here at the top of tests/ so that every folder (integration/, faults/, cluster/) shares one control
plane per kind per session: each is only started by the first test that asks for it.

`cluster`: etcd + kube-apiserver + kube-controller-manager with both CRDs (ours from crd.build_crd(),
JobSet's from the JobSet release that envtest/versions.env pins) and a kubernetes client logged in as
a system:masters admin. No JobSet controller runs here: these tests play it by patching JobSet
.status through its status subresource, to put the operator into states on purpose.

`live_cluster` (tests/cluster/conftest.py) runs the real JobSet controller, Kueue, the scheduler and
kwok nodes instead: there the controllers act, and nothing is played.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

import pytest
from packaging.version import Version

from control_plane import ControlPlaneError
from controllers import install_crds
from support import worker_groups
from support.cluster import Cluster, start_control_plane

# The image fixtures (a docker engine, the built images) serve tests/images, tests/cluster and the
# node tier alike, so every folder below gets them, as a plugin rather than as names imported here;
# so does the warm server every trainer a test starts is forked from (docs/testing.md).
pytest_plugins = ["support.images", "support.forked_trainers"]

# One intra-op thread per process: `make test` runs two workers on two cores, and torch would give
# each a thread per core, so that OpenMP's barriers wait on threads the other worker descheduled
# (the trainer's unit tests ran 24% longer so, measured). Every process a test starts inherits it, as
# the training tests' own launches already set it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# One compile thread for the same reason (inductor's default is a pool of fresh processes), for every
# process alike: read when torch._inductor's config is imported, so a trainer given another value than
# its pytest worker has could not be forked from the warm trainer server (support.forked_trainers).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

# DeepSpeed compiles its CPU Adam into torch's extension folder, one per op name: a checkout with its
# virtualenv at another path writes other include paths into the same build file, and ninja rebuilds
# it (minutes on two cores) each time the other checkout ran last. A folder per virtualenv keeps
# each one's build; every process the tests start inherits it.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(
    Path.home() / ".cache" / "torch_extensions" / f"venv-{hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]}"))


def _compile_through_ccache() -> None:
    """A new virtualenv (every clean clone) writes torch's headers and DeepSpeed's sources with new
    times, so ninja compiles the extensions again (2-4 minutes of both cores, in the middle of the
    run) although nothing in them changed. torch puts ccache in front of the compiler when it is on
    PATH, and ccache looks at content, not times: the objects come back from its cache and only the
    link runs. Not the working directory: each virtualenv builds in a folder of its own."""
    if shutil.which("ccache") or subprocess.run(
            ["bash", str(Path(__file__).parent / "support" / "compiler-cache.sh")],
            capture_output=True, timeout=600).returncode == 0:
        os.environ.setdefault("CCACHE_DIR", str(Path.home() / ".cache" / "rosetta" / "ccache"))
        os.environ.setdefault("CCACHE_NOHASHDIR", "1")


_compile_through_ccache()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    from rosetta_operator.crd import build_crd

    cp, assets = start_control_plane()
    try:
        install_crds(cp, assets, components=("jobset",), extra=[build_crd()])
        # After the CRDs: the garbage collector must know JobSets to collect them.
        cp.start_controller_manager()
        yield Cluster(cp)
    except ControlPlaneError as exc:
        pytest.fail(f"control plane: {exc}", pytrace=False)
    finally:
        cp.stop()


def point_kubernetes_client_at(kubeconfig: str) -> None:
    """The operator's startup hook and kopf's login call `load_kube_config()` with no file: the
    client library takes $KUBECONFIG, but reads it once, when it is first imported."""
    from kubernetes.config import kube_config

    os.environ["KUBECONFIG"] = kube_config.KUBE_CONFIG_DEFAULT_LOCATION = kubeconfig
    os.environ.pop("KUBERNETES_SERVICE_HOST", None)  # in-cluster config would win over KUBECONFIG


@pytest.fixture(scope="session", autouse=True)
def _restore_kubeconfig() -> Iterator[None]:
    """Whatever the tests point the client at, the rest of the session gets the user's setting back."""
    from kubernetes.config import kube_config

    saved_env = {k: os.environ.get(k) for k in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    saved_default = kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    yield
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = saved_default
    for key, value in saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    with cluster.test_namespace(request.node.name) as name:
        yield name


class Operator:
    """The operator in this process, exactly as `kopf run -m rosetta_operator.handlers` runs it.

    `start()` / `stop()` may be called more than once: a restart is a new KopfRunner, with new
    settings and memo, against the same API state.
    """

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.runner = None
        self.outputs: list[str] = []
        self.records = _Records()

    def start(self) -> None:
        from kopf.testing import KopfRunner

        assert self.runner is None, "the operator already runs"
        point_kubernetes_client_at(self.cluster.kubeconfig)
        self.records.records = []
        logging.getLogger("kopf.objects").addHandler(self.records)
        self.runner = KopfRunner(["run", "-A", "--standalone", "-m", "rosetta_operator.handlers"],
                                 timeout=30)
        self.runner.__enter__()

    def stop(self) -> None:
        runner, self.runner = self.runner, None
        if runner is None:
            return
        try:
            runner.__exit__(None, None, None)
        finally:
            logging.getLogger("kopf.objects").removeHandler(self.records)
        self.outputs.append(runner.output)
        assert runner.exit_code == 0, f"operator exited with {runner.exit_code}:\n{runner.output[-4000:]}"

    def messages(self, uid: str) -> list[str]:
        """What this run of the operator logged about one object."""
        return [r.getMessage() for r in list(self.records.records)
                if (getattr(r, "k8s_ref", None) or {}).get("uid") == uid]

    @property
    def running(self) -> bool:
        return self.runner is not None and self.runner._thread.is_alive()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[Operator]:
    op = Operator(cluster)
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """On a failure, the tail of every control-plane log goes into the report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        funcargs = getattr(item, "funcargs", {})
        cluster: Optional[Cluster] = funcargs.get("cluster") or funcargs.get("live_cluster")
        if hasattr(cluster, "logs"):  # not a test's own parameter that happens to be called `cluster`
            report.sections.append(("control plane logs", cluster.logs()))


CLUSTER_FIXTURES = ("cluster", "live_cluster", "node_cluster")
GROUP = pytest.StashKey[str]()  # a test's xdist group (support/worker_groups.py)


def pytest_configure(config: pytest.Config) -> None:
    # xdist groups by a suffix it writes into each node id, which pytest 9.2 no longer lets it write
    # (pytest-dev/pytest-xdist#1386): every worker would then start its own clusters, silently.
    if config.getoption("dist", "no") == "loadgroup" and Version(pytest.__version__) >= Version("9.2"):
        raise pytest.UsageError(f"--dist loadgroup does not group tests under pytest {pytest.__version__} "
                                "(pytest-dev/pytest-xdist#1386); install the pyproject.toml pin (pytest<9.2)")


# tryfirst: xdist's worker reads the xdist_group marks in its own pytest_collection_modifyitems.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test on a control plane is in the `cluster` tier (`make test-fast` leaves it out). The
    # first one pays for the control plane, which on a machine without cached binaries means
    # building them from source (about 25 minutes on two cores): give it room beyond the
    # suite-wide per-test timeout.
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if any(f in fixtures for f in CLUSTER_FIXTURES):
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.timeout(3600))
        group = worker_groups.group_of(fixtures, item.nodeid)
        item.add_marker(pytest.mark.xdist_group(group))
        item.stash[GROUP] = group
    # Stable: the rest keep their order, and a group's tests stay in theirs.
    items.sort(key=lambda item: worker_groups.rank(item.stash[GROUP]))
