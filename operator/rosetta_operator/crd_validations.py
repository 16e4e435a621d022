"""The CRD's CEL rules (x-kubernetes-validations): the spec's cross-field checks, so that
`kubectl apply` refuses what the operator would refuse anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rosetta_contract.data_fields import REQUIRED_BY_FORMAT
from rosetta_contract.kube_names import HOSTNAME_LABEL
from rosetta_contract.profiles import PROFILES
from rosetta_contract.trainer_pod import (
    DEFAULT_OUTPUT_MOUNT,
    LAUNCHER_ENV,
    LAUNCHER_ENV_PREFIXES,
    RESERVED_MOUNTS,
    RESERVED_VOLUMES,
    SECRET_ENV_NAME,
)


@dataclass(frozen=True)
class CelRule:
    """An x-kubernetes-validations rule at `path` (dotted, `[]` = each list item) of the spec.

    Each mirrors a pydantic validator, so `kubectl apply` rejects what the operator
    would reject anyway; tests/unit/operator/test_crd.py checks both agree on the same inputs.
    Every optional field is guarded with has(): the apiserver evaluates rules on
    what the user wrote plus scalar defaults only.
    """

    path: str
    rule: str
    message: str


def _str_list(values: Any) -> str:
    return "[" + ", ".join(f"'{v}'" for v in sorted(values)) + "]"


def _format_rule() -> str:
    checks = [f"(self.format != '{fmt}' || ({' && '.join(f'has(self.{f})' for f in fields)}))"
              for fmt, fields in REQUIRED_BY_FORMAT.items() if fields]
    return " && ".join(checks)


def _profile_gpu_rule() -> str:
    gpu_profiles = [p for p in PROFILES.values() if p.needs_gpus]
    (most,) = {p.max_gpus_per_node for p in gpu_profiles}  # one machine shape today
    return (f"!has(self.network) || !has(self.network.profile) || "
            f"!(self.network.profile in {_str_list(p.name for p in gpu_profiles)}) || "
            f"(has(self.gpusPerNode) && self.gpusPerNode >= 1 && self.gpusPerNode <= {most})")


def _launcher_env_rule() -> str:
    prefixes = " && ".join(f"!e.name.startsWith('{p}')" for p in LAUNCHER_ENV_PREFIXES)
    return f"self.all(e, !(e.name in {_str_list(LAUNCHER_ENV)}) && {prefixes})"


def _profile_env_rules() -> list[CelRule]:
    return [CelRule(
        "", f"!has(self.env) || !has(self.network) || !has(self.network.profile) || "
            f"self.network.profile != '{p.name}' || self.env.all(e, !(e.name in {_str_list(p.env)}))",
        f"env must not set variables that network profile {p.name} sets: {', '.join(sorted(p.env))}",
    ) for p in PROFILES.values() if p.env]


# checkpoint.average's N, at a checkpoint section named by the format argument (0 when neither is set:
# the rule at checkpoint.average reports that).
_AVERAGE_COUNT = ("(has({0}.average.last) ? {0}.average.last : "
                  "(has({0}.average.best) ? {0}.average.best : 0))")


def cel_rules() -> list[CelRule]:
    splits = [f"data.{split}.[]" for split in ("train", "validation", "test")]
    purposes = ["data", "model", "checkpoints", "cache"]
    return [
        CelRule("model", "has(self.name) != has(self.architecture)",
                "set exactly one of 'name' (pretrained) or 'architecture' (from scratch)"),
        CelRule("model", "!has(self.dModel) || !has(self.heads) || self.dModel % self.heads == 0",
                "dModel must be divisible by heads"),
        CelRule("tokenizer", "!(has(self.path) && has(self.train))", "set either 'path' or 'train', not both"),
        *[CelRule(path, _format_rule(), "this format needs more fields (pairs: source and target; "
                                        "tsv, csv, jsonl, mtgeneval: path)") for path in splits],
        CelRule("training", "has(self.maxSteps) || has(self.epochs)", "set 'maxSteps' or 'epochs'"),
        CelRule("", "has(self.training) || (has(self.mode) && self.mode == 'evaluate')",
                "training is required (mode train trains; mode evaluate needs none)"),
        CelRule("", "!has(self.mode) || self.mode != 'evaluate' || has(self.model.name)",
                "mode evaluate evaluates a pretrained model: set model.name (hub id or path)"),
        CelRule("", "!has(self.mode) || self.mode != 'evaluate' || (has(self.data.test) && self.data.test.size() > 0)",
                "mode evaluate evaluates the test sets, and data.test is empty"),
        CelRule("", "!has(self.mode) || self.mode != 'evaluate' || !has(self.evaluation) || "
                    "!has(self.evaluation.afterTraining)",
                "mode evaluate has no training to evaluate after: drop evaluation.afterTraining"),
        CelRule("", "(has(self.task) && self.task == 'summarization') || "
                    "(has(self.data.targetLangs) && self.data.targetLangs.size() > 0)",
                "a translation needs data.targetLangs"),
        CelRule("", "!has(self.task) || self.task != 'summarization' || !has(self.evaluation) || "
                    "!has(self.evaluation.metrics) || !self.evaluation.metrics.exists(m, m == 'gender')",
                "the gender metric is for translation; summarization is scored with ROUGE"),
        CelRule("distributed", "(has(self.backend) && self.backend == 'deepspeed') || (!has(self.zeroStage) && "
                               "!has(self.deepspeedConfig) && (!has(self.offload) || "
                               "((!has(self.offload.optimizer) || self.offload.optimizer == 'none') && "
                               "(!has(self.offload.parameters) || self.offload.parameters == 'none'))))",
                "zeroStage, offload and deepspeedConfig need backend: deepspeed"),
        CelRule("distributed", "!has(self.offload) || !has(self.offload.parameters) || "
                               "self.offload.parameters == 'none' || (has(self.zeroStage) && self.zeroStage == 3)",
                "offload.parameters: cpu needs zeroStage 3"),
        CelRule("training.batch", "has(self.tokens) != has(self.sentences)",
                "set exactly one of 'tokens' or 'sentences'"),
        CelRule("checkpoint.average", "has(self.last) != has(self.best)", "set exactly one of 'last' or 'best'"),
        CelRule("checkpoint", f"!has(self.average) || !has(self.keep) || {_AVERAGE_COUNT.format('self')} <= self.keep",
                "average.last or average.best is more than keep: only the newest keep checkpoints "
                "(and the best one) stay on disk"),
        CelRule("", "!has(self.checkpoint) || !has(self.checkpoint.average) || !has(self.training) || "
                    "!has(self.training.maxSteps) || "
                    "!has(self.checkpoint.interval) || "
                    f"{_AVERAGE_COUNT.format('self.checkpoint')} <= "
                    "(self.training.maxSteps + self.checkpoint.interval - 1) / self.checkpoint.interval",
                "checkpoint.average asks for more checkpoints than maxSteps / checkpoint.interval writes"),
        CelRule("", "!has(self.model.architecture) || (has(self.tokenizer) && "
                    "(has(self.tokenizer.path) || has(self.tokenizer.train)))",
                "a from-scratch model needs tokenizer.path or tokenizer.train"),
        CelRule("", "has(self.model.name) || (has(self.tokenizer) && has(self.tokenizer.path)) || "
                    "(has(self.data.train) && self.data.train.size() > 0)",
                "tokenizer.train needs data.train"),
        CelRule("", "!has(self.procsPerNode) || !has(self.gpusPerNode) || self.gpusPerNode == 0",
                "procsPerNode is for CPU training; with GPUs there is one process per GPU"),
        CelRule("", "!has(self.launcher) || self.launcher != 'deepspeed' || "
                    "(has(self.gpusPerNode) && self.gpusPerNode > 0)",
                "the deepspeed launcher needs gpusPerNode >= 1"),
        CelRule("", _profile_gpu_rule(), "this network profile is for 1 to 8 GPUs per node"),
        CelRule("", f"!has(self.scheduling) || !has(self.scheduling.exclusiveTopology) || "
                    f"self.scheduling.exclusiveTopology != '{HOSTNAME_LABEL}' || !has(self.nodes) || self.nodes == 1",
                f"exclusiveTopology {HOSTNAME_LABEL} would need every pod of the gang on one node; "
                "use a node-pool, rack or block label"),
        CelRule("scheduling", "!has(self.topology) || has(self.queueName)",
                "topology needs queueName: only Kueue's topology-aware scheduling places a gang by topology, "
                "and Kueue sees only queued trainings"),
        CelRule("scheduling", "!has(self.topology) || !has(self.exclusiveTopology)",
                "set topology or exclusiveTopology, not both"),
        CelRule("", f"!has(self.scheduling) || !has(self.scheduling.topology) || "
                    f"self.scheduling.topology.level != '{HOSTNAME_LABEL}' || "
                    "(has(self.scheduling.topology.mode) && self.scheduling.topology.mode == 'Preferred') || "
                    "!has(self.nodes) || self.nodes == 1",
                f"topology.level {HOSTNAME_LABEL} with mode Required would need every pod of the gang on one "
                "node; use a block or rack label, or mode Preferred"),
        CelRule("", "!has(self.training) || !has(self.training.device) || "
                    "((self.training.device != 'cuda' || (has(self.gpusPerNode) && self.gpusPerNode > 0)) && "
                    "(self.training.device != 'cpu' || !has(self.gpusPerNode) || self.gpusPerNode == 0))",
                "training.device must match gpusPerNode (cuda needs GPUs, cpu none)"),
        CelRule("env", _launcher_env_rule(),
                "env must not set launcher-owned variables (ROSETTA_*, PET_*, TORCHELASTIC_*, "
                "MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, ...)"),
        *_profile_env_rules(),
        CelRule("env.[]", "!(has(self.value) && has(self.valueFrom))", "set either 'value' or 'valueFrom', not both"),
        CelRule("env.[].valueFrom", "has(self.secretKeyRef) != has(self.configMapKeyRef)",
                "set exactly one of 'secretKeyRef' or 'configMapKeyRef'"),
        CelRule("env.[]", f"!self.name.matches('{SECRET_ENV_NAME}') || "
                          "(!has(self.value) && (!has(self.valueFrom) || has(self.valueFrom.secretKeyRef)))",
                "this variable holds a credential (*_TOKEN, *_SECRET*, *_PASSWORD, *_API_KEY, AWS_ACCESS_KEY_ID): "
                "take it from valueFrom.secretKeyRef, not a literal value or a ConfigMap"),
        CelRule("podSecurity", "!has(self.runAsUser) || self.runAsUser != 0",
                "trainer pods do not run as root: runAsUser must not be 0"),
        CelRule("podSecurity", "!has(self.runAsNonRoot) || self.runAsNonRoot",
                "trainer pods always run as non-root: runAsNonRoot cannot be false"),
        CelRule("volumes.[]", "(has(self.persistentVolumeClaim) ? 1 : 0) + (has(self.emptyDir) ? 1 : 0) + "
                              "(has(self.hostPath) ? 1 : 0) == 1",
                "set exactly one of 'persistentVolumeClaim', 'emptyDir' or 'hostPath'"),
        CelRule("volumes.[]", "!has(self.purpose) || self.purpose != 'checkpoints' || "
                              "((!has(self.readOnly) || !self.readOnly) && (!has(self.persistentVolumeClaim) || "
                              "!has(self.persistentVolumeClaim.readOnly) || !self.persistentVolumeClaim.readOnly))",
                "the checkpoints volume must be writable"),
        CelRule("volumes", f"{_str_list(purposes)}.all(p, self.filter(v, has(v.purpose) && v.purpose == p)"
                           ".size() <= 1)",
                "at most one volume per purpose (data, model, checkpoints, cache)"),
        CelRule("volumes", "self.all(v, self.filter(w, w.mountPath == v.mountPath).size() == 1)",
                "each volume needs its own mountPath"),
        CelRule("volumes", f"self.all(v, !(v.mountPath in {_str_list(RESERVED_MOUNTS)}))",
                f"{' and '.join(RESERVED_MOUNTS)} are mounted by the operator"),
        CelRule("volumes", f"self.all(v, !(v.name in {_str_list(RESERVED_VOLUMES)}))",
                f"volume names {', '.join(RESERVED_VOLUMES)} are reserved for the operator's own volumes"),
        CelRule("volumes", f"self.exists(v, has(v.purpose) && v.purpose == 'checkpoints') || "
                           f"self.all(v, v.mountPath != '{DEFAULT_OUTPUT_MOUNT}')",
                f"{DEFAULT_OUTPUT_MOUNT} is where the run writes when no volume has purpose 'checkpoints'"),
        CelRule("", "!has(self.nodes) || self.nodes <= 1 || (has(self.volumes) && self.volumes.exists(v, "
                    "has(v.purpose) && v.purpose == 'checkpoints' && has(v.persistentVolumeClaim)))",
                "a training on more than one node needs its checkpoints on storage every pod shares: a volume "
                "with purpose: checkpoints on a persistentVolumeClaim (ReadWriteMany: EFS, Filestore, NFS), "
                "not an emptyDir or hostPath"),
        CelRule("", "!has(self.nodes) || self.nodes <= 1 || !has(self.checkpoint) || !has(self.checkpoint.dir) || "
                    "!self.checkpoint.dir.startsWith('/') || (has(self.volumes) && self.volumes.exists(v, "
                    "has(v.persistentVolumeClaim) && (self.checkpoint.dir == v.mountPath || "
                    "self.checkpoint.dir.startsWith(v.mountPath + '/'))))",
                "a training on more than one node needs checkpoint.dir on a persistentVolumeClaim volume: "
                "a relative path, or one under such a volume's mountPath"),
        CelRule("scheduling.tolerations.[]", "!has(self.operator) || self.operator != 'Exists' || !has(self.value)",
                "operator 'Exists' takes no 'value'"),
    ]
