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

from rosetta_contract.spec import load_saved

EXPORT_FILE = "export.json"
FORMATS = ("ctranslate2", "onnx")


class ExportError(ValueError):
    """The model cannot be exported in this format; one line."""


def _import_ctranslate2():
    try:
        import ctranslate2
        import ctranslate2.converters
    except ImportError:
        raise ExportError("CTranslate2 is not installed: pip install 'rosetta-mt[export]' "
                          "(or pip install ctranslate2)") from None
    return ctranslate2


def _loader(config):
    """A CTranslate2 model loader (model, tokenizer) -> spec for this transformers config."""
    ctranslate2 = _import_ctranslate2()
    from ctranslate2.converters import transformers as ct2

    if config.model_type in ("t5", "mt5"):
        class T5(ct2.T5Loader):
            def get_model_spec(self, model):
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

        class Marian(ct2.BartLoader):
            @property
            def architecture_name(self):
                return "MarianMTModel"

            def get_model_spec(self, model):
                # Post-norm, no layer norm on the embeddings (BartLoader reads these two).
                model.config.normalize_before = False
                model.config.normalize_embedding = False
                return super().get_model_spec(model)

            def set_config(self, config, model, tokenizer):
                config.bos_token = tokenizer.pad_token
                config.eos_token = tokenizer.eos_token
                config.unk_token = tokenizer.unk_token
                config.decoder_start_token = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)

            def get_vocabulary(self, model, tokenizer):
                tokens = super().get_vocabulary(model, tokenizer)
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

    from rosetta_trainer.evaluate import load_checkpoint_for_inference

    ctranslate2 = _import_ctranslate2()
    checkpoint, out = Path(checkpoint), Path(out)
    if is_ctranslate2_dir(checkpoint):
        raise ExportError(f"{checkpoint} is already a CTranslate2 export")
    model, tokenizer, _spec = load_checkpoint_for_inference(checkpoint, torch.device("cpu"))
    model = model.float().eval()  # the converter stores what it is given; quantization is its own step
    loader = _loader(model.config)

    class Loaded(ctranslate2.converters.Converter):
        def _load(self):
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


def is_ctranslate2_dir(path: Path) -> bool:
    path = Path(path)
    if not (path / EXPORT_FILE).is_file():
        return False
    try:
        return json.loads((path / EXPORT_FILE).read_text()).get("format") == "ctranslate2"
    except ValueError:
        return False


class CTranslate2Model:
    """An exported model that `evaluate.translate` drives like a PyTorch one: same length-sorted
    batches, same length budget, same search settings (Generation), same decoding.

        model = CTranslate2Model("runs/x/ct2")
        model.translate(["A man rides a bike."], generation=Generation(beams=4))
    """

    is_ctranslate2 = True

    def __init__(self, path: Path | str, device: str = "auto", compute_type: str = "default", device_index: int = 0):
        from rosetta_trainer.tokenization import load_tokenizer

        ctranslate2 = _import_ctranslate2()
        path = Path(path)
        if device == "auto":
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        self.path, self.device = path, device
        self.info = json.loads((path / EXPORT_FILE).read_text())
        self.translator = ctranslate2.Translator(str(path), device=device, device_index=device_index,
                                                 compute_type=compute_type)
        self.tokenizer = load_tokenizer(str(path))

    def translate(self, sources: list[str], *, generation, batch_sentences: int = 32,
                  max_source_length: int = 512) -> list[str]:
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        out = [""] * len(sources)
        suppress = self.info.get("suppress_sequences") or None
        for start in range(0, len(order), batch_sentences):
            idx = order[start: start + batch_sentences]
            ids = self.tokenizer([sources[i] for i in idx], truncation=True, max_length=max_source_length)["input_ids"]
            budget = generation.budget(max(len(x) for x in ids))
            if self.info.get("forced_eos"):
                budget -= 1  # generate() spends the last step of the budget on a forced EOS
            results = self.translator.translate_batch(
                [self.tokenizer.convert_ids_to_tokens(x) for x in ids],
                beam_size=generation.beams, length_penalty=generation.length_penalty,
                no_repeat_ngram_size=generation.no_repeat_ngram_size, suppress_sequences=suppress,
                max_decoding_length=max(0, budget), min_decoding_length=0, max_input_length=0,
            )
            for i, result in zip(idx, results):
                hypothesis = self.tokenizer.convert_tokens_to_ids(result.hypotheses[0])
                out[i] = self.tokenizer.decode(hypothesis, skip_special_tokens=True).strip()
        return out


def load_ctranslate2(path: Path, device: str = "auto", device_index: int = 0):
    """(model, tokenizer, spec) of a CTranslate2 export, as load_checkpoint_for_inference returns."""
    model = CTranslate2Model(path, device, device_index=device_index)
    spec = None
    if (Path(path) / "training.yaml").is_file():
        spec = load_saved(Path(path) / "training.yaml").spec
    return model, model.tokenizer, spec


def export_command(args) -> int:
    import transformers

    transformers.utils.logging.disable_progress_bar()  # per-file loading bars: noise in a command's output
    if args.format == "onnx":
        raise ExportError("--format onnx is not supported yet: Hugging Face Optimum's ONNX exporter for "
                          "encoder-decoders (optimum-onnx 0.1) needs transformers < 4.58 and Rosetta runs "
                          "transformers 5; use --format ctranslate2 (docs/training.md)")
    out = export_ctranslate2(Path(args.checkpoint), Path(args.output), args.quantization)
    print(f"exported {args.checkpoint} to {out} (CTranslate2)")
    return 0
