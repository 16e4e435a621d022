"""The TranslationTraining CRD, generated from the pydantic spec so the two never drift.

pydantic emits JSON Schema 2020-12; a Kubernetes CRD needs a *structural* OpenAPI v3
schema (every node typed, no $ref, nullable instead of anyOf-null, boolean
exclusiveMinimum). `structural()` does that conversion; the status schema is written
out by hand because a structural schema silently prunes undeclared status fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rosetta_contract.data_fields import REQUIRED_BY_FORMAT
from rosetta_contract.pod_fields import (
    DEFAULT_OUTPUT_MOUNT,
    HOSTNAME_LABEL,
    LAUNCHER_ENV,
    LAUNCHER_ENV_PREFIXES,
    MAX_NAME_LENGTH,
    RESERVED_MOUNTS,
    RESERVED_VOLUMES,
    SECRET_ENV_NAME,
)
from rosetta_contract.profiles import PROFILES
from rosetta_contract.resource import GROUP, KIND, PHASES, PLURAL, VERSION
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_operator.attempts import MAX_ATTEMPTS

# The JobSet's headless Service takes the training's name.
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# Keywords a CRD schema may carry and that we keep as they are.
_KEEP = {"type", "description", "enum", "minimum", "maximum", "minLength", "maxLength", "pattern",
         "minItems", "maxItems", "nullable", "required", "format",
         "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields"}


def structural(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One pydantic JSON-schema node → a structural OpenAPI v3 node (recursively)."""
    defs = defs if defs is not None else schema.get("$defs", {})
    node = dict(schema)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        # The field's own description beats the model's docstring.
        node = {**target, **{k: v for k, v in node.items() if k in ("description", "default")}}
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        # Optional[X] → X, nullable; any other union has no structural form.
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {node['anyOf']}")
        one = structural(options[0], defs)
        if len(options) < len(node["anyOf"]):
            one["nullable"] = True
        if "description" in node:
            one["description"] = node["description"]
        if "default" in node and _scalar(node["default"]):
            one["default"] = node["default"]
        return one
    out: dict[str, Any] = {}
    if "const" in node:
        out["enum"] = [node["const"]]
    for key, value in node.items():
        if key in _KEEP:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    # JSON Schema's numeric exclusive bounds → OpenAPI v3.0's boolean flags.
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node:
            out[flag] = node[bound]
            out[bound] = True
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {k: structural(v, defs) for k, v in node["properties"].items()}
    elif node.get("type") == "object":
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            out["additionalProperties"] = structural(extra, defs)
        else:  # dict[str, Any]: free-form (affinity)
            out["x-kubernetes-preserve-unknown-fields"] = True
    if "prefixItems" in node:  # tuple[float, float] → a fixed-length array of one type
        kinds = [structural(i, defs) for i in node["prefixItems"]]
        if any(k != kinds[0] for k in kinds):
            raise ValueError(f"cannot express a mixed tuple in a structural schema: {kinds}")
        out["items"] = kinds[0]
    elif "items" in node:
        out["items"] = structural(node["items"], defs)
    if "default" in node and _scalar(node["default"]):
        # Only scalars: null needs nullable, and object/array defaults would be
        # pydantic's resolved factories, which the apiserver need not know.
        out["default"] = node["default"]
    if out.get("required") == []:
        out.pop("required")
    return out


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and value is not None


def _at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The schema node at a dotted property path; `[]` steps into array items."""
    node = schema
    for part in path.split(".") if path else []:
        if part == "[]":
            node = node["items"]
        else:
            node = node["properties"][part]
    return node


# ----------------------------------------------------------------------------- CEL


@dataclass(frozen=True)
class CelRule:
    """An x-kubernetes-validations rule at `path` (dotted, `[]` = each list item) of the spec.

    Each mirrors a pydantic validator, so `kubectl apply` rejects what the operator
    would reject anyway; tests/unit/test_crd.py checks both agree on the same inputs.
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


def spec_schema() -> dict[str, Any]:
    schema = TranslationTrainingSpec.model_json_schema(by_alias=True, mode="validation")
    out = structural(schema)
    out["description"] = " ".join((TranslationTrainingSpec.__doc__ or "").split("\n\n")[0].split())
    for rule in cel_rules():
        _at(out, rule.path).setdefault("x-kubernetes-validations", []).append(
            {"rule": rule.rule, "message": rule.message})
    # list-type map: the apiserver itself rejects two env vars or volumes of one name.
    for path in ("env", "volumes"):
        node = _at(out, path)
        node["x-kubernetes-list-type"] = "map"
        node["x-kubernetes-list-map-keys"] = ["name"]
    return out


# --------------------------------------------------------------------------- status


def _obj(description: str, properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "description": description, "properties": properties, **extra}


def _t(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


def _time(description: str) -> dict[str, Any]:
    return {"type": "string", "format": "date-time", "description": description + " (RFC 3339)."}


def status_schema() -> dict[str, Any]:
    progress = _obj("What the trainer last reported (rank 0).", {
        "step": _t("integer", "Optimizer steps done."),
        "totalSteps": _t("integer", "Steps the run will take."),
        "percent": _t("number", "step / totalSteps × 100."),
        "display": _t("string", 'Human summary for kubectl, e.g. "45% 450/1000".'),
        "epoch": _t("number", "Fractional epoch."),
        "loss": _t("number", "Latest training loss."),
        "learningRate": _t("number", "Current learning rate."),
        "tokensPerSecond": _t("number", "Training throughput over all ranks."),
        "mfu": _t("number", "Model FLOPs utilisation, 0-1."),
        "etaSeconds": _t("number", "Estimated seconds to the last step."),
        "bleu": _t("number", "Latest validation BLEU; the final figure is the primary metric's (ROUGE-L for summarization)."),
        "bestBleu": _t("number", "Best validation score so far of the primary metric: BLEU, or ROUGE-L for summarization."),
        "validationLoss": _t("number", "Latest validation loss, beside loss to show overfitting."),
        "genderGapBleu": _t("number", "MT-GenEval masculine minus feminine BLEU, mean over target languages "
                                      "(positive: the model favours the masculine)."),
        "gender": {"type": "object", "description": "MT-GenEval per target language.",
                   "additionalProperties": _obj("One target language's MT-GenEval figures.", {
                       "gapBleu": _t("number", "Masculine minus feminine BLEU."),
                       "gapAccuracy": _t("number", "Masculine minus feminine accuracy, percentage points."),
                       "accuracy": _t("number", "Percent of translations with no word of the wrong gender."),
                       "bleuMasculine": _t("number", "BLEU of the masculine half."),
                       "bleuFeminine": _t("number", "BLEU of the feminine half."),
                       "accuracyMasculine": _t("number", "Accuracy of the masculine half, percent."),
                       "accuracyFeminine": _t("number", "Accuracy of the feminine half, percent."),
                   })},
        "lastCheckpoint": _t("string", "Path of the newest checkpoint."),
        "lastCheckpointStep": _t("integer", "Step of the newest checkpoint."),
        "activity": _t("string", "What rank 0 is doing: training, evaluating or checkpointing.",
                       enum=["training", "evaluating", "checkpointing"]),
        "updatedAt": _time("When the trainer reported this"),
    })
    condition = _obj("One aspect of the training's state.", {
        "type": _t("string", "Condition type, e.g. Running, Succeeded, Failed, Suspended, Admitted, Scheduled, Stalled."),
        "status": _t("string", "True, False or Unknown.", enum=["True", "False", "Unknown"]),
        "reason": _t("string", "CamelCase machine-readable reason."),
        "message": _t("string", "Human-readable detail."),
        "lastTransitionTime": _time("When status last changed"),
        "observedGeneration": _t("integer", "metadata.generation the condition was computed from."),
    }, required=["type", "status"])
    return _obj("Observed state, written by the operator.", {
        "phase": _t("string", "Where the training is in its life.", enum=list(PHASES)),
        "message": _t("string", "Why it is in this phase."),
        "observedGeneration": _t("integer", "metadata.generation the status reflects."),
        "jobSetName": _t("string", "The JobSet that runs the training."),
        "configMapName": _t("string", "The ConfigMap with the trainer config."),
        "nodes": _t("integer", "Pods in the running JobSet."),
        "gpusPerNode": _t("integer", "GPUs per pod in the running JobSet."),
        "worldSize": _t("integer", "Trainer processes in all."),
        "restarts": _t("integer", "Gang restarts after a failure; these count towards failurePolicy.maxRestarts."),
        "preemptions": _t("integer", "Gang restarts after a pod was preempted, evicted or drained "
                                     "(DisruptionTarget); these do not count towards maxRestarts."),
        "stalls": _t("integer", "Times rank 0's heartbeat stopped for spec.faultTolerance.stallTimeoutSeconds "
                                "(condition Stalled); under stallAction restart each one is also a restart."),
        "startTime": _time("When the pods first ran"),
        "completionTime": _time("When the training succeeded or failed"),
        "excludedNodes": {"type": "array", "maxItems": 256,
                          "description": "Nodes kept out of the next attempts because a pod failed the pre-flight "
                                         "check on them (spec.faultTolerance.preflight), at most maxExcludedNodes.",
                          "items": _obj("One excluded node.", {
                              "node": _t("string", "The node's name."),
                              "reason": _t("string", "Why: NodeUnhealthy."),
                              "message": _t("string", "What the pre-flight check said."),
                              "attempt": _t("integer", "The attempt in which it failed."),
                              "time": _time("When it was excluded"),
                          }, required=["node"])},
        "attempts": {"type": "array", "maxItems": MAX_ATTEMPTS,
                     "description": f"The newest {MAX_ATTEMPTS} attempts (the first run and every gang restart), oldest "
                                    "first; `rosetta logs NAME --attempt N` reads an ended one's logs.",
                     "items": _obj("One attempt of the gang.", {
                         "attempt": _t("integer", "0 for the first run, then one more per gang restart."),
                         "startTime": _time("When the operator first saw it running (or its end)"),
                         "endTime": _time("When it ended"),
                         "reason": _t("string", "Why it ended: Succeeded, or a failure class (DataInvalid, ConfigError, "
                                                "NonFinite, CudaOutOfMemory, CollectiveTimeout, OOMKilled, "
                                                "ImagePullFailed, NodeLost, Preempted, Stalled, Error)."),
                         "message": _t("string", "What the failing pod said, its pod and node first."),
                         "exitCode": _t("integer", "The failing container's exit code."),
                         "pod": _t("string", "The pod that failed first, by the most specific reason."),
                         "node": _t("string", "The node it ran on."),
                         "nodeRank": _t("integer", "Its node rank (completion index)."),
                         "lastStep": _t("integer", "The last optimizer step the operator saw in the attempt."),
                     }, required=["attempt"])},
        "conditions": {"type": "array", "description": "Latest observations, one per type.",
                       "items": condition, "x-kubernetes-list-type": "map",
                       "x-kubernetes-list-map-keys": ["type"]},
        "progress": progress,
        "evaluation": _obj("The after-training evaluation (spec.evaluation.afterTraining): a CPU Job that "
                           "evaluates one checkpoint on the test sets once the training succeeded.", {
            "phase": _t("string", "Where the evaluation Job is.", enum=["Pending", "Running", "Succeeded", "Failed"]),
            "jobName": _t("string", "The evaluation Job."),
            "checkpoint": _t("string", "Which checkpoint was asked for: final, best or averaged."),
            "checkpointPath": _t("string", "The checkpoint directory it evaluated, e.g. step-00010000."),
            "step": _t("integer", "The training step of that checkpoint."),
            "samples": _t("integer", "Test pairs evaluated."),
            "bleu": _t("number", "Test BLEU (mean over target languages)."),
            "chrf": _t("number", "Test chrF."),
            "rouge1": _t("number", "Test ROUGE-1 (summarization)."),
            "rouge2": _t("number", "Test ROUGE-2."),
            "rougeL": _t("number", "Test ROUGE-L."),
            "rougeLsum": _t("number", "Test ROUGE-Lsum."),
            "message": _t("string", "Why it failed."),
            "startTime": _time("When the Job started"),
            "completionTime": _time("When the Job succeeded"),
        }),
        # kopf keeps handler progress here as a fallback to annotations; pruning it
        # would make kopf retry handlers that already finished.
        "kopf": {"type": "object", "description": "kopf's own bookkeeping.",
                 "x-kubernetes-preserve-unknown-fields": True},
    })


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.nodes"},
    {"name": "GPUs/node", "type": "integer", "jsonPath": ".spec.gpusPerNode"},
    {"name": "Progress", "type": "string", "jsonPath": ".status.progress.display"},
    {"name": "BLEU", "type": "number", "jsonPath": ".status.progress.bleu"},
    # -o wide only: most trainings never restart; the validation loss is for a closer look.
    {"name": "Val loss", "type": "number", "jsonPath": ".status.progress.validationLoss", "priority": 1},
    {"name": "Gender gap", "type": "number", "jsonPath": ".status.progress.genderGapBleu", "priority": 1},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1},
    {"name": "Preemptions", "type": "integer", "jsonPath": ".status.preemptions", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL,
                      "singular": KIND.lower(), "shortNames": ["tt"], "categories": ["rosetta"]},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "Train a translation model on a Kubernetes cluster (one JobSet).",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        # Only name may be restricted here; longer names cannot fit the pods' names.
                        "metadata": {"type": "object", "properties": {"name": {
                            "type": "string", "maxLength": MAX_NAME_LENGTH, "pattern": DNS1035_LABEL}}},
                        "spec": spec_schema(),
                        "status": status_schema(),
                    },
                }},
            }],
        },
    }


__all__ = ["build_crd", "cel_rules", "spec_schema", "status_schema", "structural", "PHASES", "PRINTER_COLUMNS"]
