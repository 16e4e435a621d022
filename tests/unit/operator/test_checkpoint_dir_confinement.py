"""On a cluster a training's checkpoints stay in its own directory, <checkpoints mountPath>/<name>,
or on an emptyDir (the pod's own).

Trainings share a claim; the newest checkpoint under checkpoint.dir is resumed from and the older
ones pruned. The rule needs the training's name, so the operator's render (the reconcile,
`rosetta validate`, `render`, `run`) enforces it; `rosetta train` on one machine takes any dir.
"""

from __future__ import annotations

import copy

import pytest

from rosetta_contract.documents import parse_document
from rosetta_contract.spec import ConfigError, parse_spec
from rosetta_operator.render import render

TRAINER = {
    "model": {"architecture": "transformer", "size": "tiny"},
    "tokenizer": {"train": {"vocabSize": 500}},
    "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated", "size": 100}]},
    "training": {"maxSteps": 10},
}
PVC = {"persistentVolumeClaim": {"claimName": "efs"}}
RUNS = {"name": "runs", "mountPath": "/runs", "purpose": "checkpoints", **PVC}


def rendered_env(checkpoint_dir: str | None, volumes: list[dict] | None = None, name: str = "mt") -> dict:
    spec = parse_spec({**copy.deepcopy(TRAINER), "volumes": [RUNS] if volumes is None else volumes,
                       "checkpoint": {} if checkpoint_dir is None else {"dir": checkpoint_dir}})
    (job,) = render(name, "team", spec).jobset["spec"]["replicatedJobs"]
    (trainer,) = job["template"]["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in trainer["env"]}


@pytest.mark.parametrize("directory", [None, "ckpt", "nested/ckpt", "/runs/mt", "/runs/mt/ckpt", "/runs/mt/./ckpt",
                                       "/runs//mt/ckpt/"])
def test_a_dir_in_the_trainings_own_directory_renders(directory):
    assert rendered_env(directory)["ROSETTA_OUTPUT"] == "/runs/mt"


@pytest.mark.parametrize("directory", [
    "/runs/other/checkpoints",  # another training's, on the same claim
    "/runs/mt-old/checkpoints",  # a name that starts with this one's is another training too
    "/runs",  # every training's directory at once
    "/data/mt/checkpoints",  # another claim
    "/scratch/shared/other/checkpoints",  # a claim mounted inside an emptyDir
    "/tmp/ckpt",  # no volume of the spec (the operator's /tmp)
])
def test_an_absolute_dir_elsewhere_is_refused_naming_the_field_and_the_root(directory):
    volumes = [RUNS, {"name": "data", "mountPath": "/data", "purpose": "data", **PVC},
               {"name": "scratch", "mountPath": "/scratch", "emptyDir": {}},
               {"name": "shared", "mountPath": "/scratch/shared", **PVC}]
    with pytest.raises(ConfigError) as refused:
        rendered_env(directory, volumes)
    assert refused.value.errors == [("spec.checkpoint.dir", refused.value.errors[0][1])]
    message = refused.value.errors[0][1]
    assert "/runs/mt/" in message and directory in message


def test_a_dir_on_an_emptydir_is_the_pods_own():
    scratch = {"name": "scratch", "mountPath": "/scratch", "emptyDir": {}}
    assert rendered_env("/scratch/ckpt", [RUNS, scratch])["ROSETTA_OUTPUT"] == "/runs/mt"


def test_without_a_checkpoints_volume_the_root_is_the_scratch_output():
    assert rendered_env("/checkpoints/mt/ckpt", volumes=[])["ROSETTA_OUTPUT"] == "/checkpoints/mt"
    with pytest.raises(ConfigError, match=r"spec.checkpoint.dir: .*/checkpoints/mt/ .*/checkpoints/other/ckpt"):
        rendered_env("/checkpoints/other/ckpt", volumes=[])


@pytest.mark.parametrize("mount", ["/runs/mt", "/runs/mt/checkpoints"])
def test_a_volume_mounted_inside_the_trainings_directory_is_refused(mount):
    # Even the default relative dir would then be another claim's directory, maybe another
    # training's checkpoints: subPath reaches any directory of a claim.
    other = {"name": "other", "mountPath": mount, "subPath": "other/checkpoints", **PVC}
    with pytest.raises(ConfigError, match=rf"spec.volumes\[1\].mountPath: {mount} is inside this training's own "
                                          "directory /runs/mt"):
        rendered_env(None, [RUNS, other])


def test_a_volume_beside_the_trainings_directory_renders():
    other = {"name": "other", "mountPath": "/runs-cache/mt", **PVC}
    assert rendered_env(None, [RUNS, other])["ROSETTA_OUTPUT"] == "/runs/mt"


def test_a_long_dir_is_quoted_clipped_after_the_rule():
    with pytest.raises(ConfigError) as refused:
        rendered_env("/elsewhere/" + "d" * 3000)
    message = str(refused.value)
    assert message.index("/runs/mt/") < message.index("/elsewhere/") and len(message) < 1200


def test_rosetta_train_on_one_machine_takes_any_dir():
    document = parse_document({"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
                               "metadata": {"name": "mt"}, "spec": {**TRAINER, "checkpoint": {"dir": "/srv/ckpt"}}})
    assert document.spec.checkpoint.dir == "/srv/ckpt"
