"""`rosetta export --format ctranslate2`: a checkpoint converted for serving (evaluation/export.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rosetta_trainer.evaluation.ctranslate2_models import ExportError
from rosetta_trainer.evaluation.export import export_ctranslate2


def export_command(args: argparse.Namespace) -> int:
    import transformers

    transformers.utils.logging.disable_progress_bar()  # per-file loading bars: noise in a command's output
    if args.format == "onnx":
        raise ExportError("--format onnx is not supported yet: Hugging Face Optimum's ONNX exporter for "
                          "encoder-decoders (optimum-onnx 0.1) needs transformers < 4.58 and Rosetta runs "
                          "transformers 5; use --format ctranslate2 (docs/training.md)")
    out = export_ctranslate2(Path(args.checkpoint), Path(args.output), args.quantization)
    print(f"exported {args.checkpoint} to {out} (CTranslate2)")
    return 0
