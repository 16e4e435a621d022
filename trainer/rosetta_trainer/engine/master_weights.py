"""bf16 parameters with fp32 master copies (spec.training.bf16Parameters), as DeepSpeed's bf16 mode keeps them.

Under autocast every matrix product casts its fp32 weight to bf16 again at every step: one kernel
per weight in the forward (about 550 for transformer-base), plus the backward's. With the weights
kept in bf16 autocast has nothing to cast. The optimizer still updates fp32 values, so that small
updates are not rounded away: it steps fp32 master copies, and after each step the bf16 parameters
are refreshed from them in one multi-tensor copy. The gradients are bf16 (what the backward of bf16
weights gives, and what DDP then all-reduces) and are copied into fp32 before clipping.

Checkpoints hold the master (fp32) values, so a resumed run, `rosetta evaluate` and an export see
the weights the optimizer has.
"""

from __future__ import annotations

from typing import cast

import torch


class MasterWeights:
    """fp32 copies of a module's trainable parameters, which are then made bf16 in place."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.names = [name for name, p in module.named_parameters() if p.requires_grad]
        self.params: list[torch.Tensor] = [p for p in module.parameters() if p.requires_grad]
        # Made before the cast: the masters start from the exact fp32 values (pretrained or fresh).
        self.master: list[torch.Tensor] = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params]
        self._by_param = {id(p): m for p, m in zip(self.params, self.master)}
        # The whole module, buffers and fixed tables included, as DeepSpeed's bf16 mode casts it: its
        # forward then sees one dtype, also outside autocast (evaluation, generation).
        module.to(torch.bfloat16)

    def named_master(self) -> list[tuple[str, torch.Tensor]]:
        return list(zip(self.names, self.master))

    def gradients_to_master(self) -> list[torch.Tensor]:
        """Copy the bf16 gradients into the masters' fp32 ones, in one multi-tensor copy; a master whose
        parameter got no gradient gets none (the optimizer then leaves it alone). The masters that
        have one."""
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for m, p in zip(self.master, self.params):
            if p.grad is None:
                m.grad = None
                continue
            if m.grad is None:
                m.grad = torch.empty_like(m)
            pairs.append((m, p.grad))
        if pairs:
            # Each master of `pairs` was given a gradient just above.
            torch._foreach_copy_(cast("list[torch.Tensor]", [m.grad for m, _ in pairs]), [g for _, g in pairs])
        return [m for m, _ in pairs]

    def master_to_parameters(self) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.master)

    def state_dict_of(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The module's state dict in fp32: each trainable parameter's master in its place, the rest
        (fixed tables, buffers) widened back. Tied parameters stay one tensor."""
        state: dict[str, torch.Tensor] = {}
        widened: dict[int, torch.Tensor] = {}
        for name, tensor in module.state_dict(keep_vars=True).items():
            master = self._by_param.get(id(tensor))
            if master is not None:
                state[name] = master.detach()
            elif tensor.is_floating_point():
                state[name] = widened.setdefault(id(tensor), tensor.detach().float())
            else:
                state[name] = tensor.detach()
        return state
