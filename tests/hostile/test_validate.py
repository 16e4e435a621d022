"""Every document of the hostile corpus through `rosetta validate`, as a careless or hostile user runs it.

A bad document is refused with the exit status of its kind (2 for the document, 65 for a data file),
nothing on stdout, and a short message on stderr that names the field (or, for a file that is not
read, where in it) without a traceback or a control character the document chose. A valid one
passes. A secret planted in the environment never appears in any output, nor in the termination
message a data error writes.

All documents run in this process (main() of the `rosetta` command, a few ms each). A sample runs
through the installed command as well: one document per theme, every document written at test time,
and every document whose data path is a file of this machine. Those last ones must run in a process
of their own: /proc/self/environ holds the environment a process started with, so only a child
started with the planted secret has it there to leak.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from hostile.corpus import CORPUS, all_cases, committed, headers, refusal_problems
from rosetta_cli.main import main
from rosetta_contract import strict_yaml
from rosetta_contract.exits import TERMINATION_LOG_ENV

CASES = all_cases()
SECRET_VAR = "ROSETTA_PLANTED_SECRET"
SECRET = f"s3cr3t-{uuid.uuid4().hex}"
LITERAL_SECRET = "s3cr3t-literal"  # how the corpus spells the credentials it writes in clear
ROSETTA = Path(sys.executable).with_name("rosetta")


def check(case, code, out: str, err: str, termination: str) -> None:
    for where, text in (("stdout", out), ("stderr", err), ("the termination message", termination)):
        assert SECRET not in text, f"{case.id}: the planted secret is in {where}"
        # A credential written into the document itself (an env value, a URL's password) is not
        # repeated by its refusal either.
        assert LITERAL_SECRET not in text, f"{case.id}: the document's literal credential is in {where}"
    if case.valid:
        assert code == 0 and out.startswith("ok: "), f"{case.id}: refused with {code}:\n{err}"
        assert "Traceback" not in err
        return
    assert code == case.exit, f"{case.id}: exit {code}, not {case.exit}:\n{out}{err}"
    assert out == "", f"{case.id}: printed on stdout:\n{out}"
    problems = refusal_problems(err, case.expect)
    assert not problems, f"{case.id}: {'; '.join(problems)}:\n{err[:3000]}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_validate_in_process(case, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(SECRET_VAR, SECRET)
    log = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(log))
    path = case.materialize(tmp_path)
    try:
        code = main(["validate", "-f", str(path)])
    except Exception as exc:  # what the installed command would print as a traceback
        pytest.fail(f"{case.id}: crashed: {type(exc).__name__}: {str(exc)[:500]}", pytrace=False)
    out, err = capsys.readouterr()
    check(case, code, out, err, log.read_text() if log.exists() else "")


def sample() -> list:
    """One document per theme, and every one generated or reading this machine's files."""
    first, chosen = set(), []
    for case in CASES:
        if case.theme not in first or case.make is not None or case.exit != 2:
            first.add(case.theme)
            chosen.append(case)
    return chosen


SAMPLE = sample()


@pytest.mark.parametrize("case", SAMPLE, ids=[c.id for c in SAMPLE])
def test_validate_as_a_command(case, tmp_path):
    if not ROSETTA.exists():
        pytest.skip("the rosetta console script is not installed")
    log = tmp_path / "termination-log"
    env = {**os.environ, SECRET_VAR: SECRET, TERMINATION_LOG_ENV: str(log), "PYTHONWARNINGS": "ignore"}
    # A timeout, not a hang, if a document ever makes the reader loop or a data check read forever.
    got = subprocess.run([str(ROSETTA), "validate", "-f", str(case.materialize(tmp_path))], capture_output=True,
                         text=True, errors="replace", env=env, timeout=60, stdin=subprocess.DEVNULL, cwd=tmp_path)
    check(case, got.returncode, got.stdout, got.stderr, log.read_text() if log.exists() else "")


def test_the_corpus_is_large_and_says_what_each_document_tests():
    counts = Counter("valid" if c.valid else "bad" for c in CASES)
    assert counts["bad"] >= 200 and counts["valid"] >= 20, counts
    for case in committed():
        head = headers(case.file.read_bytes())
        if case.valid:
            assert set(head) == {"valid"}, f"{case.id}: a valid document has only '# valid: why'"
        else:
            assert head.get("expect") and head.get("why"), f"{case.id}: no '# expect:' or '# why:' line"
    assert not [p for p in CORPUS.rglob("*") if p.is_file() and p.suffix != ".yaml"]


def test_documents_the_cluster_stores_have_names_of_their_own(tmp_path):
    # The cluster tier applies them all into one namespace: a shared name would hide a document.
    names = Counter()
    for case in CASES:
        try:
            docs = strict_yaml.load_all(case.content().decode())
        except ValueError:  # not YAML (UnicodeDecodeError and YamlError are ValueErrors), so nothing is stored
            continue
        for doc in docs:
            if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
                name = doc["metadata"].get("name")
                if isinstance(name, str):
                    names[(repr(doc.get("kind")), name)] += 1
    assert [n for n, count in names.items() if count > 1] == []


def theme_table() -> str:
    counts = Counter(c.theme for c in CASES)
    rows = [f"| {theme} | {counts[theme]} |" for theme in sorted(counts) if theme != "valid"]
    return "\n".join(["| theme | documents |", "|---|---|", *rows,
                      f"| **bad, in all** | **{sum(counts.values()) - counts['valid']}** |",
                      f"| valid | {counts['valid']} |"])


def test_the_counts_in_the_docs_are_current():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    assert theme_table() in docs, f"docs/reliability.md should have this table:\n{theme_table()}"
