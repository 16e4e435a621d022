"""`rosetta plan -f FILE [--gpu-memory 80GiB] [--json]`: memory_plan's plan as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from rosetta_trainer.planning.memory_plan import Plan, format_gib, plan_spec
from rosetta_trainer.planning.plan_inputs import GiB, PlanSkipped

if TYPE_CHECKING:
    from rich.console import Console


def render(plan: Plan, console: Console) -> None:
    """The table, the notes, the recommendation and any warning, on a rich Console."""
    from rich.table import Table

    s, c = plan.shape, plan.cluster
    table = Table(title=f"{s.params / 1e6:,.1f}M parameters on {c.nodes} node(s) × {c.gpus_per_node} GPU(s), "
                        f"{format_gib(c.gpu_memory)} per GPU", title_justify="left")
    for name in ("setting", "weights", "grads", "optimizer", "activations", "GPU total", "node CPU", "fits"):
        table.add_column(name, justify="left" if name == "setting" else "right", no_wrap=True)
    for e in plan.estimates:
        mark = " ← spec" if e.setting == plan.requested else ""
        fits = "yes" if plan.fits(e) else ("no (CPU)" if plan.fits_gpu(e) else "no")
        table.add_row(e.setting.name + mark, *(f"{x / GiB:.1f}" for x in (
            e.weights, e.gradients, e.optimizer, e.activations, e.gpu_total, e.node_cpu)), fits)
    console.print(table)
    console.print("GiB per GPU; node CPU in GiB per node. " + "; ".join(plan.notes[1:3]) + ".", soft_wrap=True)
    for note in (plan.notes[0], *plan.notes[3:]):
        console.print(f"  {note}", soft_wrap=True, highlight=False)
    best = plan.recommended
    if best is not None:
        console.print(f"recommended: {best.setting.name} ({format_gib(best.gpu_total)} per GPU of "
                      f"{format_gib(plan.usable_gpu_memory)} usable)", highlight=False)
    for line in plan.warnings():
        console.print(line, style="bold red", soft_wrap=True, highlight=False)


def plan_command(args: argparse.Namespace) -> int:
    """`rosetta plan -f FILE [--gpu-memory 80GiB] [--json]`."""
    from rich.console import Console

    from rosetta_contract.spec import load_training

    spec = load_training(args.file, args.overrides).spec
    try:
        plan = plan_spec(spec, args.gpu_memory)
    except PlanSkipped as exc:
        print(f"rosetta plan: cannot plan {args.file}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a bad --gpu-memory or quantity
        print(f"rosetta plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        render(plan, Console(width=max(130, Console().width)))
    return 0
