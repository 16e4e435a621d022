"""An epoch's batch plan made the way the trainer made it before the packing was vectorised: one
Python step per example. tests/unit/trainer/data/test_batching.py holds batching.plan_epoch to it, batch for
batch; bench/plan_epoch.py times both."""

from __future__ import annotations

import numpy as np

from rosetta_trainer.data.batching import EXACT


def reference_plan(src, tgt, *, seed, epoch, max_tokens=None, max_sentences=None, world_size=1, shapes=EXACT):
    """The plan as the trainer made it with one Python step per example (before the packing was
    vectorised): the vectorised plan must be this one, batch for batch, so that runs and resumes
    planned before and after the change agree."""
    n = len(src)
    rng = np.random.default_rng([seed, epoch])
    noise = rng.permutation(n)
    order = np.lexsort((noise, np.minimum(src, tgt), np.maximum(src, tgt)))
    batches, current, longest_src, longest_tgt = [], [], 0, 0
    for i, s, t in zip(order.tolist(), shapes.length(src[order]).tolist(), shapes.length(tgt[order]).tolist()):
        if max_tokens is not None:
            full = bool(current) and (len(current) + 1) * (max(longest_src, s) + max(longest_tgt, t)) > max_tokens
        else:
            full = len(current) >= max_sentences
        if full:
            batches.append(current)
            current, longest_src, longest_tgt = [], 0, 0
        current.append(i)
        longest_src, longest_tgt = max(longest_src, s), max(longest_tgt, t)
    if current:
        batches.append(current)
    shuffled = [batches[j] for j in rng.permutation(len(batches))]
    return shuffled[:len(shuffled) - len(shuffled) % world_size]
