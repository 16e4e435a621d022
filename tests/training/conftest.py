"""Fixtures for tiny real trainings (the config itself is in support/training.py)."""

from pathlib import Path

import pytest
import yaml

from support.training import TINY, deep_update


@pytest.fixture
def write_config(tmp_path):
    def write(patch: dict | None = None, name: str = "training.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(deep_update(TINY, {"spec": patch or {}})))
        return path
    return write
