import math

import pytest

from rosetta_trainer.engine.schedules import lr_multiplier


@pytest.mark.parametrize("name", ["noam", "linear", "cosine", "constant"])
def test_warmup_rises_linearly_to_the_peak(name):
    f = lr_multiplier(name, warmup=10, total=100)
    assert f(0) == pytest.approx(0.1)
    assert f(4) == pytest.approx(0.5)
    assert f(9) == pytest.approx(1.0)


def test_decay_shapes():
    noam = lr_multiplier("noam", 10, 100)
    assert noam(39) == pytest.approx(math.sqrt(10 / 40))
    linear = lr_multiplier("linear", 10, 110)
    assert linear(60) == pytest.approx(0.5)
    assert linear(110) == 0.0
    cosine = lr_multiplier("cosine", 0, 100)
    assert cosine(0) == pytest.approx(1.0)
    assert cosine(50) == pytest.approx(0.5)
    assert cosine(100) == pytest.approx(0.0)
    assert lr_multiplier("constant", 0, 100)(77) == 1.0


def test_unknown_schedule():
    with pytest.raises(ValueError, match="unknown schedule"):
        lr_multiplier("step", 1, 2)
