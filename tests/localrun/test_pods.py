"""The rendered pod as a local process: env, command, mounts and the ConfigMap, without running it."""

import sys
from pathlib import Path

import pytest
import yaml

from rosetta_contract.spec import parse_training
from rosetta_operator.local.pods import (
    LocalRunError,
    fit_hardware,
    mount_volumes,
    plan_pods,
    trainer_output,
)
from rosetta_operator.local.runner import parse_volume_args
from rosetta_operator.render import render
from support.training import SHARED_CHECKPOINTS, TINY, deep_update

SCRATCH = {"name": "scratch", "mountPath": "/scratch", "emptyDir": {}}


def rendered_for(patch: dict):
    training = parse_training(deep_update(TINY, {"spec": patch}))
    return training.spec, render(training.metadata.name, "default", training.spec)


def test_each_pod_gets_its_rank_the_local_master_and_the_launcher_command(tmp_path):
    spec, rendered = rendered_for({"nodes": 3, "volumes": SHARED_CHECKPOINTS})
    mounts = mount_volumes(rendered, tmp_path, {})
    hw = fit_hardware(spec.nodes, spec.gpus_per_node, spec.procs, available_gpus=0)
    pods = plan_pods(rendered, spec.nodes, mounts, hw, master_port=29555, attempt=2, warn=pytest.fail)

    assert [p.name for p in pods] == ["tiny-node-0-0", "tiny-node-0-1", "tiny-node-0-2"]
    assert [p.env["ROSETTA_NODE_RANK"] for p in pods] == ["0", "1", "2"]
    for pod in pods:
        assert pod.env["ROSETTA_MASTER_ADDR"] == "127.0.0.1" and pod.env["ROSETTA_MASTER_PORT"] == "29555"
        assert pod.env["ROSETTA_RESTART_ATTEMPT"] == "2"
        assert pod.env["CUDA_VISIBLE_DEVICES"] == ""
        # the launcher from this interpreter (it runs torchrun), every $(VAR) expanded the way the kubelet does it
        assert pod.argv[:4] == [sys.executable, "-m", "rosetta_trainer.launch", "torchrun"]
        assert "--nnodes=3" in pod.argv and f"--node-rank={pod.index}" in pod.argv
        assert "--master-addr=127.0.0.1" in pod.argv and "--master-port=29555" in pod.argv
        assert not any("$(" in arg for arg in pod.argv)
    # container paths became local ones: the config file (one for all: it names no emptyDir) and the
    # checkpoints PVC, the same directory for every pod
    for pod in pods:
        assert pod.argv[pod.argv.index("-f") + 1] == str(tmp_path.resolve() / "config" / "training.yaml")
        assert trainer_output(rendered, pod.paths) == tmp_path.resolve() / "volumes" / "runs" / "tiny"
        assert pod.env["ROSETTA_OUTPUT"] == str(trainer_output(rendered, pod.paths))


def test_each_pod_gets_its_own_empty_dirs_new_at_each_restart_and_shares_only_the_claim(tmp_path):
    spec, rendered = rendered_for({
        "nodes": 2, "volumes": [*SHARED_CHECKPOINTS, SCRATCH],
        # a config path into the emptyDir: each pod reads its own
        "tokenizer": {"train": None, "path": "/scratch/tokenizer"},
    })
    mounts = mount_volumes(rendered, tmp_path, {})
    hw = fit_hardware(2, 0, 1, available_gpus=0)
    first = plan_pods(rendered, 2, mounts, hw, master_port=1, attempt=0, warn=pytest.fail)
    again = plan_pods(rendered, 2, mounts, hw, master_port=1, attempt=1, warn=pytest.fail)

    root = tmp_path.resolve()
    scratch = {(a, p.index): Path(p.paths.local("/scratch")) for a, pods in enumerate((first, again)) for p in pods}
    assert scratch == {(a, i): root / "pods" / f"attempt-{a}" / f"pod-{i}" / "scratch" for a in (0, 1) for i in (0, 1)}
    assert all(path.is_dir() for path in scratch.values())
    # the claim: one directory for both pods and both attempts
    assert {p.paths.local("/runs/tiny") for p in first + again} == {str(root / "volumes" / "runs" / "tiny")}
    # the trainer config points each pod into its own emptyDir
    for attempt, pods in enumerate((first, again)):
        for pod in pods:
            config = Path(pod.argv[pod.argv.index("-f") + 1])
            assert config == root / "pods" / f"attempt-{attempt}" / f"pod-{pod.index}" / "config" / "training.yaml"
            tokenizer = yaml.safe_load(config.read_text())["spec"]["tokenizer"]["path"]
            assert tokenizer == str(scratch[attempt, pod.index] / "tokenizer")
    assert not (root / "config").exists()


def test_one_pod_without_a_checkpoints_volume_writes_to_a_new_empty_dir_each_attempt(tmp_path):
    _, rendered = rendered_for({})
    mounts = mount_volumes(rendered, tmp_path, {})
    hw = fit_hardware(1, 0, 1, available_gpus=0)
    outputs = [trainer_output(rendered, plan_pods(rendered, 1, mounts, hw, master_port=1, attempt=a,
                                                  warn=pytest.fail)[0].paths) for a in (0, 1)]
    # as on a cluster: the restarted pod has a new emptyDir and starts over
    assert outputs == [tmp_path.resolve() / "pods" / f"attempt-{a}" / "pod-0" / "output" / "tiny" for a in (0, 1)]
    # ... and so does the pod of a new run into the same output directory
    (outputs[0] / "summary.json").parent.mkdir(parents=True)
    (outputs[0] / "summary.json").write_text("{}")
    mounts = mount_volumes(rendered, tmp_path, {})
    assert not (tmp_path / "pods").exists()
    pod = plan_pods(rendered, 1, mounts, hw, master_port=1, attempt=0, warn=pytest.fail)[0]
    assert trainer_output(rendered, pod.paths) == outputs[0] and not outputs[0].exists()


def test_a_volume_given_a_directory_is_that_directory_for_every_pod_and_an_empty_dir_says_so(tmp_path):
    _, rendered = rendered_for({"volumes": [SCRATCH]})
    warnings = []
    mounts = mount_volumes(rendered, tmp_path / "run", {"scratch": tmp_path / "mine"}, warn=warnings.append)
    assert warnings == [f"--volume scratch: an emptyDir, which each pod gets its own of on a cluster; here every "
                        f"pod shares {tmp_path / 'mine'}, and keeps it across restarts"]
    pods = plan_pods(rendered, 2, mounts, fit_hardware(2, 0, 1, 0), master_port=1, attempt=0, warn=pytest.fail)
    assert {p.paths.local("/scratch") for p in pods} == {str((tmp_path / "mine").resolve())}


def test_a_host_path_is_the_host_directory_for_every_pod(tmp_path):
    training = parse_training(deep_update(TINY, {"spec": {"volumes": [
        {"name": "nvme", "mountPath": "/nvme", "hostPath": {"path": str(tmp_path / "host")}}]}}),
        allow_host_path=True)
    rendered = render("tiny", "default", training.spec)
    mounts = mount_volumes(rendered, tmp_path / "run", {})
    pods = plan_pods(rendered, 2, mounts, fit_hardware(2, 0, 1, 0), master_port=1, attempt=0, warn=pytest.fail)
    assert {p.paths.local("/nvme/x") for p in pods} == {str(tmp_path / "host" / "x")}


def test_the_configmap_reaches_the_pods_with_mounted_paths_rewritten(tmp_path):
    data_dir = tmp_path / "corpus"
    spec, rendered = rendered_for({
        "volumes": [{"name": "data", "purpose": "data", "mountPath": "/data",
                     "persistentVolumeClaim": {"claimName": "corpus"}, "readOnly": True}],
        "data": {"train": [{"format": "pairs", "source": "/data/train.en", "target": "/data/train.de"}]},
    })
    mounts = mount_volumes(rendered, tmp_path / "run", parse_volume_args([f"data={data_dir}"]))
    hw = fit_hardware(1, 0, 1, 0)
    pod = plan_pods(rendered, 1, mounts, hw, master_port=1, attempt=0, warn=pytest.fail)[0]
    written = yaml.safe_load((tmp_path / "run" / "config" / "training.yaml").read_text())
    source = written["spec"]["data"]["train"][0]
    assert source["source"] == str(data_dir.resolve() / "train.en")
    assert source["target"] == str(data_dir.resolve() / "train.de")
    assert written["spec"]["training"]["maxSteps"] == TINY["spec"]["training"]["maxSteps"]
    assert data_dir.is_dir()
    assert pod.env["ROSETTA_DATA_DIR"] == str(data_dir.resolve())


def test_unknown_volume_names_are_refused(tmp_path):
    _, rendered = rendered_for({})
    with pytest.raises(LocalRunError, match="--volume nope: no such volume; the pod has output"):
        mount_volumes(rendered, tmp_path, parse_volume_args([f"nope={tmp_path}"]))
    with pytest.raises(LocalRunError, match="NAME=LOCAL_DIR"):
        parse_volume_args(["just-a-path"])


@pytest.mark.parametrize("nodes, gpus, available, expected", [
    (2, 0, 0, (0, 1, False)),       # CPU spec: procs per node as asked
    (2, 4, 8, (4, 4, False)),       # enough GPUs
    (2, 4, 2, (1, 1, True)),        # fewer: spread what exists, and say so
    (2, 8, 0, (0, 1, True)),        # none: CPU with gloo, and say so
])
def test_fewer_gpus_than_asked_is_said_not_hidden(nodes, gpus, available, expected):
    hw = fit_hardware(nodes, gpus, gpus or 1, available)
    assert (hw.gpus_per_pod, hw.procs_per_pod, hw.note is not None) == expected
    if hw.note:
        assert f"{nodes} node(s) x {gpus} GPU(s)" in hw.note and f"has {available}" in hw.note


def test_gpus_are_partitioned_between_pods(tmp_path):
    spec, rendered = rendered_for({"gpusPerNode": 2, "nodes": 2, "training": {"device": "auto"},
                                   "volumes": SHARED_CHECKPOINTS})
    mounts = mount_volumes(rendered, tmp_path, {})
    pods = plan_pods(rendered, 2, mounts, fit_hardware(2, 2, 2, 4), master_port=1, attempt=0, warn=pytest.fail)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in pods] == ["0,1", "2,3"]
    assert all("--nproc-per-node=2" in p.argv for p in pods)
