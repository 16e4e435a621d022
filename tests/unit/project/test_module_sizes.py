"""Small modules: none of the packages' modules over 450 lines, so that each holds one thing a
reader can take in at once (split by what it holds when one grows past it). `make lint` runs this."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("contract/rosetta_contract", "cli/rosetta_cli", "operator/rosetta_operator", "trainer/rosetta_trainer")
MAX_LINES = 450


def oversized(root: Path = ROOT) -> dict[str, int]:
    sizes = {str(path.relative_to(root)): len(path.read_text().splitlines())
             for package in PACKAGES for path in sorted((root / package).rglob("*.py"))}
    return {path: lines for path, lines in sizes.items() if lines > MAX_LINES}


def test_no_module_is_over_the_limit() -> None:
    assert not oversized(), f"over {MAX_LINES} lines (split by what they hold): {oversized()}"


def test_the_check_sees_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "trainer" / "rosetta_trainer").mkdir(parents=True)
    (tmp_path / "trainer" / "rosetta_trainer" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "trainer" / "rosetta_trainer" / "short.py").write_text("x = 1\n" * MAX_LINES)
    assert oversized(tmp_path) == {"trainer/rosetta_trainer/long.py": MAX_LINES + 1}
