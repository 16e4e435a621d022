"""The tasks a training can have, and the one in effect while a TrainerSpec validates.

spec.task changes what a valid `data` and `evaluation` section is, but pydantic validates nested
models before their parent. TrainerSpec hands its task down through a context variable while it
validates (`task_in_effect`), so those rules can live in DataSpec and EvaluationSpec and their
errors keep their field paths (spec.data..., spec.evaluation.metrics). Outside a TrainerSpec the
task is translation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal

Task = Literal["translation", "summarization"]
DEFAULT_METRICS = {"translation": ["bleu", "chrf", "gender"], "summarization": ["rouge1", "rouge2", "rougeL"]}

_TASK: ContextVar[str] = ContextVar("rosetta_task", default="translation")


def current_task() -> str | None:
    """The task of the spec being validated; None when spec.task itself is invalid (that error
    is reported on its own, so task-dependent rules stay quiet rather than guess)."""
    task = _TASK.get()
    return task if isinstance(task, str) and task in DEFAULT_METRICS else None


@contextmanager
def task_in_effect(task: Any) -> Iterator[None]:
    """Make `task` the one nested models see while a TrainerSpec validates (any value: current_task()
    ignores what is not a task, which is reported on spec.task itself)."""
    token = _TASK.set(task)
    try:
        yield
    finally:
        _TASK.reset(token)
