"""The Dockerfile (checked as text; tests/images builds and runs it) and build_and_push.sh (--dry-run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = (REPO / "Dockerfile").read_text()
SCRIPT = REPO / "build_and_push.sh"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _lines() -> list[str]:
    """Instructions with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def _args() -> dict[str, str]:
    return dict(re.match(r"ARG (\w+)=(\S+)", line).groups() for line in _lines()
                if re.match(r"ARG \w+=", line))


def stages() -> dict[str, list[str]]:
    """{stage name: its instructions, FROM first}."""
    out: dict[str, list[str]] = {}
    current = None
    for line in _lines():
        m = re.match(r"FROM (\S+) AS (\S+)", line, re.I)
        if m:
            current = m.group(2)
            out[current] = [line]
        elif current:
            out[current].append(line)
    return out


def base_image(stage: str) -> str:
    ref = re.match(r"FROM (\S+)", stages()[stage][0]).group(1)
    return re.sub(r"\$\{(\w+)\}", lambda m: _args()[m.group(1)], ref)


def test_dockerfile_has_the_two_image_targets_on_pinned_bases():
    assert {"trainer", "operator"} <= set(stages())
    assert base_image("trainer") == base_image("operator") == "python:3.11-slim-bookworm"
    for stage in stages():
        image = base_image(stage)
        assert ":" in image and not image.endswith(":latest"), f"{stage}: {image} is not pinned"
    assert "latest" not in DOCKERFILE


def test_dockerfile_builds_with_no_registry_but_the_bases():
    """Every base is a build argument (tests/images builds on a base made from Debian's packages);
    no `# syntax=` frontend image to pull and no BuildKit-only instruction."""
    for stage, lines in stages().items():
        assert re.match(r"FROM \$\{\w+\} AS ", lines[0]), f"{stage}: {lines[0]} is not a build argument"
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE, re.M | re.I)
    assert "--mount" not in DOCKERFILE
    # The classic builder builds every stage before the target: the small operator comes first.
    assert list(stages()).index("operator") < list(stages()).index("trainer")


@pytest.mark.parametrize("stage, entrypoint", [("trainer", '["rosetta"]'), ("operator", '["rosetta", "operator"]')])
def test_images_run_as_a_non_root_user_with_the_rosetta_entrypoint(stage, entrypoint):
    lines = stages()[stage]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users, f"{stage}: no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"{stage} runs as {users[-1]}"
    assert f"ENTRYPOINT {entrypoint}" in lines


def _constraints() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    pins = [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]
    return dict(pin.split("==") for pin in pins)


def test_one_torch_pin_and_one_constraints_file_for_image_and_ci():
    pins = _constraints()
    assert {"transformers", "tokenizers", "deepspeed", "accelerate"} <= set(pins), pins
    assert "torch" not in pins  # torch is TORCH, below
    # A pin is of a dependency or of an extra's (ctranslate2: [export]).
    extras = [r for reqs in PYPROJECT["project"]["optional-dependencies"].values() for r in reqs]
    declared = {_name(r): r for r in [*extras, *PYPROJECT["project"]["dependencies"]]}
    from packaging.requirements import Requirement
    for name, version in pins.items():
        assert Requirement(declared[name]).specifier.contains(version), f"{name}=={version} vs {declared[name]}"

    makefile = (REPO / "Makefile").read_text()
    torch = re.search(r"^TORCH\s*\?=\s*(\S+)", makefile, re.M).group(1)
    assert _args()["TORCH"] == torch, "the Dockerfile's and the Makefile's torch differ"
    installs = [line for line in makefile.splitlines() if "$(PIP) install" in line and "--upgrade pip" not in line]
    assert installs and all("-c $(CONSTRAINTS)" in line for line in installs), installs
    # Compiled once at install: uv leaves bytecode to the first import, which writes nothing where
    # PYTHONDONTWRITEBYTECODE is set, and then every process compiles torch's sources again.
    assert all("--compile-bytecode" in line for line in installs), installs
    # The installer itself is pinned, so that a clean clone resolves as the last one did.
    assert re.search(r"^UV\s*\?=\s*uv==[\d.]+$", makefile, re.M)
    # mypy's cache outside the checkout: out of the images' build context, shared by clean clones.
    assert PYPROJECT["tool"]["mypy"]["cache_dir"].startswith("~/"), PYPROJECT["tool"]["mypy"]["cache_dir"]
    assert re.search(r"^CONSTRAINTS\s*:?=\s*constraints\.txt$", makefile, re.M)
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for mentioned in re.findall(r"torch==[\w.+]+", doc.read_text()):
            assert mentioned == torch, f"{doc.name} says {mentioned}, the pin is {torch}"


def test_the_installed_trainer_stack_is_compiled_to_bytecode():
    """What the install lines' flag is for, in the environment the tests run in: a module with no
    cached bytecode is compiled again by every process that imports it, when PYTHONDONTWRITEBYTECODE
    keeps the first import from writing it (12 of a trainer process's 26 s to its first step)."""
    import importlib.util

    for name in ("torch", "transformers", "sympy", "deepspeed"):
        origin = importlib.util.find_spec(name).origin
        assert Path(importlib.util.cache_from_source(origin)).exists(), f"{name} is not compiled: {origin}"


def test_trainer_image_installs_the_pinned_torch_with_the_constraints():
    runs = " ".join(line for line in stages()["trainer"] if line.startswith("RUN "))
    assert "deepspeed" in runs
    assert "COPY constraints.txt /etc/rosetta/constraints.txt" in stages()["trainer"]
    installs = re.findall(r"pip install ([^&]*)", runs)
    assert installs and all("-c /etc/rosetta/constraints.txt" in cmd for cmd in installs), installs
    # torch only as the TORCH argument, in every install (pip keeps it while resolving the rest).
    assert all('"${TORCH}"' in cmd for cmd in installs), installs
    assert not any(re.search(r"(^|\s)\"?torch[<>=\"\s]", cmd) for cmd in installs), "torch is TORCH only"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def wheel_extras(stage: str) -> set[str]:
    """The extras an image stage installs the wheel with: `"$(ls /tmp/dist/*.whl)[a,b]"`, a build
    argument's default (`[${TRAINER_EXTRAS}]`) read as its value."""
    runs = " ".join(line for line in stages()[stage] if line.startswith("RUN "))
    runs = re.sub(r"\$\{(\w+)\}", lambda m: _args().get(m.group(1), m.group(0)), runs)
    found = re.findall(r"/tmp/dist/\*\.whl\)\[([\w,]+)\]", runs)
    assert len(found) == 1, f"the {stage} image installs the wheel once, with its extras: {found}"
    return set(found[0].split(","))


def test_the_trainer_images_third_party_layer_installs_what_its_wheel_then_asks_for():
    """A change to the sources rebuilds only the wheel's layer: the extras' packages come before it,
    from pyproject.toml, with the same TRAINER_EXTRAS, and the compiler before both."""
    stage = stages()["trainer"]
    assert "ARG TRAINER_EXTRAS" in stage
    order = [next(i for i, line in enumerate(stage) if marker in line)
             for marker in ("apt-get install", "COPY pyproject.toml", "-r /tmp/requirements.txt",
                            "COPY --from=wheel", "/tmp/dist/*.whl)[${TRAINER_EXTRAS}]")]
    assert order == sorted(order), stage
    layer = next(line for line in stage if "-r /tmp/requirements.txt" in line)
    assert "os.environ['TRAINER_EXTRAS']" in " ".join(stage) and "-c /etc/rosetta/constraints.txt" in layer


def test_the_operator_image_installs_its_extra_with_the_constraints_and_every_dependency_is_pinned():
    """A rebuild of the operator image gets the versions CI tested, not whatever PyPI has that day."""
    stage = stages()["operator"]
    assert "COPY constraints.txt /etc/rosetta/constraints.txt" in stage
    installs = [line for line in stage if "pip install" in line and "[operator]" in line]
    assert installs and all("-c /etc/rosetta/constraints.txt" in cmd for cmd in installs), installs
    pins = _constraints()
    required = PYPROJECT["project"]["optional-dependencies"]["operator"] + PYPROJECT["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in required}
    assert names - set(pins) == set(), "unpinned in constraints.txt"


def test_each_image_installs_the_package_with_the_extras_of_what_it_runs():
    # No dependency list copied by hand into the Dockerfile: pyproject.toml's extras are the lists.
    assert wheel_extras("operator") == {"operator"}
    assert wheel_extras("trainer") == {"trainer", "deepspeed", "s3", "tracking", "export"}
    for stage in ("operator", "trainer"):
        runs = " ".join(line for line in stages()[stage] if line.startswith("RUN "))
        assert "--no-deps" not in runs
    # The operator's extra holds no part of the trainer's stack, and the core none of either.
    assert not {"torch", "transformers", "tensorboard", "matplotlib"} & {_name(r) for r in EXTRAS["operator"]}
    assert {_name(r) for r in PYPROJECT["project"]["dependencies"]} == {"pydantic", "pyyaml"}
    # make install sets up a developer for every command: every extra but the benchmark's.
    makefile = (REPO / "Makefile").read_text()
    installed = re.search(r"-e '\.\[([\w,]+)\]'", makefile).group(1).split(",")
    assert set(installed) == set(EXTRAS) - {"bench"}


def _imports(*extras: str) -> set[str]:
    """Import names of an extra's distributions (and of some of their own dependencies)."""
    names = {_name(r).replace("-", "_") for extra in extras for r in EXTRAS[extra]}
    renamed = {"pyyaml": "yaml", "python_dateutil": "dateutil", "rouge_score": "rouge_score",
               "mlflow_skinny": "mlflow"}
    return {renamed.get(n, n) for n in names}


def blocked_run(blocked: set[str], code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter in which importing any of `blocked` fails, as in an image
    that does not install them."""
    # None in sys.modules is how Python marks a module as not importable: `import` raises
    # ModuleNotFoundError and importlib.util.find_spec answers None, as for one never installed
    # (transformers asks find_spec whether jinja2 is there).
    prelude = f"""
import sys
BLOCKED = set({sorted(blocked)!r})
for name in BLOCKED:
    sys.modules[name] = None
"""
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


# What the trainer's stack brings besides its own names (dateutil: the Kubernetes client needs it too).
TRAINER_ONLY = _imports("trainer", "deepspeed", "s3", "tracking", "export") - _imports("operator") - {"dateutil"} \
    | {"numpy", "sklearn", "scipy", "safetensors", "huggingface_hub", "botocore"}


def test_operator_modules_import_without_the_trainer_stack():
    """What the operator image runs imports nothing the image lacks: torch and the trainer's other
    dependencies are blocked while `rosetta operator`'s modules load."""
    assert {"torch", "transformers", "boto3", "deepspeed"} <= TRAINER_ONLY
    out = blocked_run(TRAINER_ONLY, """
import rosetta_cli.main, rosetta_trainer.commands.cli, rosetta_contract.config, rosetta_operator.main, rosetta_operator.handlers
import rosetta_operator.cli
assert sys.modules["torch"] is None  # still blocked: nothing imported it
""")
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.slow  # ~17 s: a training in a fresh process
def test_a_training_runs_without_the_operator_the_s3_client_or_deepspeed(tmp_path):
    """The trainer image has no [operator]; `pip install 'rosetta-mt[trainer]'` has no [s3] or
    [deepspeed] either: a DDP training without an S3 mirror needs none of them (one that sets
    scheduling.affinity included), `rosetta --help` neither, and a DeepSpeed spec is told what to
    install."""
    import yaml

    from support.training import TINY, deep_update

    # prometheus_client and dateutil: the trainer's stack needs them too (telemetry, matplotlib).
    blocked = _imports("operator", "s3", "deepspeed") - {"prometheus_client", "dateutil"} | {"botocore"}
    assert {"kopf", "kubernetes", "jinja2", "boto3", "deepspeed"} <= blocked
    config = tmp_path / "training.yaml"
    # An affinity too: the contract checks it against the core/v1 types, which must not need the client.
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}}
    config.write_text(yaml.safe_dump(deep_update(TINY, {"spec": {"training": {"maxSteps": 2},
                                                                 "evaluation": {"interval": 2},
                                                                 "scheduling": {"affinity": affinity}}})))
    out = blocked_run(blocked, f"""
from rosetta_cli.main import main
assert main(["train", "-f", {str(config)!r}, "--output", {str(tmp_path / "run")!r}, "--no-progress"]) == 0
assert not [m for m in BLOCKED if sys.modules.get(m) is not None]
try:
    main(["--help"])
except SystemExit as exc:
    assert exc.code == 0
""", timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()

    deepspeed = tmp_path / "deepspeed.yaml"
    deepspeed.write_text(yaml.safe_dump(deep_update(TINY, {"spec": {"distributed": {"backend": "deepspeed"}}})))
    out = blocked_run(blocked, f"""
from rosetta_cli.main import main
sys.exit(main(["train", "-f", {str(deepspeed)!r}, "--output", {str(tmp_path / "ds")!r}, "--no-progress"]))
""", timeout=600)
    assert out.returncode != 0 and "pip install 'rosetta-mt[deepspeed]'" in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr


# ------------------------------------------------------------------------ build_and_push.sh


def dry_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PROJECT_ID", "REGION", "REPO_NAME", "IMAGE_NAME", "TAG", "AWS_ACCOUNT_ID",
                          "AWS_REGION", "REGISTRY", "TARGETS", "PLATFORM", "DOCKER", "HELM", "BUILD_ARGS")}
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=30)


def test_artifact_registry_dry_run():
    out = dry_run({"PROJECT_ID": "my-proj", "REGION": "us-central1", "REPO_NAME": "ml", "IMAGE_NAME": "rosetta",
                   "TAG": "0.1.0"})
    assert out.returncode == 0, out.stderr
    prefix = "us-central1-docker.pkg.dev/my-proj/ml"
    assert out.stdout.splitlines() == [
        "gcloud auth configure-docker us-central1-docker.pkg.dev --quiet",
        f"docker build --platform linux/amd64 --target trainer --tag {prefix}/rosetta-trainer:0.1.0 {REPO}",
        f"docker push {prefix}/rosetta-trainer:0.1.0",
        f"docker build --platform linux/amd64 --target operator --tag {prefix}/rosetta-operator:0.1.0 {REPO}",
        f"docker push {prefix}/rosetta-operator:0.1.0",
    ]


def test_ecr_dry_run():
    out = dry_run({"AWS_ACCOUNT_ID": "123456789012", "AWS_REGION": "us-east-1", "REPO_NAME": "ml", "TAG": "v2"})
    assert out.returncode == 0, out.stderr
    host = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    assert out.stdout.splitlines() == [
        f"aws ecr get-login-password --region us-east-1 | docker login --username AWS --password-stdin {host}",
        f"docker build --platform linux/amd64 --target trainer --tag {host}/ml/rosetta-trainer:v2 {REPO}",
        f"docker push {host}/ml/rosetta-trainer:v2",
        f"docker build --platform linux/amd64 --target operator --tag {host}/ml/rosetta-operator:v2 {REPO}",
        f"docker push {host}/ml/rosetta-operator:v2",
    ]


def test_build_args_are_passed_to_every_build():
    base = "rosetta-test/python:3.11-bookworm"
    out = dry_run({"REGISTRY": "127.0.0.1:5000", "TAG": "test", "TARGETS": "operator",
                   "BUILD_ARGS": f" PYTHON_IMAGE={base}\n TORCH=torch==2.13.0 "})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"docker build --platform linux/amd64 --build-arg PYTHON_IMAGE={base} --build-arg TORCH=torch==2.13.0 "
        f"--target operator --tag 127.0.0.1:5000/rosetta-operator:test {REPO}",
        "docker push 127.0.0.1:5000/rosetta-operator:test",
    ]
    bad = dry_run({"REGISTRY": "r", "TAG": "t", "BUILD_ARGS": "PYTHON_IMAGE"})
    assert bad.returncode != 0 and "BUILD_ARGS" in bad.stderr


def test_the_chart_is_pushed_as_an_oci_artifact_beside_the_images():
    out = dry_run({"AWS_ACCOUNT_ID": "123456789012", "AWS_REGION": "us-east-1", "REPO_NAME": "ml", "TAG": "v0.2.0",
                   "TARGETS": "operator chart"})
    assert out.returncode == 0, out.stderr
    host = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    assert out.stdout.splitlines()[-3:] == [
        f"aws ecr get-login-password --region us-east-1 | helm registry login --username AWS --password-stdin {host}",
        f"helm package {REPO}/charts/rosetta --version 0.2.0 --app-version v0.2.0 --destination {REPO}/dist",
        f"helm push {REPO}/dist/rosetta-0.2.0.tgz oci://{host}/ml/charts",
    ]
    # Refused before any image is built: a chart needs a SemVer version.
    bad = dry_run({"REGISTRY": "ghcr.io/org", "TAG": "latest", "TARGETS": "trainer chart"})
    assert bad.returncode != 0 and bad.stdout == "" and "TAG 'latest' is not a SemVer version" in bad.stderr


def test_the_distribution_has_a_name_of_its_own_and_the_docs_install_it():
    """`rosetta` on PyPI is an unrelated package: every install line names ours."""
    assert PYPROJECT["project"]["name"] == "rosetta-mt"
    sources = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "trainer").rglob("*.py"),
               *(REPO / "operator").rglob("*.py"), *(REPO / "contract").rglob("*.py"),
               *(REPO / "cli").rglob("*.py"), *(REPO / "examples").rglob("*.py")]
    wrong = [f"{path.relative_to(REPO)}: {m.group(0)}" for path in sources
             for m in re.finditer(r"(?:pip|pipx|uv pip) install ['\"]?rosetta(?![-\w])\S*", path.read_text())]
    assert not wrong, wrong


@pytest.mark.parametrize("env, missing", [
    ({"PROJECT_ID": "p", "REGION": "r", "TAG": "1"}, "REPO_NAME"),
    ({"PROJECT_ID": "p", "REPO_NAME": "ml", "TAG": "1"}, "REGION"),
    ({"AWS_ACCOUNT_ID": "1", "REPO_NAME": "ml", "TAG": "1"}, "AWS_REGION"),
    ({"AWS_ACCOUNT_ID": "1", "AWS_REGION": "us-east-1", "REPO_NAME": "ml"}, "TAG"),
    ({}, "PROJECT_ID"),
])
def test_missing_variable_is_named(env, missing):
    out = dry_run(env)
    assert out.returncode != 0 and out.stdout == ""
    assert missing in out.stderr, out.stderr


def test_dockerignore_keeps_the_context_to_the_sources():
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "*" in ignore  # everything out (.venv, runs/, caches) …
    assert {"!pyproject.toml", "!README.md", "!constraints.txt", "!trainer/", "!operator/"} <= set(ignore)  # … but the sources


def test_every_python_package_of_the_sources_goes_into_the_wheel():
    # setuptools' `packages` list is not recursive: a sub-package left out (rosetta_operator.local,
    # which is `rosetta run`) is missing from every installed copy while the tests, run from the
    # checkout, still pass.
    setuptools = PYPROJECT["tool"]["setuptools"]
    found = set()
    for top, directory in setuptools["package-dir"].items():
        for init in (REPO / directory).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / directory).parts
            found.add(".".join((top, *parts)))
    assert found and found == set(setuptools["packages"])


def test_the_pre_commit_hooks_run_what_make_lint_and_typecheck_run():
    import yaml

    hooks = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    makefile = (REPO / "Makefile").read_text()
    recipes = [line.strip().replace("$(VENV)", ".venv") for target in ("lint", "typecheck")
               for line in re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.M).group(1).splitlines()]
    assert [hook["entry"] for hook in hooks] == recipes


def test_the_readme_layout_table_matches_the_folders():
    """Every package folder pyproject.toml installs has its row in the README's Layout, and every
    folder a row names exists: the table is how a newcomer finds the layers."""
    layout = (REPO / "README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+/)`", layout, flags=re.M)
    package_dirs = {f"{path}/" for path in PYPROJECT["tool"]["setuptools"]["package-dir"].values()}
    assert package_dirs <= set(rows), sorted(package_dirs - set(rows))
    assert all((REPO / row).is_dir() for row in rows), [row for row in rows if not (REPO / row).is_dir()]
    # The contract and the command line sit beside the two sides, not inside either.
    assert {path.split("/")[0] for path in package_dirs} == {"contract", "cli", "operator", "trainer"}


def test_the_kubectl_plugin_and_the_chart_say_how_they_are_installed():
    """kubectl finds a plugin as any `kubectl-NAME` on PATH: the distribution installs one, the README
    says with what and why there is no krew manifest, and helm.md installs the chart from the OCI
    registry build_and_push.sh pushes it to (tests/unit/project/test_chart_images.py checks that reference)."""
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts["kubectl-rosetta"] == scripts["rosetta"]
    install = (REPO / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "pipx install 'rosetta-mt[operator]'" in install and "kubectl-rosetta" in install
    assert "krew" in install, "the README says why there is no krew manifest"
    assert "rosetta completion bash" in install
    assert re.search(r"^helm install rosetta oci://\S+/charts/rosetta --version ", (REPO / "docs" / "helm.md").read_text(),
                     re.M)
