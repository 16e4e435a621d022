"""rosetta_node_tokens_per_second: each rank's tokens summed per node, as torchrun numbers ranks."""

from rosetta_trainer.engine.loop import tokens_by_node


def test_ranks_are_grouped_by_node():
    assert tokens_by_node([1.0, 2.0, 3.0, 4.0], 2) == {"0": 3.0, "1": 7.0}
    assert tokens_by_node([1.0, 2.0, 3.0], 3) == {"0": 6.0}
    assert tokens_by_node([5.0], 1) == {"0": 5.0}
