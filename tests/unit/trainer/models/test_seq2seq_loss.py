"""The step's criterion (seq2seq_loss.Seq2SeqLoss) and what it asks of the device.

- It computes what the model's own forward and the label-smoothed loss compute, value and gradient,
  for the built-in transformer (Marian) and T5, tied and untied heads, SDPA and eager attention.
- Eagerly, a whole DDPBackend step (forward, loss, backward, clip, optimizer) makes no host-device
  synchronisation; compiled, the criterion is one graph with no break for either architecture, and
  one compilation serves every batch shape of an epoch.
"""

import pytest
import torch
import torch._dynamo

from rosetta_contract.documents import parse_document
from rosetta_trainer.data.batching import BatchShapes, Collation, EncodedCorpus, plan_epoch
from rosetta_trainer.engine.backends import build_backend, compile_step, mark_dynamic
from rosetta_trainer.engine.step_counters import count_step
from rosetta_trainer.models.losses import label_smoothed_cross_entropy
from rosetta_trainer.models.models import build_model
from rosetta_trainer.models.seq2seq_loss import Seq2SeqLoss, decoder_states, fused_head, padding_mask_4d
from rosetta_trainer.runtime.distributed import World
from support.training import TINY, deep_update

CPU = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"))
VOCAB = 120
ARCHITECTURES = {
    "transformer": {"architecture": "transformer", "size": "tiny"},
    "t5": {"architecture": "t5", "size": "tiny"},
}


def model_spec(architecture: str, attention: str = "sdpa", **training):
    patch = {"model": {**ARCHITECTURES[architecture], "dropout": 0.0, "attention": attention}}
    if training:
        patch["training"] = training
    return parse_document(deep_update(TINY, {"spec": patch})).spec


def model(architecture: str, attention: str = "sdpa", untied: bool = False):
    torch.manual_seed(0)
    m = build_model(model_spec(architecture, attention).model, VOCAB, 32)
    if untied:  # flan-T5 and mT5 keep a head of their own
        from rosetta_trainer.models.models import untie_output

        untie_output(m)
        with torch.no_grad():
            m.lm_head.weight.add_(torch.randn_like(m.lm_head.weight) * 0.1)
    return m


def batch(rows: int = 4, src: int = 9, tgt: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (rows, src), generator=g)
    attention = torch.ones(rows, src, dtype=torch.long)
    attention[1, src - 3:] = 0  # padding in the source
    input_ids[attention == 0] = 0
    labels = torch.randint(3, VOCAB, (rows, tgt), generator=g)
    labels[2, tgt - 2:] = -100  # and in the target
    return input_ids, attention, labels


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("architecture,untied", [("transformer", False), ("t5", False), ("t5", True)])
def test_decoder_states_and_the_head_give_the_models_logits(architecture, untied, attention):
    m = model(architecture, attention, untied).eval()
    assert fused_head(m)
    input_ids, mask, labels = batch()
    decoder_input_ids = m.prepare_decoder_input_ids_from_labels(labels=labels)
    want = m(input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_input_ids).logits
    hidden, weight, bias = decoder_states(m, input_ids, padding_mask_4d(mask, attention, m.dtype), decoder_input_ids)
    got = hidden @ weight.t() + (0 if bias is None else bias)
    # Positions past a sentence's end are padding the loss ignores; every real one must agree.
    torch.testing.assert_close(got[labels != -100], want[labels != -100], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("architecture", ["transformer", "t5"])
def test_the_criterion_is_the_models_forward_and_the_loss(architecture):
    m = model(architecture)
    input_ids, mask, labels = batch()
    criterion = Seq2SeqLoss(m, smoothing=0.1)
    loss, tokens = criterion(input_ids, mask, labels)
    params = [p for p in m.parameters() if p.requires_grad]  # not Marian's fixed sinusoids
    got = torch.autograd.grad(loss, params, allow_unused=True)
    decoder_input_ids = m.prepare_decoder_input_ids_from_labels(labels=labels)
    logits = m(input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_input_ids).logits
    n = (labels != -100).sum()
    want_loss = label_smoothed_cross_entropy(logits, labels, 0.1) / n
    want = torch.autograd.grad(want_loss, params, allow_unused=True)
    assert int(tokens) == int(n)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    for g, w in zip(got, want):
        if w is None:
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("architecture", ["transformer", "t5"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_eager_step_never_waits_for_the_device(architecture, precision):
    spec = model_spec(architecture, precision=precision, maxSteps=10)
    torch.manual_seed(0)
    backend = build_backend(spec, CPU, build_model(spec.model, VOCAB, 32), total_steps=10)
    input_ids, mask, labels = batch()

    def step():
        loss, _ = backend.forward_loss(input_ids, mask, labels)
        backend.backward(loss, 1, True)
        backend.step()

    step()  # the optimizer's state is made at its first step
    counts = count_step(step, steps=2, where=True)
    assert counts.syncs == 0, counts.sync_sites
    assert counts.kernels > 0


@pytest.mark.slow  # ~5-8 s each: dynamo's capture
@pytest.mark.parametrize("architecture", ["transformer", "t5"])
def test_the_criterion_compiles_whole(architecture):
    criterion = Seq2SeqLoss(model(architecture), smoothing=0.1, chunks=2)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(criterion)(*batch())
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.slow  # ~20 s: an epoch through dynamo and aot_eager
def test_one_compilation_serves_an_epoch_of_padded_batches():
    """Every batch of an epoch through the compiled criterion (dynamo's counters, aot_eager: the
    graph capture and autograd's partition, without generating kernels): shapes vary from batch to
    batch, the compilations do not."""
    from torch._dynamo.utils import counters

    g = torch.Generator().manual_seed(5)
    source = torch.randint(3, 40, (600,), generator=g)
    lengths = torch.stack([source, (source + torch.randint(-3, 4, (600,), generator=g)).clamp(min=2)])
    corpus = EncodedCorpus(*[[torch.randint(3, VOCAB, (int(n),), generator=g).tolist() for n in side]
                             for side in lengths])
    shapes = BatchShapes(multiple=8)
    plan = plan_epoch(lengths[0].numpy(), lengths[1].numpy(), seed=1, epoch=0, max_tokens=900, shapes=shapes)
    collate = Collation(0, shapes, max_tokens=900)
    batches = [collate(corpus, b) for b in plan]
    assert len({tuple(b["input_ids"].shape) + tuple(b["labels"].shape) for b in batches}) >= 8

    torch._dynamo.reset()
    counters.clear()
    criterion = Seq2SeqLoss(model("transformer"), smoothing=0.1, chunks=2)
    compiled = compile_step(criterion, "default", backend="aot_eager")
    for b in batches:
        inputs = (b["input_ids"], b["attention_mask"], b["labels"])
        mark_dynamic(*inputs)
        loss, _ = compiled(*inputs)
        loss.backward()
    # Marked dynamic up front: one compilation; left to dynamo, a second when the shape first changes.
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"]
