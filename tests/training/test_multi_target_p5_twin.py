"""The flan-T5-XL multi-target fine-tune (manifests/examples/flan-t5-xl-deepspeed-p5.yaml), CPU-sized:
the example's own document with a tiny pretrained T5 in place of flan-t5-xl, two CPU processes in
place of eight H100s and two of its five languages. `rosetta run` trains one model from per-language
Parquet files (globs of OPUS-100's layout, nested translation records) under DeepSpeed ZeRO-1 with
task prefixes, validates on MT-GenEval during training and tests on it at the end, with BLEU, chrF
and the gender figures per language."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import yaml
from test_evaluation_only_run import LANGS, write_mtgeneval

from rosetta_operator.local.runner import run
from support.tiny_models import PAIRS, tiny_model, tiny_tokenizer
from support.training import read_jsonl

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "examples" / "flan-t5-xl-deepspeed-p5.yaml"


def opus_like(root: Path) -> None:
    """OPUS-100's layout: <pair>/{train,validation,test}-00000-of-00001.parquet, {translation: {en, xx}}."""
    datasets.disable_progress_bars()
    for lang in LANGS:
        folder = root / "opus-100" / ("de-en" if lang == "de" else f"en-{lang}")
        folder.mkdir(parents=True)
        rows = [{"translation": {"en": en, lang: f"{xx} ({lang})"}} for en, xx in PAIRS[:120]]
        for split, part in (("train", rows[:100]), ("validation", rows[100:110]), ("test", rows[110:])):
            datasets.Dataset.from_list(part).to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))


def test_the_p5_example_trains_one_model_for_several_targets_with_gender_scores(tmp_path):
    corpora = tmp_path / "corpora"
    opus_like(corpora)
    write_mtgeneval(corpora / "mt-geneval", split="dev")
    write_mtgeneval(corpora / "mt-geneval", split="test")
    pretrained = tmp_path / "flan-t5-tiny"
    tokenizer = tiny_tokenizer(pretrained)
    tiny_model(tokenizer, architecture="t5").save_pretrained(pretrained)

    doc = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "TranslationTraining")
    spec = doc["spec"]
    spec["data"]["train"] = [src for src in spec["data"]["train"] if src["targetLang"] in LANGS]
    assert len(spec["data"]["train"]) == len(LANGS) and spec["data"]["train"][0]["format"] == "parquet"
    spec["data"]["targetLangs"] = list(LANGS)
    spec["data"].update(maxSourceLength=48, maxTargetLength=48)
    spec["model"]["name"] = str(pretrained)
    # CPU-sized: one pod of two processes; the example's DeepSpeed ZeRO-1, evaluation and metrics kept.
    for field in ("launcher", "network", "scheduling", "serviceAccountName", "podSecurity", "env"):
        spec.pop(field, None)
    spec.update(nodes=1, gpusPerNode=0, procsPerNode=2, resources={"cpu": 1, "memory": "3Gi", "shmSize": "1Gi"})
    spec["training"].update(maxSteps=4, batch={"sentences": 4}, gradientAccumulation=1, warmupSteps=1,
                            precision="fp32", device="cpu", logInterval=1)
    spec["checkpoint"].update(interval=4, keep=1)
    spec["evaluation"].update(interval=4, beams=1, maxSamples=12, maxNewTokens=8)
    spec["metrics"] = {"port": 0}
    assert spec["distributed"] == {"backend": "deepspeed", "zeroStage": 1}
    assert spec["evaluation"]["metrics"] == ["bleu", "chrf", "gender"]
    path = tmp_path / "p5-twin.yaml"
    path.write_text(yaml.safe_dump(doc))

    out = tmp_path / "run"
    code = run(str(path), output=str(out), volumes=[f"corpus={corpora}", f"runs={tmp_path / 'runs'}"],
               progress=False, quiet=True)
    report = json.loads((out / "run.json").read_text())
    assert code == 0 and report["phase"] == "Succeeded", report
    trainer_out = Path(report["trainer_output"])
    summary = json.loads((trainer_out / "summary.json").read_text())
    assert summary["steps"] == 4
    evals = read_jsonl(trainer_out / "eval.jsonl")
    for split in ("validation", "test"):
        (record,) = [r for r in evals if r["split"] == split][-1:]
        assert sorted(record["langs"]) == list(LANGS), (split, record)
        for lang in LANGS:
            figures = record["langs"][lang]
            assert 0 <= figures["bleu"] <= 100 and 0 <= figures["chrf"] <= 100
            assert {"bleu_feminine", "bleu_masculine", "gender_gap_bleu"} <= set(figures["gender"]), (split, lang)
