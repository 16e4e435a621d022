"""The DeepSpeed backend: a ZeRO engine configured from the same spec as DDP.

The DeepSpeed config is generated from spec.training and spec.distributed
(precision, accumulation, clipping, ZeRO stage, offload), then the user's raw
`deepspeedConfig` is merged over it; the result is saved with the run and with
every checkpoint. Checkpoints are DeepSpeed's own sharded format inside our
atomic step directories (checkpoints/deepspeed_checkpoints.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch

from rosetta_contract.config import TrainerSpec
from rosetta_contract.documents import deep_merge
from rosetta_contract.strict_model import ConfigError
from rosetta_trainer.checkpoints.deepspeed_checkpoints import CONFIG_FILE, TAG, weights_only_loads
from rosetta_trainer.engine.ops_cache import prepare_cpu_adam
from rosetta_trainer.engine.optimization import make_optimizer, make_scheduler, param_groups
from rosetta_trainer.models.losses import label_smoothed_cross_entropy
from rosetta_trainer.models.seq2seq_loss import IGNORE_INDEX, decoder_mask, padding_mask_4d
from rosetta_trainer.runtime.deepspeed_import import import_deepspeed
from rosetta_trainer.runtime.distributed import World

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


def deepspeed_config(spec: TrainerSpec, cuda: bool) -> dict[str, Any]:
    t, d = spec.training, spec.distributed
    zero: dict[str, Any] = {"stage": d.stage, "contiguous_gradients": True,
                  # Overlapping reduction with backward needs CUDA streams; on CPU it only adds copies.
                  "overlap_comm": cuda}
    if d.offload.optimizer == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
    if d.offload.parameters == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
    config: dict[str, Any] = {
        # Our batches are token budgets, not a fixed number of sentences: DeepSpeed only uses
        # this figure for its own data loader and throughput timers, neither of which runs here.
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": t.gradient_accumulation,
        "gradient_clipping": t.clip_grad_norm or 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": {"enabled": t.precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,  # our own metrics report progress
        "wall_clock_breakdown": False,
    }
    if d.offload.optimizer == "cpu":
        # The optimizer step runs on the CPU: DeepSpeed's vectorised CPU Adam (decoupled
        # weight decay, i.e. AdamW) instead of torch's.
        config["optimizer"] = {"type": "AdamW", "params": {
            "lr": t.learning_rate, "betas": list(t.adam_betas), "eps": t.adam_eps,
            "weight_decay": t.weight_decay}}
    return deep_merge(config, d.deepspeed_config or {})


def skip_cpu_shared_memory_collectives(cuda: bool) -> None:
    """On a CPU device, keep DeepSpeed from JIT-compiling its shared-memory all-reduce.

    DeepSpeed's torch communication backend builds that op (deepspeed_shm_comm) whenever its
    builder is marked compatible, on every rank of every process that initialises
    distributed; only its inference all-reduce uses it, never training's collectives (gloo
    here). Compiling it costs about two minutes of C++ per rank of every fresh pod. Marking it
    incompatible in DeepSpeed's own table is what its backend reads to skip the build.
    """
    if cuda:
        return
    import_deepspeed()
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().get_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


@contextlib.contextmanager
def partitioned_loading(spec: TrainerSpec, cuda: bool) -> Iterator[None]:
    """Under ZeRO-3, make transformers' from_pretrained partition weights as it loads them
    (deepspeed.zero.Init), so no rank ever holds the whole pretrained model.

    From-scratch models are built whole on every rank, as under DDP: they are small enough
    (the largest preset has ~400M parameters), and zero.Init would initialise them from a
    different random stream than a DDP run with the same seed.
    """
    if spec.distributed.backend != "deepspeed" or spec.distributed.stage != 3 or spec.model.name is None:
        yield
        return
    import_deepspeed()  # before transformers' integration imports it
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    skip_cpu_shared_memory_collectives(cuda)  # zero.Init initialises distributed
    keep = HfDeepSpeedConfig(deepspeed_config(spec, cuda))  # transformers holds only a weak reference
    try:
        yield
    finally:
        # Later from_config calls (export, evaluation) must build whole models again.
        del keep
        unset_hf_deepspeed_config()


class DeepSpeedBackend:
    name = "deepspeed"

    def __init__(self, spec: TrainerSpec, world: World, model: PreTrainedModel, total_steps: int) -> None:
        try:
            deepspeed = import_deepspeed()
        except ImportError:
            raise ConfigError([("spec.distributed.backend", "deepspeed needs DeepSpeed installed: "
                                "pip install 'rosetta-mt[deepspeed]' (the trainer image has it)")]) from None

        self.spec, self.world = spec, world
        t = spec.training
        cuda = world.device.type == "cuda"
        self.config = deepspeed_config(spec, cuda)
        skip_cpu_shared_memory_collectives(cuda)
        prepare_cpu_adam(self.config)
        groups = param_groups(model, t.weight_decay)
        client_optimizer = None
        if "optimizer" not in self.config:
            client_optimizer = make_optimizer(spec, groups, fused=cuda)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, model_parameters=groups, optimizer=client_optimizer,
            lr_scheduler=make_scheduler(spec, total_steps), config=self.config)
        if t.compile != "none":
            # The engine's compile, not torch.compile(model) before initialize: it compiles the
            # module in place, so parameter names (DeepSpeed checkpoints, the export) stay the model's.
            self.engine.compile(compile_kwargs={} if t.compile == "default" else {"mode": t.compile})
        self.module = self.engine.module
        self.model = self.engine
        self.zero_stage = self.engine.zero_optimization_stage()  # the overrides may have changed it
        self._skipped = self.engine.skipped_steps
        if world.is_main:
            log.info("DeepSpeed ZeRO stage %d, offload optimizer=%s parameters=%s, precision %s",
                     self.zero_stage, spec.distributed.offload.optimizer, spec.distributed.offload.parameters,
                     t.precision)

    def forward_loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean loss per target token, target tokens). The engine runs the model's own forward (under
        ZeRO-3 only it can gather the head's weight) and the loss takes its logits; the padding mask
        goes in 4-D, as in Seq2SeqLoss. DeepSpeed casts the model to bf16/fp16 itself: no autocast."""
        module = self.module
        mask = padding_mask_4d(attention_mask, module.config._attn_implementation, module.dtype)
        decoder_input_ids = module.prepare_decoder_input_ids_from_labels(labels=labels)
        logits = self.engine(input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_input_ids,
                             decoder_attention_mask=decoder_mask(module, decoder_input_ids)).logits
        loss_sum = label_smoothed_cross_entropy(logits, labels, self.spec.training.label_smoothing, IGNORE_INDEX)
        tokens = (labels != IGNORE_INDEX).sum()
        return loss_sum / tokens.clamp(min=1), tokens

    def backward(self, loss: torch.Tensor, accumulation: int, boundary: bool) -> None:
        # The engine divides by gradient_accumulation_steps and reduces only at the boundary;
        # step() is called for every micro-batch because the engine counts them.
        self.engine.backward(loss)
        self.engine.step()

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The engine already stepped at the last micro-batch; report what it did, as DDPBackend.step.

        ZeRO's optimizers skip a step whose gradient norm is not finite (and then do not advance
        the learning-rate schedule), so non-finite weights never arise here. DeepSpeed reads its
        overflow flag on the host inside its step: a synchronisation per step that is its own.
        """
        applied = self.engine.skipped_steps == self._skipped
        self._skipped = self.engine.skipped_steps
        norm = self.engine.get_global_grad_norm()
        if norm is None:
            norm = float("nan") if not applied else 0.0
        norm = float(norm.item() if isinstance(norm, torch.Tensor) else norm)
        device = self.world.device
        return torch.tensor(norm, device=device), torch.tensor(0.0 if applied else 1.0, device=device)

    def unskip_schedule(self, steps: int) -> None:
        """Nothing to take back: the engine does not advance the schedule on a skipped step."""

    def release(self) -> None:
        """The engine's process groups end with DeepSpeed's own teardown."""

    def last_lr(self) -> float:
        lr: float = self.scheduler.get_last_lr()[0]
        return lr

    def weights_finite(self) -> bool:
        # Skipped steps keep the weights finite; gathering ZeRO-3 shards to check would cost a
        # full parameter all-gather per checkpoint.
        return True

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        # Optimizer, scheduler and loss-scaler states are in DeepSpeed's own files.
        return {"optimizer": None, "scheduler": None, "scaler": None, "backend": self.name}

    def load_state_dict(self, state: dict[str, Any], checkpoint: Path) -> None:
        if not (checkpoint / TAG).is_dir():
            raise ValueError(f"{checkpoint} was written by the DDP backend (no {TAG}/ directory); resume it "
                             "with spec.distributed.backend: ddp, or start a new output directory")
        with weights_only_loads():
            loaded, _ = self.engine.load_checkpoint(str(checkpoint), tag=TAG, load_module_strict=True,
                                                    load_optimizer_states=True, load_lr_scheduler_states=True)
        if loaded is None:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint in {checkpoint / TAG}")
        self._skipped = self.engine.skipped_steps

    def save_model(self, directory: Path) -> None:
        """Collective: every rank writes its shards; rank 0 the config that rebuilds the model."""
        self.engine.save_checkpoint(str(directory), tag=TAG, save_latest=False)
        if self.world.is_main:
            self.module.config.save_pretrained(directory / "model")
            generation = getattr(self.module, "generation_config", None)
            if generation is not None:
                generation.save_pretrained(directory / "model")
            (directory / CONFIG_FILE).write_text(json.dumps(self.config, indent=2))


