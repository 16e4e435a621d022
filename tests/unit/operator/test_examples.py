"""Every shipped TranslationTraining validates, renders, and passes both CRDs' schemas.

manifests/examples/ holds exactly one file per target scenario (SCENARIOS), plus the CPU quickstart,
which also ships the PersistentVolumeClaim its checkpoints go to (a second YAML document).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rosetta_cli.main import main
from rosetta_contract.documents import read_yaml
from rosetta_contract.profiles import EFA_RESOURCE
from rosetta_contract.spec import TranslationTrainingSpec, load_training
from rosetta_operator.crd import build_crd
from rosetta_operator.render import render
from support.openapi_check import assert_valid_jobset, cel_failures, schema_errors, with_defaults

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES_DIR = ROOT / "manifests" / "examples"
MANIFESTS = sorted(EXAMPLES_DIR.glob("*.yaml"))
EXAMPLES = MANIFESTS + sorted((ROOT / "examples").glob("*.yaml"))
SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _pretrained(spec: TranslationTrainingSpec) -> str | None:
    return spec.model.name


# file -> (what it must be, the storage its data and checkpoint PVCs are named after: a substring of
# both claim names, "" for any PVC; a generated corpus has no data volume)
SCENARIOS = {
    "quickstart-cpu.yaml": (
        lambda s: s.nodes == 2 and s.gpus_per_node == 0 and s.training.device == "cpu",
        "quickstart-cpu",
    ),
    # (1) t5-small fine-tune on 1 GPU
    "t5-small-finetune-1gpu.yaml": (
        lambda s: _pretrained(s) == "t5-small" and s.nodes == 1 and s.gpus_per_node == 1,
        "",
    ),
    # (2) flan-t5-xl with DeepSpeed on one p5 node (8 H100, 32 EFA)
    "flan-t5-xl-deepspeed-p5.yaml": (
        lambda s: _pretrained(s) == "google/flan-t5-xl" and s.launcher == "deepspeed" and s.nodes == 1
        and s.gpus_per_node == 8 and s.network.profile == "eks-p5",
        "efs",
    ),
    # (2b) flan-t5-xl as it is, evaluated on MT-GenEval EN→DE/ES/FR/IT/PT (mode evaluate: one Job, no JobSet)
    "flan-t5-xl-gender-eval.yaml": (
        lambda s: s.mode == "evaluate" and "flan-t5-xl" in (_pretrained(s) or "") and s.uses_task_prefix()
        and s.data.target_langs == ["de", "es", "fr", "it", "pt"] and "gender" in s.evaluation.metrics
        and all(src.format == "mtgeneval" for src in s.data.test),
        "efs",
    ),
    # (3) transformer-base from scratch on 4 nodes x 1 GPU with an EFS PVC
    "transformer-base-4nodes-efs.yaml": (
        lambda s: s.model.architecture == "transformer" and s.model.size == "base" and s.nodes == 4
        and s.gpus_per_node == 1,
        "efs",
    ),
    # (4) T5 summarization with ZeRO-3 offload on 2 nodes x 4 GPUs, offline: model and corpus staged from S3
    "t5-summarization-zero3-2x4.yaml": (
        lambda s: "t5" in (_pretrained(s) or "") and s.launcher == "deepspeed" and s.nodes == 2
        and s.gpus_per_node == 4 and s.model.source is not None and s.data.source is not None
        and all(src.format == "jsonl" and (src.source_column, src.target_column) == ("document", "summary")
                for split in (s.data.train, s.data.validation, s.data.test) for src in split),
        "efs",
    ),
    # (4b) T5 on CNN/DailyMail, then the test set summarized (predict with generate) on CPU in a Job of its own
    "t5-cnn-dailymail-cpu-eval.yaml": (
        lambda s: s.task == "summarization" and "t5" in (_pretrained(s) or "") and s.gpus_per_node == 1
        and s.evaluation.after_training is not None and s.training.activation_checkpointing
        and all((src.source_column, src.target_column) == ("article", "highlights")
                for split in (s.data.train, s.data.validation, s.data.test) for src in split),
        "",
    ),
    # (5) a GKE A3 run
    "gke-a3.yaml": (
        lambda s: s.network.profile == "gke-a3" and s.gpus_per_node == 8,
        "filestore",
    ),
}
SCENARIO_PATHS = [EXAMPLES_DIR / name for name in SCENARIOS]


def test_there_is_exactly_one_file_per_scenario():
    assert sorted(p.name for p in MANIFESTS) == sorted(SCENARIOS)


def test_the_scenarios_cover_the_cluster_features():
    specs = [load_training(path).spec for path in MANIFESTS]
    profiles = {spec.network.profile for spec in specs}
    assert {"generic", "eks-p5", "gke-a3"} <= profiles
    assert any(spec.gpus_per_node == 0 and spec.nodes > 1 for spec in specs)  # multi-node CPU
    # Kueue: queueName alone (the operator creates the JobSet suspended); suspend: true would be a hold
    assert any(spec.scheduling.queue_name and not spec.suspend for spec in specs)
    assert any(spec.scheduling.tolerations for spec in specs)
    assert any(spec.launcher == "deepspeed" for spec in specs)
    assert any(v.persistent_volume_claim for spec in specs for v in spec.volumes)


@pytest.mark.parametrize("path", SCENARIO_PATHS, ids=list(SCENARIOS))
def test_scenario_is_what_its_file_name_says(path):
    spec = load_training(path).spec
    is_scenario, _ = SCENARIOS[path.name]
    assert is_scenario(spec), f"{path.name} is not the scenario it is named after"


@pytest.mark.parametrize("path", SCENARIO_PATHS, ids=list(SCENARIOS))
def test_scenario_header_says_what_it_runs_and_how(path):
    text = path.read_text()
    header = text[:text.index("apiVersion:")]
    assert text.startswith("# ") and all(line.startswith("#") for line in header.splitlines())
    rel = path.relative_to(ROOT).as_posix()
    assert f"kubectl apply -f {rel}" in header
    assert f"rosetta render -f {rel}" in header


@pytest.mark.parametrize("path", SCENARIO_PATHS, ids=list(SCENARIOS))
def test_scenario_reads_and_writes_mounted_volumes(path):
    spec = load_training(path).spec
    _, storage = SCENARIOS[path.name]
    data, checkpoints = spec.volume_for("data"), spec.volume_for("checkpoints")
    sources = [src for split in (spec.data.train, spec.data.validation, spec.data.test) for src in split]
    if all(src.format == "generated" for src in sources):  # the quickstart: nothing to read, checkpoints on a PVC
        assert data is None and checkpoints.persistent_volume_claim is not None
        assert storage in checkpoints.persistent_volume_claim.claim_name
        return
    if spec.data.source is not None:
        # Staged: the stage job writes the corpus onto a shared claim; the pods read it there.
        data = next(v for v in spec.volumes if spec.data.source.path.startswith(v.mount_path + "/"))
        assert not data.read_only
    else:
        assert data is not None and data.read_only, path.name
    for vol in (data, checkpoints):
        assert vol is not None and vol.persistent_volume_claim is not None, path.name
        assert storage in vol.persistent_volume_claim.claim_name, (path.name, vol.name)
    files = [getattr(src, field) for split in (spec.data.train, spec.data.validation, spec.data.test)
             for src in split for field in ("path", "source", "target") if getattr(src, field)]
    files += [spec.tokenizer.path] if spec.tokenizer.path else []
    assert files and all(f.startswith(data.mount_path + "/") for f in files), files
    assert spec.checkpoint.dir is None  # <checkpoints mount>/<name>/checkpoints


def test_deepspeed_examples_say_what_the_deepspeed_work_adds():
    for path in SCENARIO_PATHS:
        if load_training(path).spec.launcher == "deepspeed":
            assert "zeroStage" in path.read_text(), path.name
    assert "task: summarization" in (EXAMPLES_DIR / "t5-summarization-zero3-2x4.yaml").read_text()


def test_the_cnn_dailymail_example_renders_its_cpu_evaluation_job():
    from rosetta_operator.evaluation_job import render_evaluation_job

    training = load_training(EXAMPLES_DIR / "t5-cnn-dailymail-cpu-eval.yaml")
    job = render_evaluation_job(training.metadata.name, "default", training.spec)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert "--device" in container["command"] and container["command"][container["command"].index("--device") + 1] == "cpu"
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert "tolerations" not in job["spec"]["template"]["spec"]


def test_p5_example_requests_the_nodes_32_efa_devices():
    training = load_training(EXAMPLES_DIR / "flan-t5-xl-deepspeed-p5.yaml")
    jobset = render(training.metadata.name, "default", training.spec).jobset
    (container,) = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"][EFA_RESOURCE] == 32
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.relative_to(ROOT).as_posix() for p in EXAMPLES])
def test_example_validates_and_renders(path, capsys):
    assert main(["validate", "-f", str(path)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    training = load_training(path)
    rendered = render(training.metadata.name, training.metadata.namespace or "default", training.spec)
    assert_valid_jobset(rendered.jobset)
    assert main(["render", "-f", str(path)]) == 0
    kinds = ["ConfigMap", "Job" if training.spec.mode == "evaluate" else "JobSet"]
    assert [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)] == kinds


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.relative_to(ROOT).as_posix() for p in EXAMPLES])
def test_example_passes_the_translation_training_crd(path):
    # What `kubectl apply` would check: the schema, then CEL on the defaulted object.
    raw = read_yaml(path)
    assert schema_errors(SCHEMA, raw, skip=("metadata",)) == []
    assert cel_failures(SCHEMA, with_defaults(SCHEMA, raw)) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.relative_to(ROOT).as_posix() for p in EXAMPLES])
def test_every_other_document_of_an_example_is_a_claim_its_training_mounts(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert [d["kind"] for d in docs][-1] == "TranslationTraining"  # claims first: `kubectl apply` in order
    claimed = {v.persistent_volume_claim.claim_name for v in load_training(path).spec.volumes
               if v.persistent_volume_claim}
    for doc in docs[:-1]:
        assert doc["kind"] == "PersistentVolumeClaim" and doc["metadata"]["name"] in claimed, path.name
        assert doc["metadata"].get("namespace") == docs[-1]["metadata"].get("namespace")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.relative_to(ROOT).as_posix() for p in EXAMPLES])
def test_multi_node_examples_keep_their_checkpoints_on_a_claim(path):
    spec = load_training(path).spec
    if spec.nodes > 1:
        checkpoints = spec.volume_for("checkpoints")
        assert checkpoints is not None and checkpoints.persistent_volume_claim is not None, path.name


def test_the_cpu_quickstart_ships_a_read_write_many_claim_for_its_checkpoints():
    path = EXAMPLES_DIR / "quickstart-cpu.yaml"
    claim, training = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert claim["kind"] == "PersistentVolumeClaim" and training["kind"] == "TranslationTraining"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "storageClassName" not in claim["spec"]  # the comment says which class to set
    text = path.read_text()
    assert "storageClassName" in text and "EFS" in text and "Filestore" in text
    spec = load_training(path).spec
    assert spec.volume_for("checkpoints").persistent_volume_claim.claim_name == claim["metadata"]["name"]
    # two pods of it run on the real-node test's one 2-core node
    assert (spec.resources.cpu, spec.resources.memory, spec.resources.shm_size) == ("1", "3Gi", "1Gi")
