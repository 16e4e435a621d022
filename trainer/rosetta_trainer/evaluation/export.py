"""Export a trained model for serving: CTranslate2 (`rosetta export --format ctranslate2`).

CTranslate2 runs Transformer encoder-decoders with its own C++ kernels (int8/fp16 weights,
several times the tokens/s of `generate()` on CPUs and GPUs). Its converter for Hugging Face
models takes a loaded model and tokenizer; Rosetta hands it the checkpoint's (a DDP, DeepSpeed,
averaged or exported model directory, gathered from ZeRO shards where needed).

Which models convert:
* t5 (from scratch or T5/flan-T5 weights): CTranslate2's T5 loader, with the output scaling
  read from transformers 5's `scale_decoder_outputs` (CTranslate2 guesses it from
  tie_word_embeddings, which transformers 5 sets on every T5 config).
* transformer (from scratch, a MarianConfig) and Marian weights (opus-mt): our own loader.
  CTranslate2's Marian loader expects the layout of the converted opus-mt models, "<pad>" as the
  last token and a decoder that starts from a zero vector; Rosetta's tokenizers put "<pad>" at
  id 0, and the tied output projection trains the pad row, so the decoder starts from that
  row's embedding, as `generate()` does. All tokens are kept.
* other seq2seq configs CTranslate2 knows (BART, mBART, M2M100, ...): its own loaders, untested here.

The export directory holds CTranslate2's files (model.bin, config.json, shared_vocabulary.json),
the tokenizer (tokenizer.json ...), training.yaml and export.json (what the model came from and
how `generate()` stopped, so that `rosetta translate`/`evaluate` on the export, or the
`CTranslate2Model` class, decode the same way).

ONNX is not exported (docs/training.md, "Export for serving", says why).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rosetta_trainer.evaluation.ctranslate2_models import (
    EXPORT_FILE,
    ExportError,
    import_ctranslate2,
    is_ctranslate2_dir,
)
from rosetta_trainer.evaluation.inference import load_checkpoint_for_inference

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

FORMATS = ("ctranslate2", "onnx")


# ctranslate2 ships no annotations: its loaders, specs and converters are Any here.
def _loader(config: PretrainedConfig) -> Any:
    """A CTranslate2 model loader (model, tokenizer) -> spec for this transformers config."""
    ctranslate2 = import_ctranslate2()
    from ctranslate2.converters import transformers as ct2

    if config.model_type in ("t5", "mt5"):
        class T5(ct2.T5Loader):  # type: ignore[misc]
            def get_model_spec(self, model: PreTrainedModel) -> Any:
                spec = super().get_model_spec(model)
                scale = getattr(model.config, "scale_decoder_outputs", None)
                if scale is not None:
                    spec.decoder.scale_outputs = model.config.d_model ** -0.5 if scale else \
                        ctranslate2.specs.model_spec.OPTIONAL
                return spec

        return T5()
    if config.model_type == "marian":
        if not getattr(config, "share_encoder_decoder_embeddings", True) or \
                (config.decoder_vocab_size or config.vocab_size) != config.vocab_size:
            raise ExportError("a Marian model with separate source and target vocabularies cannot be "
                              "exported (one shared vocabulary is what Rosetta trains)")

        class Marian(ct2.BartLoader):  # type: ignore[misc]
            @property
            def architecture_name(self) -> str:
                return "MarianMTModel"

            def get_model_spec(self, model: PreTrainedModel) -> Any:
                # Post-norm, no layer norm on the embeddings (BartLoader reads these two).
                model.config.normalize_before = False
                model.config.normalize_embedding = False
                return super().get_model_spec(model)

            def set_config(self, config: Any, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
                config.bos_token = tokenizer.pad_token
                config.eos_token = tokenizer.eos_token
                config.unk_token = tokenizer.unk_token
                config.decoder_start_token = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)

            def get_vocabulary(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[str]:
                tokens: list[str] = super().get_vocabulary(model, tokenizer)
                # Rows of the embedding no token maps to (a vocabulary rounded up): unreachable names.
                return tokens + [f"<unused_{i}>" for i in range(model.config.vocab_size - len(tokens))]

        return Marian()
    loader = ct2._MODEL_LOADERS.get(type(config).__name__)
    if loader is None:
        raise ExportError(f"CTranslate2 cannot convert a {config.model_type} model "
                          f"(it converts {', '.join(sorted(ct2._MODEL_LOADERS))})")
    return loader


def export_ctranslate2(checkpoint: Path, out: Path, quantization: str | None = None) -> Path:
    """Convert a checkpoint (or an averaged/exported model directory) into a CTranslate2 model
    directory at `out`, atomically (a temporary directory renamed into place)."""
    import torch

    ctranslate2 = import_ctranslate2()
    checkpoint, out = Path(checkpoint), Path(out)
    if is_ctranslate2_dir(checkpoint):
        raise ExportError(f"{checkpoint} is already a CTranslate2 export")
    model, tokenizer, _spec = load_checkpoint_for_inference(checkpoint, torch.device("cpu"))
    model = model.float().eval()  # the converter stores what it is given; quantization is its own step
    loader = _loader(model.config)

    # A module attribute read at run time (ctranslate2 ships no annotations), not a type mypy can see.
    class Loaded(ctranslate2.converters.Converter):  # type: ignore[misc, name-defined]
        def _load(self) -> Any:
            with torch.no_grad():
                return loader(model, tokenizer)

    tmp = out.parent / f".tmp-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        Loaded().convert(str(tmp), quantization=quantization, force=True)
    except (ValueError, NotImplementedError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"CTranslate2 could not convert {checkpoint}: {exc}") from None
    written = set(os.listdir(tmp))
    tok_dir = tmp / ".tokenizer"
    tokenizer.save_pretrained(tok_dir)
    for item in tok_dir.iterdir():
        if item.name not in written:  # never over the converter's config.json
            os.replace(item, tmp / item.name)
    shutil.rmtree(tok_dir)
    if (checkpoint / "training.yaml").is_file():
        shutil.copy2(checkpoint / "training.yaml", tmp / "training.yaml")
    generation = model.generation_config
    bad_words = [tokenizer.convert_ids_to_tokens(ids) for ids in (generation.bad_words_ids or [])]
    (tmp / EXPORT_FILE).write_text(json.dumps({
        "format": "ctranslate2",
        "ctranslate2": ctranslate2.__version__,
        "source": str(checkpoint),
        "model_type": model.config.model_type,
        "quantization": quantization,
        # generate() replaces the last token a length limit allows with EOS; CTranslate2 just stops.
        "forced_eos": generation.forced_eos_token_id is not None,
        "suppress_sequences": bad_words,
    }, indent=2))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


