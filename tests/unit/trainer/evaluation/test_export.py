"""`rosetta export --format ctranslate2`: the exported model translates like the PyTorch one."""

import json

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, T5Config

from rosetta_cli.main import main
from rosetta_trainer.evaluation.ctranslate2_models import CTranslate2Model, ExportError, is_ctranslate2_dir
from rosetta_trainer.evaluation.evaluate import Generation, translate
from rosetta_trainer.evaluation.export import export_ctranslate2
from rosetta_trainer.evaluation.inference import load_checkpoint_for_inference
from rosetta_trainer.models.models import untie_output
from support.tiny_models import PAIRS, SOURCES, redraw, save_checkpoint, tiny_model, tiny_tokenizer

pytest.importorskip("ctranslate2", reason="CTranslate2 is the [export] extra (make install puts it in)")

CPU = torch.device("cpu")


def flan_style(tokenizer):
    """T5 v1.1 / flan-T5's shape: gated-GELU feed-forward and an output projection of its own,
    whose input is not rescaled (transformers 5 keeps that as scale_decoder_outputs=False)."""
    config = T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1,
                      num_heads=2, dropout_rate=0.0, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    assert config.scale_decoder_outputs is False
    model = AutoModelForSeq2SeqLM.from_config(config)
    untie_output(model)
    redraw(model, seed=0)
    return model.eval()


MODELS = {
    "transformer": lambda tok: tiny_model(tok, "transformer", decoderLayers=2),
    "t5": lambda tok: tiny_model(tok, "t5"),
    "t5-untied": flan_style,
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory, tokenizer):
    tmp = tmp_path_factory.mktemp(request.param)
    model = MODELS[request.param](tokenizer)
    checkpoint = save_checkpoint(tmp / "checkpoints", 10, model, tokenizer)
    return request.param, model, checkpoint, export_ctranslate2(checkpoint, tmp / "ct2")


def test_greedy_translations_equal_pytorch(exported, tokenizer):
    name, model, _, out = exported
    ct2 = CTranslate2Model(out, "cpu")
    # Batches of 4 (padding inside a batch) and one sentence at a time; a budget most outputs
    # hit (an untrained model rarely stops), so the length limits must agree too.
    for batch in (4, 1):
        generation = Generation(beams=1, max_new_tokens=30)
        ours = translate(model, tokenizer, SOURCES, generation=generation, batch_sentences=batch, device=CPU)
        theirs = ct2.translate(SOURCES, generation=generation, batch_sentences=batch)
        assert theirs == ours, name
    assert len(set(ours)) > 3, "the model should translate different sources differently"


@pytest.mark.parametrize("penalty", [1.0, 0.6])
def test_beam_search_equals_pytorch(exported, tokenizer, penalty):
    # Measured equal for these models; with noRepeatNgramSize the two beam searches can keep
    # different hypotheses (docs/training.md), so it is not compared.
    name, model, _, out = exported
    generation = Generation(beams=4, max_new_tokens=30, length_penalty=penalty)
    ours = translate(model, tokenizer, SOURCES, generation=generation, batch_sentences=1, device=CPU)
    assert CTranslate2Model(out, "cpu").translate(SOURCES, generation=generation, batch_sentences=1) == ours, name


def test_log_probabilities_equal_pytorch(exported, tokenizer):
    """Teacher-forced scores of reference translations (EOS included): the same distribution, not
    only the same argmax (greedy search cannot tell a rescaled output layer from the right one)."""
    name, model, _, out = exported
    ct2 = CTranslate2Model(out, "cpu")
    sources = [tokenizer(s).input_ids for s in SOURCES[:4]]
    targets = [tokenizer(t).input_ids[:-1] for _, t in PAIRS[:4]]  # CTranslate2 appends the EOS itself
    results = ct2.translator.score_batch([tokenizer.convert_ids_to_tokens(s) for s in sources],
                                         [tokenizer.convert_ids_to_tokens(t) for t in targets])
    for source, target, result in zip(sources, targets, results):
        labels = torch.tensor([target + [tokenizer.eos_token_id]])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([source]), labels=labels).logits
        expected = torch.log_softmax(logits, -1)[0].gather(-1, labels[0][:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, rtol=0, atol=1e-4, msg=name)


def test_the_export_directory(exported):
    name, _, checkpoint, out = exported
    files = {p.name for p in out.iterdir()}
    assert {"model.bin", "config.json", "shared_vocabulary.json", "tokenizer.json", "training.yaml",
            "export.json"} <= files
    info = json.loads((out / "export.json").read_text())
    assert info["format"] == "ctranslate2" and info["source"] == str(checkpoint)
    assert info["forced_eos"] is (name == "transformer")  # MarianConfig sets forced_eos_token_id
    assert is_ctranslate2_dir(out) and not is_ctranslate2_dir(checkpoint)
    assert not list(out.parent.glob(".tmp-*"))


def test_translate_and_evaluate_load_an_export(exported, tokenizer):
    _, model, _, out = exported
    ct2, tok, spec = load_checkpoint_for_inference(out, CPU)
    assert ct2.is_ctranslate2 and spec is not None and spec.data.source_lang == "en"
    generation = Generation(beams=1, max_new_tokens=12)
    assert translate(ct2, tok, SOURCES[:3], generation=generation, batch_sentences=2, device=CPU) == \
        translate(model, tokenizer, SOURCES[:3], generation=generation, batch_sentences=2, device=CPU)


def test_export_and_translate_commands(tmp_path, tokenizer, capsys):
    checkpoint = save_checkpoint(tmp_path / "checkpoints", 10, tiny_model(tokenizer), tokenizer)
    out = tmp_path / "ct2"
    assert main(["export", "--checkpoint", str(checkpoint), "--format", "ctranslate2", "-o", str(out),
                 "--quantization", "int8"]) == 0
    assert json.loads((out / "export.json").read_text())["quantization"] == "int8"
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(out), "--beams", "2", "--max-new-tokens", "5", *SOURCES[:2]]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_export_errors_are_one_line(tmp_path, tokenizer, capsys):
    checkpoint = save_checkpoint(tmp_path / "checkpoints", 10, tiny_model(tokenizer), tokenizer)
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(checkpoint), "--format", "onnx", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --format onnx is not supported yet") and "\n" not in err
    out = export_ctranslate2(checkpoint, tmp_path / "ct2")
    with pytest.raises(ExportError, match="already a CTranslate2 export"):
        export_ctranslate2(out, tmp_path / "again")
    assert main(["export", "--checkpoint", str(checkpoint), "--format", "ctranslate2", "-o", str(tmp_path / "q"),
                 "--quantization", "int3"]) == 2
    assert "CTranslate2 could not convert" in capsys.readouterr().err
    assert not (tmp_path / "q").exists() and not (tmp_path / ".tmp-q").exists()
