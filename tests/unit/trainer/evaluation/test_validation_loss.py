"""evaluate.validation_loss: the training criterion, teacher-forced, on the evaluation set."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from rosetta_contract.config import TrainerSpec
from rosetta_trainer.data.batching import IGNORE_INDEX, collate, encode
from rosetta_trainer.data.examples import Example
from rosetta_trainer.evaluation.evaluate import validation_loss
from rosetta_trainer.runtime.distributed import World
from support.tiny_models import PAIRS, tiny_model, tiny_tokenizer
from support.training import TINY, deep_update

EXAMPLES = [Example(source=s, target=t, target_lang="de") for s, t in PAIRS[:7]]


def spec(smoothing: float, batch: int) -> TrainerSpec:
    raw = deep_update(TINY["spec"], {"training": {"labelSmoothing": smoothing}, "evaluation": {"batchSentences": batch},
                                     "tokenizer": {"train": None, "path": "unused"}, "metrics": {}})
    raw.pop("tracking", None)
    return TrainerSpec.model_validate(raw, by_name=False)


def reference(model, tokenizer, s: TrainerSpec) -> float:
    """The same figure by the textbook route: every example in one batch, torch's cross_entropy."""
    from rosetta_trainer.evaluation.evaluate import model_inputs

    corpus = encode(tokenizer, model_inputs(EXAMPLES, "en", s.uses_task_prefix()), [e.target for e in EXAMPLES],
                    s.data.max_source_length, s.data.max_target_length)
    batch = collate(corpus, list(range(len(EXAMPLES))), tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])).logits
    return float(F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX,
                                 label_smoothing=s.training.label_smoothing))


@pytest.mark.parametrize("smoothing, batch", [(0.0, 3), (0.1, 2), (0.1, 16)])
def test_equals_cross_entropy_over_all_target_tokens(tmp_path, smoothing, batch):
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    model = tiny_model(tokenizer)
    s = spec(smoothing, batch)
    got = validation_loss(model, tokenizer, EXAMPLES, s, World(0, 0, 1, torch.device("cpu")))
    assert got == pytest.approx(reference(model, tokenizer, s), rel=1e-5)
    assert not model.training


def test_a_compiled_model_is_evaluated_eagerly(tmp_path):
    """training.compile: evaluation's shapes and modes would make the compiled forward recompile."""
    def refuse(graph, example_inputs):
        raise AssertionError("the compiled forward ran")

    tokenizer = tiny_tokenizer(tmp_path / "tok")
    model = tiny_model(tokenizer)
    s, world = spec(0.1, 4), World(0, 0, 1, torch.device("cpu"))
    compiled = torch.compile(model, backend=refuse)
    assert validation_loss(compiled, tokenizer, EXAMPLES, s, world) == validation_loss(model, tokenizer, EXAMPLES, s, world)


def test_no_examples_no_loss(tmp_path):
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    assert validation_loss(tiny_model(tokenizer), tokenizer, [], spec(0.1, 4), World(0, 0, 1, torch.device("cpu"))) is None


SCRIPT = """
import json, sys, torch
from pathlib import Path
from rosetta_trainer.runtime.distributed import close, init_world
from rosetta_trainer.evaluation.evaluate import validation_loss
from support.tiny_models import tiny_model, tiny_tokenizer
from test_validation_loss import EXAMPLES, spec
world = init_world("cpu")
tokenizer = tiny_tokenizer(Path(sys.argv[1]) / f"tok-{world.rank}")
model = tiny_model(tokenizer)
losses = {n: validation_loss(model, tokenizer, EXAMPLES[: int(n)], spec(0.1, 2), world) for n in sys.argv[3:]}
if world.rank == 0:
    Path(sys.argv[2]).write_text(json.dumps(losses))
close(world)
"""


# 7: unequal shares; 1: a rank with nothing to score. Both in one process group: a torchrun
# start is most of this test's time.
COUNTS = (7, 1)


@pytest.mark.slow
def test_ranks_agree_with_one_process(tmp_path):
    import json

    tokenizer = tiny_tokenizer(tmp_path / "tok")
    model = tiny_model(tokenizer)
    alone = {str(n): validation_loss(model, tokenizer, EXAMPLES[:n], spec(0.1, 2), World(0, 0, 1, torch.device("cpu")))
             for n in COUNTS}
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    tests = Path(__file__).resolve().parents[3]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{tests}:{Path(__file__).resolve().parent}"}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script), str(tmp_path), str(tmp_path / "loss.json"), *map(str, COUNTS)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = json.loads((tmp_path / "loss.json").read_text())
    assert ranks.keys() == alone.keys()
    for n, loss in alone.items():
        assert ranks[n] == pytest.approx(loss, rel=1e-5), n
