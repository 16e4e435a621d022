"""`rosetta validate`, `rosetta render` and `rosetta crd`: exit codes and output."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rosetta_cli.main import main

ROOT = Path(__file__).resolve().parents[3]
GOOD = {
    "apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
    "metadata": {"name": "mt", "namespace": "ml"},
    "spec": {
        "model": {"architecture": "transformer", "size": "tiny"},
        "tokenizer": {"train": {"vocabSize": 500}},
        "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated", "size": 100}]},
        "training": {"maxSteps": 10},
        "nodes": 2, "gpusPerNode": 8, "network": {"profile": "eks-p5"},
        "volumes": [{"name": "runs", "mountPath": "/runs", "purpose": "checkpoints",
                     "persistentVolumeClaim": {"claimName": "efs-runs"}}],
    },
}


def write(tmp_path: Path, doc, name: str = "training.yaml") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return str(path)


def bad_doc() -> dict:
    doc = copy.deepcopy(GOOD)
    doc["spec"].update(nodes=0, launcher="mpirun", env=[{"name": "MASTER_ADDR", "value": "x"}],
                       volumes=[{"name": "n", "mountPath": "/n", "hostPath": {"path": "/mnt"}}])
    doc["spec"]["training"]["batch"] = {"tokens": 10, "sentences": 2}
    return doc


def test_validate_valid_file_exits_0_with_a_summary(tmp_path, capsys):
    assert main(["validate", "-f", write(tmp_path, GOOD)]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("ok: mt: 2 nodes x 8 GPUs per node (world size 16)")
    assert "network eks-p5" in out and "JobSet mt" in out
    assert len(out.splitlines()) == 1


def test_validate_lists_every_error_by_field_path_and_exits_2(tmp_path, capsys):
    path = write(tmp_path, bad_doc())
    assert main(["validate", "-f", path]) == 2
    err = capsys.readouterr().err
    assert f"invalid TranslationTraining in {path} (5 errors)" in err
    for line in ["spec.nodes: Input should be greater than or equal to 1",
                 "spec.launcher: Input should be 'torchrun' or 'deepspeed'",
                 "spec.env[0].name: MASTER_ADDR is set by the launcher; remove it",
                 "spec.volumes[0].hostPath: hostPath volumes are not allowed",
                 "spec.training.batch: set exactly one of 'tokens' or 'sentences'"]:
        assert f"\n  {line}" in err, line


def test_validate_accepts_host_path_when_allowed(tmp_path, capsys):
    doc = copy.deepcopy(GOOD)
    doc["spec"]["volumes"].append({"name": "n", "mountPath": "/n", "hostPath": {"path": "/mnt"}})
    path = write(tmp_path, doc)
    assert main(["validate", "-f", path]) == 2
    assert main(["validate", "-f", path, "--allow-host-path"]) == 0


SHARED = "a training on 2 nodes needs its checkpoints on storage every pod shares"
RWX = "(ReadWriteMany: EFS, Filestore, NFS)"


@pytest.mark.parametrize("volumes, overrides, expected", [
    ([{"name": "scratch", "mountPath": "/scratch", "purpose": "checkpoints", "emptyDir": {}}], [],
     f"spec.volumes: {SHARED}: volume 'scratch' (purpose: checkpoints) is an emptyDir, which each pod gets its "
     f"own of; use a persistentVolumeClaim {RWX}"),
    ([{"name": "nvme", "mountPath": "/nvme", "purpose": "checkpoints", "hostPath": {"path": "/mnt/nvme"}}],
     ["--allow-host-path"],
     f"spec.volumes: {SHARED}: volume 'nvme' (purpose: checkpoints) is a hostPath, a directory of whichever node "
     f"each pod runs on; use a persistentVolumeClaim {RWX}"),
    ([], [],
     f"spec.volumes: {SHARED}, and no volume has purpose: checkpoints, so the run would write to an emptyDir at "
     f"/checkpoints that each pod gets its own of; add a volume with purpose: checkpoints on a persistentVolumeClaim "
     f"{RWX}, e.g. {{name: checkpoints, mountPath: /checkpoints, purpose: checkpoints, persistentVolumeClaim: "
     f"{{claimName: NAME}}}}"),
    (GOOD["spec"]["volumes"] + [{"name": "scratch", "mountPath": "/scratch", "emptyDir": {}}],
     ["--set", "spec.checkpoint.dir=/scratch/ckpt"],
     f"spec.checkpoint.dir: {SHARED}: /scratch/ckpt is not on a persistentVolumeClaim volume; use a relative path "
     f"(under the checkpoints volume) or one under such a volume's mountPath"),
])
def test_validate_refuses_checkpoints_that_the_pods_of_a_multi_node_training_cannot_share(
        tmp_path, capsys, volumes, overrides, expected):
    doc = copy.deepcopy(GOOD)
    doc["spec"]["volumes"] = volumes
    path = write(tmp_path, doc)
    assert main(["validate", "-f", path, *overrides]) == 2
    err = capsys.readouterr().err
    assert err == f"error: invalid TranslationTraining in {path}: {expected}\n"
    # one node may keep its checkpoints where it likes
    assert main(["validate", "-f", path, *overrides, "--set", "spec.nodes=1"]) == 0


def test_the_installed_command_refuses_unshared_checkpoints_without_a_traceback(tmp_path):
    rosetta = Path(sys.executable).with_name("rosetta")
    if not rosetta.exists():
        pytest.skip("the rosetta console script is not installed")
    doc = copy.deepcopy(GOOD)
    doc["spec"]["volumes"] = [{"name": "scratch", "mountPath": "/scratch", "purpose": "checkpoints", "emptyDir": {}}]
    got = subprocess.run([str(rosetta), "validate", "-f", write(tmp_path, doc)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=60)
    assert got.returncode == 2 and got.stdout == ""
    assert "spec.volumes: a training on 2 nodes needs its checkpoints on storage every pod shares: volume 'scratch'" \
        in got.stderr
    assert "Traceback" not in got.stderr


def test_validate_and_render_take_the_training_out_of_a_file_that_also_holds_its_claim(tmp_path, capsys):
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "efs-runs"},
             "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}
    path = write(tmp_path, yaml.safe_dump_all([claim, GOOD]))
    assert main(["validate", "-f", path]) == 0
    assert capsys.readouterr().out.startswith("ok: mt: 2 nodes")
    assert main(["render", "-f", path]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)] == ["ConfigMap", "JobSet"]


def test_validate_overrides_and_render_only_errors(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    assert main(["validate", "-f", path, "--set", "spec.gpusPerNode=4"]) == 0
    assert "4 GPUs per node (world size 8)" in capsys.readouterr().out
    # a name that fits one node's pod names but not the 11th node's is only found when rendering
    assert main(["validate", "-f", path, "--set", "spec.nodes=11", "--set", "metadata.name=" + "a" * 48]) == 2
    assert "metadata.name: too long for 11 nodes" in capsys.readouterr().err


@pytest.mark.parametrize("content, path_in_error", [
    ("spec: [unclosed", "(yaml)"),
    ("a: 1\n---\nb: 2\n", "(file)"),
    ("- just a list\n", "(document)"),
])
def test_validate_unreadable_files(tmp_path, capsys, content, path_in_error):
    path = write(tmp_path, content)
    assert main(["validate", "-f", path]) == 2
    err = capsys.readouterr().err
    # One error, one line: the field, or where in the file for one that was not read.
    prefix = f"error: invalid TranslationTraining in {path}: "
    assert err.startswith(prefix) and err.count("\n") == 1, err
    if path_in_error == "(yaml)":
        assert err[len(prefix):].startswith("line 2, column 1: did not find expected")
    elif path_in_error == "(document)":
        assert err[len(prefix):].startswith("(document): ")


def test_validate_missing_file(tmp_path, capsys):
    assert main(["validate", "-f", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_render_prints_the_configmap_and_the_jobset(tmp_path, capsys):
    assert main(["render", "-f", write(tmp_path, GOOD)]) == 0
    configmap, jobset = yaml.safe_load_all(capsys.readouterr().out)
    assert (configmap["kind"], configmap["metadata"]["name"], configmap["metadata"]["namespace"]) == (
        "ConfigMap", "mt-config", "ml")
    assert (jobset["kind"], jobset["metadata"]["name"], jobset["metadata"]["namespace"]) == ("JobSet", "mt", "ml")
    assert yaml.safe_load(configmap["data"]["training.yaml"])["spec"]["nodes"] == 2


def test_render_namespace_and_overrides(tmp_path, capsys):
    assert main(["render", "-f", write(tmp_path, GOOD), "-n", "other", "--set", "spec.suspend=true"]) == 0
    configmap, jobset = yaml.safe_load_all(capsys.readouterr().out)
    assert configmap["metadata"]["namespace"] == jobset["metadata"]["namespace"] == "other"
    assert jobset["spec"]["suspend"] is True


def test_render_refuses_an_invalid_file(tmp_path, capsys):
    assert main(["render", "-f", write(tmp_path, bad_doc())]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "spec.nodes" in captured.err


def test_crd_prints_the_committed_manifest(capsys):
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == (ROOT / "manifests" / "crd.yaml").read_text()


@pytest.mark.slow  # ~7 s: the console script, a process per case
def test_installed_command_exit_codes(tmp_path):
    # The console script end to end, as a user or CI runs it.
    rosetta = Path(sys.executable).with_name("rosetta")
    if not rosetta.exists():
        pytest.skip("the rosetta console script is not installed")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    ok = subprocess.run([str(rosetta), "validate", "-f", write(tmp_path, GOOD)],
                        capture_output=True, text=True, env=env, timeout=60)
    bad = subprocess.run([str(rosetta), "validate", "-f", write(tmp_path, bad_doc(), "bad.yaml")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert (ok.returncode, bad.returncode) == (0, 2), (ok.stderr, bad.stderr)
    assert ok.stdout.startswith("ok: mt") and "spec.nodes" in bad.stderr
