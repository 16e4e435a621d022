"""Activation checkpointing: the same loss and gradients as without, for both architectures."""

import pytest
import torch

from rosetta_contract.model_fields import ModelSpec
from rosetta_trainer.engine.backends import enable_activation_checkpointing
from rosetta_trainer.models.models import build_model

VOCAB = 50


def loss_and_grads(architecture: str, checkpointing: bool):
    torch.manual_seed(0)
    spec = ModelSpec(architecture=architecture, size="tiny", d_model=32, encoder_layers=2, decoder_layers=2,
                     heads=2, ffn_dim=64, dropout=0.1)  # dropout on: the recomputed forward must draw the same masks
    model = build_model(spec, vocab_size=VOCAB, max_length=16)
    if checkpointing:
        enable_activation_checkpointing(model)
    model.train()
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, VOCAB, (4, 9), generator=gen)
    labels = torch.randint(3, VOCAB, (4, 7), generator=gen)
    torch.manual_seed(2)
    out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels=labels))
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB), labels.reshape(-1))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("architecture", ["t5", "transformer"])
def test_same_loss_and_gradients_as_without(architecture):
    loss_off, grads_off = loss_and_grads(architecture, checkpointing=False)
    loss_on, grads_on = loss_and_grads(architecture, checkpointing=True)
    torch.testing.assert_close(loss_on, loss_off)
    assert grads_on.keys() == grads_off.keys()
    for name, grad in grads_off.items():
        assert grads_on[name] is not None, f"{name}: no gradient with checkpointing"
        torch.testing.assert_close(grads_on[name], grad, msg=name)
    # gradients reached the first layers, the ones recomputed last
    assert any("layer" in n and ".0." in n and g.abs().sum() > 0 for n, g in grads_on.items())


def test_layers_are_checkpointed_in_training_only():
    spec = ModelSpec(architecture="t5", size="tiny", d_model=32, encoder_layers=1, decoder_layers=1, heads=2, ffn_dim=64)
    model = build_model(spec, vocab_size=VOCAB, max_length=16)
    enable_activation_checkpointing(model)
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    model.eval()  # generation (evaluation) runs the layers once, as without checkpointing
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([[5, 6, 7, 1]]), max_new_tokens=3, num_beams=1, do_sample=False)
    assert out.shape[0] == 1
