"""A T5 with more decoder than encoder layers generates (greedy and beam), in evaluation and
translation: generate()'s cache is sized by the encoder's depth otherwise, and indexed past its end."""

import pytest
import torch

from rosetta_contract.model_fields import ModelSpec, TokenizerTraining
from rosetta_trainer.data import corpus
from rosetta_trainer.evaluation.evaluate import Generation, translate
from rosetta_trainer.models.models import build_model
from rosetta_trainer.models.tokenization import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    pairs = corpus.generate_pairs("de", 300, seed=1)
    return train_tokenizer(TokenizerTraining.model_validate({"type": "unigram", "vocabSize": 300}), pairs,
                           tmp_path_factory.mktemp("tokenizer"))


@pytest.mark.parametrize("architecture", ["t5", "transformer"])
@pytest.mark.parametrize("encoder, decoder", [(1, 3), (3, 1), (2, 2)])
@pytest.mark.parametrize("beams", [1, 3])
def test_any_encoder_and_decoder_depth_translates(tokenizer, architecture, encoder, decoder, beams):
    torch.manual_seed(0)
    model = build_model(ModelSpec.model_validate({"architecture": architecture, "size": "tiny", "dModel": 32,
                                                  "encoderLayers": encoder, "decoderLayers": decoder, "heads": 2,
                                                  "ffnDim": 64}), vocab_size=len(tokenizer), max_length=64).eval()
    sources = ["five cars", "We need nine blue birds.", "three"]
    out = translate(model, tokenizer, sources, generation=Generation(beams=beams, max_new_tokens=6),
                    batch_sentences=2, device=torch.device("cpu"))
    assert len(out) == 3 and all(isinstance(text, str) for text in out)
    # The cache changes nothing of what is generated: the same as generate() without any cache.
    generation = Generation(beams=beams, max_new_tokens=6)
    (alone,) = translate(model, tokenizer, sources[:1], generation=generation, batch_sentences=1,
                         device=torch.device("cpu"))
    enc = tokenizer(sources[:1], return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**enc, max_new_tokens=generation.budget(enc["input_ids"].shape[1]), use_cache=False,
                             **generation.search_kwargs())
    assert alone == tokenizer.decode(ids[0], skip_special_tokens=True).strip()
