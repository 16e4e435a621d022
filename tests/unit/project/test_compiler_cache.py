"""The suite's C++ extension builds (DeepSpeed's CPU ops) go through ccache, keyed by content and not by
the build folder, so that a new virtualenv does not compile them again (tests/conftest.py)."""

import os
import shutil
from pathlib import Path

import pytest
from torch.utils import cpp_extension


@pytest.mark.skipif(shutil.which("ccache") is None, reason="ccache is installed only where the tests run as root")
def test_torch_puts_ccache_before_the_compiler_with_the_suites_settings():
    assert cpp_extension._wrap_compiler("c++") == ["ccache", "c++"]
    assert os.environ["CCACHE_NOHASHDIR"] == "1"
    assert Path(os.environ["CCACHE_DIR"]) == Path.home() / ".cache" / "rosetta" / "ccache"
