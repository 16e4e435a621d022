"""Beam settings: spec.evaluation's lengthPenalty, noRepeatNgramSize, maxLengthRatio/Offset and the
same flags on `rosetta evaluate` and `rosetta translate`, down to what generate() does with them."""

import pytest
import torch

from rosetta_contract.documents import parse_document
from rosetta_contract.evaluation_fields import EvaluationSpec
from rosetta_contract.strict_model import ConfigError
from rosetta_trainer.commands.arguments import generation_overrides
from rosetta_trainer.commands.cli import build_parser
from rosetta_trainer.evaluation.evaluate import Generation, translate
from support.tiny_models import SOURCES, tiny_model, tiny_tokenizer
from support.training import TINY, deep_update

CPU = torch.device("cpu")
EOS = 1


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def outputs(model, tokenizer, generation) -> list[list[int]]:
    """Generated token ids per source (one at a time: no padding), without the start token and EOS."""
    ids = []
    for source in SOURCES:
        enc = tokenizer([source], return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=generation.budget(enc["input_ids"].shape[1]),
                             **generation.search_kwargs())[0, 1:].tolist()
        ids.append([t for t in out if t not in (EOS, tokenizer.pad_token_id)])
    return ids


def test_spec_defaults_and_fields():
    ev = parse_document(TINY).spec.evaluation
    assert (ev.length_penalty, ev.no_repeat_ngram_size, ev.max_length_ratio, ev.max_length_offset) == (1.0, 0, 2.0, 10)
    assert Generation.from_spec(EvaluationSpec()) == Generation()  # the same defaults in both places
    spec = parse_document(deep_update(TINY, {"spec": {"evaluation": {
        "beams": 5, "lengthPenalty": 0.6, "noRepeatNgramSize": 3, "maxLengthRatio": 1.5, "maxLengthOffset": 5,
        "maxNewTokens": 200}}})).spec
    assert Generation.from_spec(spec.evaluation) == Generation(beams=5, length_penalty=0.6, no_repeat_ngram_size=3,
                                                               max_length_ratio=1.5, max_length_offset=5,
                                                               max_new_tokens=200)
    off = parse_document(deep_update(TINY, {"spec": {"evaluation": {"maxLengthRatio": None}}})).spec.evaluation
    assert Generation.from_spec(off).budget(1000) == 24  # TINY's maxNewTokens


@pytest.mark.parametrize("field, value", [("lengthPenalty", 11), ("noRepeatNgramSize", -1), ("maxLengthRatio", 0),
                                          ("maxLengthOffset", -1)])
def test_spec_bounds(field, value):
    with pytest.raises(ConfigError, match=f"spec.evaluation.{field}"):
        parse_document(deep_update(TINY, {"spec": {"evaluation": {field: value}}}))


@pytest.mark.parametrize("command", ["evaluate", "translate"])
def test_command_line_flags_override_the_spec(command):
    spec = parse_document(deep_update(TINY, {"spec": {"evaluation": {"beams": 5, "lengthPenalty": 0.6}}})).spec
    args = build_parser().parse_args([command, "--checkpoint", "c", "--beams", "2", "--no-repeat-ngram-size", "3",
                                      "--max-length-ratio", "1.2", "--max-length-offset", "4", "--max-new-tokens", "50"])
    assert Generation.from_spec(spec.evaluation, generation_overrides(args)) == Generation(
        beams=2, length_penalty=0.6, no_repeat_ngram_size=3, max_length_ratio=1.2, max_length_offset=4,
        max_new_tokens=50)
    args = build_parser().parse_args([command, "--checkpoint", "c", "--max-length-ratio", "none",
                                      "--length-penalty", "1.4"])
    assert generation_overrides(args) == {"max_length_ratio": None, "length_penalty": 1.4}
    assert generation_overrides(build_parser().parse_args([command, "--checkpoint", "c"])) == {}


@pytest.mark.parametrize("flag, value", [("--beams", "0"), ("--max-length-ratio", "-1"), ("--max-length-ratio", "inf"),
                                         ("--no-repeat-ngram-size", "-2"), ("--max-new-tokens", "0")])
def test_bad_flags_are_refused(flag, value, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["translate", "--checkpoint", "c", flag, value])
    assert flag in capsys.readouterr().err


def test_beam_only_settings_reach_generate_only_with_beams():
    assert Generation(beams=1, length_penalty=2.0).search_kwargs() == {"num_beams": 1, "do_sample": False}
    assert Generation(beams=4, length_penalty=2.0, no_repeat_ngram_size=2).search_kwargs() == {
        "num_beams": 4, "do_sample": False, "early_stopping": True, "length_penalty": 2.0, "no_repeat_ngram_size": 2}


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_size_removes_repeats(tokenizer, n):
    model = tiny_model(tokenizer, seed=3)
    repeated = lambda ids: len({tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)}) < len(ids) - n + 1  # noqa: E731
    base = Generation(beams=1, max_new_tokens=30)
    # The untrained model repeats itself ("years years years ..."); with the setting no n-gram recurs.
    assert any(repeated(ids) for ids in outputs(model, tokenizer, base))
    for ids in outputs(model, tokenizer, Generation(beams=1, max_new_tokens=30, no_repeat_ngram_size=n)):
        assert not repeated(ids), ids
    for ids in outputs(model, tokenizer, Generation(beams=3, max_new_tokens=30, no_repeat_ngram_size=n)):
        assert not repeated(ids), ids


def test_length_penalty_favours_longer_or_shorter_beams(tokenizer):
    model = tiny_model(tokenizer, seed=3)
    # An end-of-sentence token that competes with going on: too weak and every beam runs to the
    # limit, too strong and every beam stops at once (the bias that does it depends on the tiny
    # tokenizer's vocabulary: 4.5 gives 36 / 94 / 163 tokens for the three penalties).
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = 4.5
    total = {}
    for penalty in (-1.0, 1.0, 3.0):
        total[penalty] = sum(map(len, outputs(model, tokenizer, Generation(beams=4, max_new_tokens=40,
                                                                              length_penalty=penalty))))
    assert total[-1.0] < total[1.0] < total[3.0], total
    # and translate() passes it on: the same outputs as generate() with it
    got = translate(model, tokenizer, SOURCES, generation=Generation(beams=4, max_new_tokens=40, length_penalty=3.0),
                    batch_sentences=1, device=CPU)
    assert sum(len(tokenizer(text).input_ids) - 1 for text in got) >= total[1.0]
