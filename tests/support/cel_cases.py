"""Specs that each break exactly one of the CRD's cross-field (CEL) rules, and valid ones beside them.

Shared by tests/unit/operator/test_crd.py (the rules checked with cel-python, and against pydantic) and
tests/cluster/test_api_validation.py (the same documents sent to a real kube-apiserver).
"""

from __future__ import annotations

import copy

BASE = {
    "model": {"architecture": "transformer", "size": "tiny"},
    "tokenizer": {"train": {"vocabSize": 500}},
    "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated", "size": 100}]},
    "training": {"maxSteps": 10},
}
PVC = {"persistentVolumeClaim": {"claimName": "efs"}}
# What a training on more than one node needs: its checkpoints on a volume every pod shares.
SHARED_CHECKPOINTS = [{"name": "runs", "mountPath": "/runs", "purpose": "checkpoints", **PVC}]


def _raw(**patch) -> dict:
    raw = copy.deepcopy(BASE)
    for key, value in patch.items():
        raw[key] = value
    return raw


def _pretrained(**patch) -> dict:
    return _raw(model={"name": "t5-small"}, tokenizer={}, data={"sourceLang": "en", "targetLangs": ["de"]}, **patch)


def _without_training(**patch) -> dict:
    raw = _raw(**patch)
    raw.pop("training")
    return raw


_BLOCK = {"level": "cloud.google.com/gce-topology-block"}
_TEST = {"sourceLang": "en", "targetLangs": ["de"], "test": [{"format": "generated", "size": 10}]}


# (case, raw spec, valid?) — each invalid case breaks exactly one cross-field rule.
CASES = [
    ("minimal", _raw(), True),
    ("pretrained without data", _pretrained(), True),
    ("evaluate mode without training", _without_training(mode="evaluate", model={"name": "t5-small"}, tokenizer={},
                                                          data=_TEST), True),
    ("train mode without training", _without_training(), False),
    ("evaluate mode without test data", _without_training(mode="evaluate", model={"name": "t5-small"}, tokenizer={},
                                                           data={"sourceLang": "en", "targetLangs": ["de"]}), False),
    ("evaluate mode after training", _without_training(mode="evaluate", model={"name": "t5-small"}, tokenizer={},
                                                       data=_TEST, evaluation={"afterTraining": {}}), False),
    ("evaluate mode without a pretrained model", _raw(mode="evaluate", data={**_TEST, **BASE["data"]}), False),
    ("tokenizer path", _raw(tokenizer={"path": "/tok"}, data={"sourceLang": "en", "targetLangs": ["de"]}), True),
    ("gpus with profile", _raw(gpusPerNode=8, network={"profile": "eks-p5"}, training={"maxSteps": 5, "device": "cuda"}), True),
    ("cpu procs", _raw(nodes=2, procsPerNode=4, training={"maxSteps": 5, "device": "cpu"},
                       volumes=SHARED_CHECKPOINTS), True),
    ("deepspeed", _raw(gpusPerNode=2, launcher="deepspeed"), True),
    ("user env", _raw(env=[{"name": "NCCL_DEBUG", "value": "INFO"},
                           {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}]), True),
    ("profile env on generic", _raw(gpusPerNode=1, env=[{"name": "FI_PROVIDER", "value": "tcp"}]), True),
    ("volumes", _raw(volumes=[{"name": "d", "mountPath": "/data", "purpose": "data", "readOnly": True, **PVC},
                              {"name": "c", "mountPath": "/checkpoints", "purpose": "checkpoints", **PVC},
                              {"name": "s", "mountPath": "/scratch", "emptyDir": {}},
                              {"name": "t", "mountPath": "/tmp2", "emptyDir": {"medium": "Memory"}}]), True),
    ("tolerations", _raw(scheduling={"tolerations": [{"key": "a", "operator": "Exists"},
                                                     {"key": "b", "value": "c"}]}), True),
    ("data formats", _raw(data={"sourceLang": "en", "targetLangs": ["de"], "train": [
        {"format": "pairs", "source": "a", "target": "b"}, {"format": "tsv", "path": "x"}]}), True),

    ("average", _raw(checkpoint={"interval": 3, "keep": 3, "average": {"last": 3}}), True),
    ("average best with epochs", _raw(training={"epochs": 2}, checkpoint={"keep": 5, "average": {"best": 5}}), True),

    ("model name and architecture", _raw(model={"name": "t5-small", "architecture": "t5"}), False),
    ("model neither", _raw(model={"size": "tiny"}), False),
    ("dModel not divisible", _raw(model={"architecture": "t5", "dModel": 100, "heads": 3}), False),
    ("tokenizer both", _raw(tokenizer={"path": "x", "train": {}}), False),
    ("pairs without target", _raw(data={"sourceLang": "en", "targetLangs": ["de"],
                                        "train": [{"format": "pairs", "source": "a"}]}), False),
    ("validation jsonl without path", _raw(data={"sourceLang": "en", "targetLangs": ["de"], "train": BASE["data"]["train"],
                                                 "validation": [{"format": "jsonl"}]}), False),
    ("test mtgeneval without path", _raw(data={"sourceLang": "en", "targetLangs": ["de"], "train": BASE["data"]["train"],
                                               "test": [{"format": "mtgeneval"}]}), False),
    ("no length", _raw(training={"batch": {"tokens": 100}}), False),
    ("batch both", _raw(training={"maxSteps": 5, "batch": {"tokens": 100, "sentences": 4}}), False),
    ("average neither", _raw(checkpoint={"average": {}}), False),
    ("average both", _raw(checkpoint={"interval": 2, "average": {"last": 2, "best": 2}}), False),
    ("average more than keep", _raw(checkpoint={"interval": 1, "keep": 3, "average": {"best": 4}}), False),
    ("average more than written", _raw(checkpoint={"interval": 5, "keep": 3, "average": {"last": 3}}), False),
    ("scratch without tokenizer", _raw(tokenizer={}), False),
    ("tokenizer.train without data", _raw(data={"sourceLang": "en", "targetLangs": ["de"]}), False),
    ("procs with gpus", _raw(gpusPerNode=2, procsPerNode=2), False),
    ("deepspeed on cpu", _raw(launcher="deepspeed"), False),
    ("profile without gpus", _raw(network={"profile": "gke-a3"}), False),
    ("profile with too many gpus", _raw(gpusPerNode=16, network={"profile": "eks-p4d"}), False),
    ("cuda without gpus", _raw(training={"maxSteps": 5, "device": "cuda"}), False),
    ("cpu with gpus", _raw(gpusPerNode=1, training={"maxSteps": 5, "device": "cpu"}), False),
    ("launcher env", _raw(env=[{"name": "MASTER_ADDR", "value": "x"}]), False),
    ("launcher env prefix", _raw(env=[{"name": "ROSETTA_OUTPUT", "value": "x"}]), False),
    ("eks-p4d env", _raw(gpusPerNode=8, network={"profile": "eks-p4d"}, env=[{"name": "FI_PROVIDER", "value": "x"}]), False),
    ("eks-p5 env", _raw(gpusPerNode=8, network={"profile": "eks-p5"}, env=[{"name": "FI_EFA_FORK_SAFE", "value": "0"}]), False),
    ("gke-a3 env", _raw(gpusPerNode=8, network={"profile": "gke-a3"}, env=[{"name": "NCCL_ALGO", "value": "Tree"}]), False),
    ("env value and valueFrom", _raw(env=[{"name": "A", "value": "1",
                                           "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]), False),
    ("env valueFrom both refs", _raw(env=[{"name": "A", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"}, "configMapKeyRef": {"name": "c", "key": "k"}}}]), False),
    ("literal secret env", _raw(env=[{"name": "WANDB_API_KEY", "value": "abc"}]), False),
    ("secret env from a ConfigMap", _raw(env=[{"name": "HF_TOKEN", "valueFrom": {
        "configMapKeyRef": {"name": "c", "key": "k"}}}]), False),
    ("root user", _raw(podSecurity={"runAsUser": 0}), False),
    ("runAsNonRoot off", _raw(podSecurity={"runAsNonRoot": False}), False),
    ("non-root user", _raw(podSecurity={"runAsUser": 1000, "runAsNonRoot": True}), True),
    ("volume without source", _raw(volumes=[{"name": "a", "mountPath": "/a"}]), False),
    ("volume two sources", _raw(volumes=[{"name": "a", "mountPath": "/a", "emptyDir": {}, **PVC}]), False),
    ("read-only checkpoints", _raw(volumes=[{"name": "a", "mountPath": "/a", "purpose": "checkpoints",
                                             "readOnly": True, **PVC}]), False),
    ("read-only checkpoints claim", _raw(volumes=[{"name": "a", "mountPath": "/a", "purpose": "checkpoints",
                                                   "persistentVolumeClaim": {"claimName": "c", "readOnly": True}}]), False),
    ("two data volumes", _raw(volumes=[{"name": "a", "mountPath": "/a", "purpose": "data", **PVC},
                                       {"name": "b", "mountPath": "/b", "purpose": "data", **PVC}]), False),
    ("shared mount path", _raw(volumes=[{"name": "a", "mountPath": "/a", **PVC}, {"name": "b", "mountPath": "/a", **PVC}]), False),
    ("reserved mount path", _raw(volumes=[{"name": "a", "mountPath": "/dev/shm", "emptyDir": {}}]), False),
    ("reserved volume name", _raw(volumes=[{"name": "config", "mountPath": "/a", **PVC}]), False),
    ("default output path taken", _raw(volumes=[{"name": "a", "mountPath": "/checkpoints", **PVC}]), False),
    ("exclusive hostname on one node", _raw(scheduling={"exclusiveTopology": "kubernetes.io/hostname"}), True),
    ("exclusive node pool", _raw(nodes=4, scheduling={"exclusiveTopology": "cloud.google.com/gke-nodepool"},
                                 volumes=SHARED_CHECKPOINTS), True),
    ("exclusive hostname on many nodes", _raw(nodes=2, scheduling={"exclusiveTopology": "kubernetes.io/hostname"},
                                              volumes=SHARED_CHECKPOINTS), False),
    ("topology through a queue", _raw(nodes=4, scheduling={"queueName": "team", "topology": _BLOCK},
                                      volumes=SHARED_CHECKPOINTS), True),
    ("preferred hostname topology on many nodes", _raw(nodes=2, scheduling={"queueName": "team", "topology": {
        "level": "kubernetes.io/hostname", "mode": "Preferred"}}, volumes=SHARED_CHECKPOINTS), True),
    ("topology without a queue", _raw(scheduling={"topology": _BLOCK}), False),
    ("topology and exclusiveTopology", _raw(scheduling={"queueName": "team", "topology": _BLOCK,
                                                        "exclusiveTopology": "cloud.google.com/gke-nodepool"}), False),
    ("required hostname topology on many nodes", _raw(nodes=2, scheduling={"queueName": "team", "topology": {
        "level": "kubernetes.io/hostname"}}, volumes=SHARED_CHECKPOINTS), False),
    ("one node without a checkpoints volume", _raw(nodes=1), True),
    ("one node with emptyDir checkpoints", _raw(volumes=[{"name": "c", "mountPath": "/c", "purpose": "checkpoints",
                                                          "emptyDir": {}}]), True),
    ("nodes with shared checkpoints and dir", _raw(nodes=2, volumes=SHARED_CHECKPOINTS,
                                                   checkpoint={"dir": "/runs/mt/ckpt"}), True),
    ("nodes with a relative checkpoint dir", _raw(nodes=2, volumes=SHARED_CHECKPOINTS, checkpoint={"dir": "ckpt"}),
     True),
    ("nodes without a checkpoints volume", _raw(nodes=2), False),
    ("nodes with emptyDir checkpoints", _raw(nodes=2, volumes=[{"name": "scratch", "mountPath": "/scratch",
                                                                "purpose": "checkpoints", "emptyDir": {}}]), False),
    ("nodes with hostPath checkpoints", _raw(nodes=3, volumes=[{"name": "nvme", "mountPath": "/nvme",
                                                                "purpose": "checkpoints",
                                                                "hostPath": {"path": "/mnt/nvme"}}]), False),
    ("nodes with checkpoints on a PVC that is not for checkpoints", _raw(nodes=2, volumes=[
        {"name": "c", "mountPath": "/c", "purpose": "checkpoints", "emptyDir": {}},
        {"name": "d", "mountPath": "/d", **PVC}]), False),
    ("nodes with a checkpoint dir off the shared volume", _raw(nodes=2, volumes=[
        *SHARED_CHECKPOINTS, {"name": "s", "mountPath": "/scratch", "emptyDir": {}}],
        checkpoint={"dir": "/scratch/ckpt"}), False),
    ("toleration Exists with value", _raw(scheduling={"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]}), False),
    ("summarization without targetLangs", _raw(task="summarization", data={
        "sourceLang": "en", "train": [{"format": "generated", "size": 100}]}), True),
    ("translation without targetLangs", _raw(data={"sourceLang": "en", "train": [{"format": "generated", "size": 100}]}),
     False),
    ("summarization with gender", _raw(task="summarization", evaluation={"metrics": ["rougeL", "gender"]}), False),
    ("zero-3 with offload", _raw(distributed={"backend": "deepspeed", "zeroStage": 3,
                                              "offload": {"optimizer": "cpu", "parameters": "cpu"}}), True),
    ("zero stage without deepspeed", _raw(distributed={"zeroStage": 2}), False),
    ("parameter offload on zero-2", _raw(distributed={"backend": "deepspeed", "offload": {"parameters": "cpu"}}), False),
]
