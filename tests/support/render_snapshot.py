"""A golden snapshot of what the operator renders, to hold a refactoring of rendering to "no change".

    python tests/support/render_snapshot.py capture DIR   # before: record inputs and what they render
    python tests/support/render_snapshot.py check DIR     # after: render the same inputs again, compare

The inputs are every TranslationTraining in examples/ and manifests/examples/, and every spec that the
rendering tests (TESTS) give render() or render_evaluation_job(): those tests run once under this
module as a pytest plugin, which records each call's arguments (pickled, so a spec keeps what
model_fields_set says of it). Each input's output is written as canonical JSON (sorted keys), the
objects or the error a spec is refused with, so that `check` fails on any difference at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml")) + sorted((ROOT / "examples").glob("*.yaml"))
TESTS = [
    "tests/unit/operator/test_render.py", "tests/unit/operator/test_render_fault_tolerance.py", "tests/unit/operator/test_render_s3.py",
    "tests/unit/operator/test_render_tracking.py", "tests/unit/operator/test_staging_render.py",
    "tests/unit/operator/test_after_training_evaluation.py", "tests/unit/operator/test_evaluation_only.py",
    "tests/unit/operator/test_examples.py", "tests/unit/trainer/engine/test_preemption.py", "tests/unit/operator/test_checkpoint_dir_confinement.py",
    "tests/unit/contract/test_hostile_specs.py", "tests/unit/operator/test_handlers_scheduling.py",
    "tests/unit/operator/test_operator_settings.py", "tests/unit/operator/test_policy.py", "tests/unit/operator/test_default_image.py",
    "tests/unit/operator/test_node_health.py", "tests/unit/operator/test_attempt_logs.py", "tests/hostile",
]
# Where the plugin writes the calls it sees (set by `capture` for the pytest run it starts).
RECORD_ENV = "ROSETTA_RENDER_SNAPSHOT_RECORD"
ENTRY_POINTS = ("render", "render_evaluation_job")


def _save(directory: Path, function: str, args: tuple[Any, ...]) -> None:
    try:
        data = pickle.dumps((function, args))
    except Exception:  # a test's stand-in that does not pickle is no spec of ours
        return
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{function}-{hashlib.sha256(data).hexdigest()[:20]}.pkl").write_bytes(data)


def _recording(function: str, original: Callable[..., Any], directory: Path) -> Callable[..., Any]:
    names = ("name", "namespace", "spec", "owner")

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
        _save(directory, function, tuple(call))
        return original(*args, **kwargs)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


def _install_recorder() -> None:
    """Patch the entry points before any test module imports them by name."""
    directory = Path(os.environ[RECORD_ENV])
    import rosetta_operator.evaluation_job as evaluation_job
    import rosetta_operator.render as render

    render.render = _recording("render", render.render, directory)  # type: ignore[assignment]
    evaluation_job.render_evaluation_job = _recording(  # type: ignore[assignment]
        "render_evaluation_job", evaluation_job.render_evaluation_job, directory)


if os.environ.get(RECORD_ENV) and __name__ != "__main__":
    _install_recorder()


def _example_inputs(directory: Path) -> None:
    import yaml

    from rosetta_contract.spec import parse_training

    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "TranslationTraining":
                continue
            training = parse_training(doc, str(path))
            args = (training.metadata.name, training.metadata.namespace or "default", training.spec, None)
            for function in ENTRY_POINTS:
                _save(directory, function, args)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def _output(function: str, args: tuple[Any, ...]) -> Any:
    from rosetta_operator.evaluation_job import render_evaluation_job, required_evaluation_job
    from rosetta_operator.render import render

    try:
        if function == "render":
            rendered = render(*args)
            return {"names": dataclasses.asdict(rendered.names), "configmap": rendered.configmap,
                    "jobset": rendered.jobset, "objects": rendered.objects()}
        try:
            required: Any = required_evaluation_job(*args)
        except ValueError as exc:
            required = {"error": type(exc).__name__, "message": str(exc)}
        return {"job": render_evaluation_job(*args), "required": required}
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}


def _render_all(inputs: Path, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for path in sorted(inputs.glob("*.pkl")):
        function, args = pickle.loads(path.read_bytes())
        (out / f"{path.stem}.json").write_text(_canonical(_output(function, args)))
        count += 1
    return count


def capture(directory: Path) -> int:
    inputs = directory / "inputs"
    _example_inputs(inputs)
    env = {**os.environ, RECORD_ENV: str(inputs)}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "support.render_snapshot", "-p", "no:cacheprovider",
                            *TESTS], cwd=ROOT, env=env)
    count = _render_all(inputs, directory / "expected")
    print(f"captured {count} inputs into {directory} (tests exit {tests.returncode})")
    return tests.returncode


def check(directory: Path) -> int:
    actual = directory / "actual"
    count = _render_all(directory / "inputs", actual)
    differ = []
    for expected in sorted((directory / "expected").glob("*.json")):
        if expected.read_text() != (actual / expected.name).read_text():
            differ.append(expected.name)
    for name in differ:
        print(f"DIFFERS: {name} (diff -u {directory / 'expected' / name} {actual / name})")
    print(f"{count} inputs, {len(differ)} differ")
    return 1 if differ else 0


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("capture", "check"):
        print(__doc__)
        return 2
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "envtest")]
    return {"capture": capture, "check": check}[argv[0]](Path(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
