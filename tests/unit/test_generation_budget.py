"""Evaluation's generation budget: a model that has not learnt to stop is cut at 2 x source + 10."""

import torch

from rosetta_trainer import corpus
from rosetta_trainer.config import ModelSpec, TokenizerTraining
from rosetta_trainer.evaluate import translate
from rosetta_trainer.models import build_model
from rosetta_trainer.tokenization import train_tokenizer


def test_untrained_model_output_is_capped_by_source_length(tmp_path):
    pairs = corpus.generate_pairs("de", 300, seed=1)
    tokenizer = train_tokenizer(TokenizerTraining.model_validate({"type": "bpe", "vocabSize": 300}), pairs, tmp_path)
    torch.manual_seed(0)
    model = build_model(ModelSpec.model_validate({"architecture": "transformer", "size": "tiny", "dModel": 32,
                                                  "encoderLayers": 1, "decoderLayers": 1, "heads": 2,
                                                  "ffnDim": 64}),
                        vocab_size=len(tokenizer), max_length=256)
    generated = []
    real_generate = model.generate

    def recording_generate(**kwargs):
        ids = real_generate(**kwargs)
        generated.append(ids.shape[1])
        return ids

    model.generate = recording_generate
    sources = ["five cars", "We need nine thousand and forty blue birds."]
    translate(model, tokenizer, sources, beams=1, max_new_tokens=200, batch_sentences=8, device=torch.device("cpu"))
    # one batch, padded to the longer source; the output starts with the decoder start token
    cap = 2 * max(len(tokenizer(s).input_ids) for s in sources) + 10
    assert generated and generated[0] - 1 <= cap < 200, (generated, cap)
    # the untrained model would have gone on: the cap, not an end-of-sentence token, stopped it
    assert generated[0] - 1 == cap
