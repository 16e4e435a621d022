"""The rendered pod as a local process: env, command, mounts and the ConfigMap, without running it."""

import sys

import pytest
import yaml

from rosetta_operator.local.pods import (
    LocalRunError, fit_hardware, mount_volumes, plan_pods, trainer_output,
)
from rosetta_operator.local.runner import parse_volume_args
from rosetta_operator.render import render
from rosetta_operator.spec import parse_training
from support.training import TINY, deep_update


def rendered_for(patch: dict):
    training = parse_training(deep_update(TINY, {"spec": patch}))
    return training.spec, render(training.metadata.name, "default", training.spec)


def test_each_pod_gets_its_rank_the_local_master_and_the_launcher_command(tmp_path):
    spec, rendered = rendered_for({"nodes": 3})
    paths = mount_volumes(rendered, tmp_path, {})
    hw = fit_hardware(spec.nodes, spec.gpus_per_node, spec.procs, available_gpus=0)
    pods = plan_pods(rendered, spec.nodes, paths, hw, master_port=29555, attempt=2, warn=pytest.fail)

    assert [p.name for p in pods] == ["tiny-node-0-0", "tiny-node-0-1", "tiny-node-0-2"]
    assert [p.env["ROSETTA_NODE_RANK"] for p in pods] == ["0", "1", "2"]
    for pod in pods:
        assert pod.env["ROSETTA_MASTER_ADDR"] == "127.0.0.1" and pod.env["ROSETTA_MASTER_PORT"] == "29555"
        assert pod.env["ROSETTA_RESTART_ATTEMPT"] == "2"
        assert pod.env["CUDA_VISIBLE_DEVICES"] == ""
        # torchrun from this interpreter, every $(VAR) expanded the way the kubelet does it
        assert pod.argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
        assert "--nnodes=3" in pod.argv and f"--node-rank={pod.index}" in pod.argv
        assert "--master-addr=127.0.0.1" in pod.argv and "--master-port=29555" in pod.argv
        assert not any("$(" in arg for arg in pod.argv)
    # container paths became local ones: the config file and the output volume
    config = pods[0].argv[pods[0].argv.index("-f") + 1]
    assert config == str(tmp_path.resolve() / "config" / "training.yaml")
    assert trainer_output(rendered, paths) == tmp_path.resolve() / "volumes" / "output" / "tiny"
    assert pods[0].env["ROSETTA_OUTPUT"] == str(trainer_output(rendered, paths))


def test_the_configmap_reaches_the_pods_with_mounted_paths_rewritten(tmp_path):
    data_dir = tmp_path / "corpus"
    spec, rendered = rendered_for({
        "volumes": [{"name": "data", "purpose": "data", "mountPath": "/data",
                     "persistentVolumeClaim": {"claimName": "corpus"}, "readOnly": True}],
        "data": {"train": [{"format": "pairs", "source": "/data/train.en", "target": "/data/train.de"}]},
    })
    paths = mount_volumes(rendered, tmp_path / "run", parse_volume_args([f"data={data_dir}"]))
    written = yaml.safe_load((tmp_path / "run" / "config" / "training.yaml").read_text())
    source = written["spec"]["data"]["train"][0]
    assert source["source"] == str(data_dir.resolve() / "train.en")
    assert source["target"] == str(data_dir.resolve() / "train.de")
    assert written["spec"]["training"]["maxSteps"] == TINY["spec"]["training"]["maxSteps"]
    assert data_dir.is_dir()
    hw = fit_hardware(1, 0, 1, 0)
    pod = plan_pods(rendered, 1, paths, hw, master_port=1, attempt=0, warn=pytest.fail)[0]
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
    spec, rendered = rendered_for({"gpusPerNode": 2, "nodes": 2, "training": {"device": "auto"}})
    paths = mount_volumes(rendered, tmp_path, {})
    pods = plan_pods(rendered, 2, paths, fit_hardware(2, 2, 2, 4), master_port=1, attempt=0, warn=pytest.fail)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in pods] == ["0,1", "2,3"]
    assert all("--nproc-per-node=2" in p.argv for p in pods)
