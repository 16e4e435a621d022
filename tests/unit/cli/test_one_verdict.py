"""One file, one verdict: every command that reads a TranslationTraining judges it by the cluster's
rules, so a file that passes on a laptop is one the operator accepts."""

from pathlib import Path

import pytest

from rosetta_cli.main import main

QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart.yaml"
# Cluster fields: the trainer ignores them when it runs, but they must still be valid.
BAD_CLUSTER_FIELDS = ["--set", "spec.nodes=0", "--set", "spec.gpusPerNode=-1"]


@pytest.mark.parametrize("command", ["validate", "train", "prepare", "stage", "evaluate", "plan"])
def test_every_command_refuses_invalid_cluster_fields_with_the_same_message(command, capsys, tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a command might write lands in the repository
    assert main([command, "-f", str(QUICKSTART), *BAD_CLUSTER_FIELDS]) == 2
    err = capsys.readouterr().err
    assert f"invalid TranslationTraining in {QUICKSTART} (2 errors)" in err
    assert "spec.nodes: Input should be greater than or equal to 1" in err
    assert "spec.gpusPerNode: Input should be greater than or equal to 0" in err
    assert not any(tmp_path.iterdir()), "a refused file must not start any work"
