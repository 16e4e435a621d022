"""Runs inside the trainer image (tests/images/test_images.py): the project's own model code builds
a tiny T5, one forward/backward/optimizer step runs on the CPU, and DeepSpeed imports.

    docker run --rm -i --entrypoint python rosetta-trainer:test - < tests/images/smoke.py
"""

import math
import os

import deepspeed
import torch
import transformers

from rosetta_contract.model_fields import ModelSpec
from rosetta_trainer.models.losses import label_smoothed_cross_entropy
from rosetta_trainer.models.models import build_model

torch.manual_seed(0)
spec = ModelSpec(architecture="t5", size="tiny", d_model=32, heads=4, ffn_dim=64, encoder_layers=1,
                 decoder_layers=1)
model = build_model(spec, vocab_size=64, max_length=16)
assert type(model).__name__ == "T5ForConditionalGeneration", type(model)
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

source = torch.randint(3, 64, (4, 12))
labels = torch.randint(3, 64, (4, 10))
before = [p.detach().clone() for p in model.parameters()]
out = model(input_ids=source, attention_mask=torch.ones_like(source), labels=labels)
loss = label_smoothed_cross_entropy(out.logits, labels, smoothing=0.1) / labels.numel()
loss.backward()
optimizer.step()

assert math.isfinite(loss.item()), loss
assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())), "the step changed nothing"
print(f"smoke ok: uid {os.getuid()} loss {loss.item():.4f} torch {torch.__version__} "
      f"transformers {transformers.__version__} deepspeed {deepspeed.__version__}")
