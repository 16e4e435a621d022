"""A CTranslate2 export loaded and driven like a PyTorch model (evaluation/export.py writes one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rosetta_contract.config import TrainerSpec
from rosetta_contract.saved_training import load_saved
from rosetta_trainer.models.tokenization import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rosetta_trainer.evaluation.evaluate import Generation

EXPORT_FILE = "export.json"


class ExportError(ValueError):
    """The model cannot be exported in this format; one line."""


# ctranslate2 ships no annotations.
def import_ctranslate2() -> Any:
    try:
        import ctranslate2
        import ctranslate2.converters
    except ImportError:
        raise ExportError("CTranslate2 is not installed: pip install 'rosetta-mt[export]' "
                          "(or pip install ctranslate2)") from None
    return ctranslate2


def is_ctranslate2_dir(path: Path) -> bool:
    path = Path(path)
    if not (path / EXPORT_FILE).is_file():
        return False
    try:
        return bool(json.loads((path / EXPORT_FILE).read_text()).get("format") == "ctranslate2")
    except ValueError:
        return False


class CTranslate2Model:
    """An exported model that `evaluate.translate` drives like a PyTorch one: same length-sorted
    batches, same length budget, same search settings (Generation), same decoding.

        model = CTranslate2Model("runs/x/ct2")
        model.translate(["A man rides a bike."], generation=Generation(beams=4))
    """

    is_ctranslate2 = True

    def __init__(self, path: Path | str, device: str = "auto", compute_type: str = "default",
                 device_index: int = 0) -> None:
        ctranslate2 = import_ctranslate2()
        path = Path(path)
        if device == "auto":
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        self.path, self.device = path, device
        self.info = json.loads((path / EXPORT_FILE).read_text())
        self.translator = ctranslate2.Translator(str(path), device=device, device_index=device_index,
                                                 compute_type=compute_type)
        self.tokenizer = load_tokenizer(str(path))

    def translate(self, sources: list[str], *, generation: Generation, batch_sentences: int = 32,
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
                out[i] = cast(str, self.tokenizer.decode(hypothesis, skip_special_tokens=True)).strip()  # one sequence
        return out


def load_ctranslate2(path: Path, device: str = "auto",
                     device_index: int = 0) -> tuple[CTranslate2Model, PreTrainedTokenizerBase, TrainerSpec | None]:
    """(model, tokenizer, spec) of a CTranslate2 export, as load_checkpoint_for_inference returns."""
    model = CTranslate2Model(path, device, device_index=device_index)
    spec: TrainerSpec | None = None
    if (Path(path) / "training.yaml").is_file():
        spec = load_saved(Path(path) / "training.yaml").spec
    return model, model.tokenizer, spec
