"""Checkpoint averaging (`rosetta average`, checkpoint.average) on tiny models saved as checkpoints."""

import json

import pytest
import torch

from rosetta_cli.main import main
from rosetta_trainer.checkpoints.averaging import AveragingError, average_checkpoints, average_models, select
from rosetta_trainer.evaluation.evaluate import Generation, translate
from rosetta_trainer.evaluation.inference import load_checkpoint_for_inference
from rosetta_trainer.models.models import load_pretrained
from support.tiny_models import SOURCES, save_checkpoint, tiny_model, tiny_tokenizer

CPU = torch.device("cpu")
SCORES = {100: 10.0, 200: 30.0, 300: 20.0, 400: None, 500: 25.0}  # step -> validation BLEU (400: not evaluated)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer):
    """A checkpoint directory with five checkpoints of one model (different weights and
    final_logits_bias buffers), plus a stale temporary directory and an incomplete one."""
    root = tmp_path_factory.mktemp("run") / "checkpoints"
    models = {}
    for seed, (step, bleu) in enumerate(SCORES.items()):
        model = tiny_model(tokenizer, seed=seed)
        model.final_logits_bias.fill_(float(step))  # a buffer: taken from the newest, never averaged
        save_checkpoint(root, step, model, tokenizer, bleu)
        models[step] = model
    (root / "step-00000600" / "model").mkdir(parents=True)  # no COMPLETE marker: never chosen
    (root / ".tmp-step-00000700").mkdir()
    return root, models


def test_last_n_is_the_newest_complete(run):
    root, _ = run
    assert [p.name for p in select(root, last=3)] == ["step-00000300", "step-00000400", "step-00000500"]


def test_best_n_ranks_by_validation_score_and_skips_unscored(run):
    root, _ = run
    assert [p.name for p in select(root, best=3)] == ["step-00000200", "step-00000300", "step-00000500"]
    with pytest.raises(AveragingError, match="only 4 of the 5 complete checkpoints"):
        select(root, best=5)


def test_too_few_checkpoints_is_one_clear_error(run):
    root, _ = run
    with pytest.raises(AveragingError, match=r"last 6: .* holds only 5 complete checkpoint\(s\)"):
        select(root, last=6)
    with pytest.raises(AveragingError, match="holds no complete checkpoint"):
        select(root / "missing", last=2)


def test_parameters_are_the_fp32_mean_and_buffers_the_newest(run):
    root, models = run
    averaged = average_models(select(root, last=3)).state_dict()
    chosen = [models[s].state_dict() for s in (300, 400, 500)]
    for key, value in averaged.items():
        if key == "final_logits_bias":
            assert torch.equal(value, chosen[-1][key])  # the newest's buffer
        elif key.endswith("embed_positions.weight"):
            assert torch.equal(value, chosen[-1][key])  # frozen sinusoids: constants, not averaged
        else:
            expected = sum(s[key].double() for s in chosen) / 3
            torch.testing.assert_close(value.double(), expected, rtol=0, atol=1e-6, msg=key)
            assert value.dtype == chosen[-1][key].dtype
    # The model is really a different one: not any of the three.
    assert not any(torch.equal(averaged["model.shared.weight"], s["model.shared.weight"]) for s in chosen)


def test_half_precision_weights_are_summed_in_fp32(tmp_path, tokenizer):
    root = tmp_path / "checkpoints"
    big, small = tiny_model(tokenizer, seed=1).half(), tiny_model(tokenizer, seed=2).half()
    with torch.no_grad():  # fp16 overflows at 65504: a sum in fp16 would be inf
        big.lm_head.weight.fill_(60000.0)
        small.lm_head.weight.fill_(60000.0)
    save_checkpoint(root, 1, big, tokenizer)
    save_checkpoint(root, 2, small, tokenizer)
    weight = average_models(select(root, last=2)).lm_head.weight
    assert weight.dtype == torch.float16 and torch.all(weight == 60000.0)


def test_different_models_are_refused(tmp_path, tokenizer):
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, tiny_model(tokenizer, seed=1), tokenizer)
    save_checkpoint(root, 2, tiny_model(tokenizer, seed=2, ffnDim=48), tokenizer)
    with pytest.raises(AveragingError, match=r"step-00000002 and step-00000001 are not the same model: "
                                             r".*fc1.weight has shape \(48, 32\) in step-00000002 and \(64, 32\)"):
        average_models(select(root, last=2))
    save_checkpoint(root, 3, tiny_model(tokenizer, seed=3, decoderLayers=2), tokenizer)
    with pytest.raises(AveragingError, match="step-00000003 and step-00000002 are not the same model: "
                                             "step-00000003 has weights model.decoder.layers.1"):
        average_models(select(root, last=2))


def test_the_average_loads_and_translates_like_a_checkpoint(run, tmp_path):
    root, _ = run
    out = average_checkpoints(select(root, best=2), tmp_path / "averaged", "best 2")
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "model", "tokenizer", "training.yaml"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["averaged"] == ["step-00000200", "step-00000500"] and meta["selection"] == "best 2"
    assert meta["steps"] == [200, 500] and meta["scores"] == [30.0, 25.0] and meta["step"] == 500
    model, tokenizer, spec = load_checkpoint_for_inference(out, CPU)
    assert spec is not None and spec.data.target_langs == ["de"]
    assert len(translate(model, tokenizer, SOURCES[:3], generation=Generation(beams=1, max_new_tokens=8),
                         batch_sentences=4, device=CPU)) == 3
    torch.testing.assert_close(load_pretrained(str(out / "model")).state_dict(), model.state_dict())
    assert not list(tmp_path.glob(".tmp-*"))  # renamed into place


def test_average_command(run, tmp_path, capsys):
    root, _ = run
    out = tmp_path / "avg"
    assert main(["average", "--checkpoints", str(root), "--last", "2", "-o", str(out)]) == 0
    assert "averaged step-00000400, step-00000500 into" in capsys.readouterr().out
    assert json.loads((out / "meta.json").read_text())["selection"] == "last 2"
    # A second run replaces the result whole.
    assert main(["average", "--checkpoints", str(root), "--best", "2", "-o", str(out)]) == 0
    assert json.loads((out / "meta.json").read_text())["averaged"] == ["step-00000200", "step-00000500"]


def test_average_command_errors_are_one_line(run, tmp_path, capsys):
    root, _ = run
    assert main(["average", "--checkpoints", str(root), "--last", "9", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "holds only 5 complete checkpoint(s)" in err
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit):  # argparse: exactly one of --last and --best
        main(["average", "--checkpoints", str(root), "--last", "2", "--best", "2", "-o", str(tmp_path / "x")])
