"""The hostile corpus (tests/hostile/) on a cluster: `kubectl apply` of every document, the operator watching.

Each bad document must end one of two ways:

    refused    kubectl or the apiserver refuses it (the CRD's schema and rules are generated from the
               spec models); the message names the field, or says what `# cluster-expect:` says
               kubectl says (it refuses NaN, alias bombs and recursion in its own words)
    reported   stored, then the operator sets phase Failed and Valid=False naming the field

and no JobSet may exist for it. Every valid document is stored and gets its JobSet (kwok runs its
pods, or they wait for a node; either is fine here). The operator runs the whole time: it does not
exit, its /healthz answers, and its log has no traceback.

Documents marked `# cluster: skip (reason)` are not applied: data paths (the operator reads no data
files) and what kubectl itself rewrites before the apiserver sees it (duplicate keys, YAML dates).

One kubectl process per document (six at a time), so each answer belongs to one file; the verdicts
are then read for all trainings at once, every second, until each has one.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from workloads import kubectl

from hostile.corpus import all_cases, names_field

pytestmark = pytest.mark.cluster

WORKERS = 6
VERDICT_TIMEOUT = 180
STORED = re.compile(r"^translationtraining\.rosetta\.dev/(\S+) (?:created|configured|unchanged)", re.M)


def statuses(cluster, namespace: str) -> dict[str, dict]:
    """Each training's status. Through jsonpath, not `-o json`: a stored document may nest deeper than
    Python's json module reads (the apiserver takes thousands of levels in a free-form field)."""
    got = kubectl(cluster, "get", "translationtrainings", "-n", namespace, "-o",
                  'jsonpath={range .items[*]}{.metadata.name}{"\\n"}{.status}{"\\n"}{end}')
    assert got.returncode == 0, got.stderr
    lines = got.stdout.split("\n")
    return {lines[i]: json.loads(lines[i + 1] or "{}") for i in range(0, len(lines) - 1, 2)}


def jobset_owners(cluster, namespace: str) -> set[str]:
    got = kubectl(cluster, "get", "jobsets", "-n", namespace, "-o",
                  'jsonpath={range .items[*]}{.metadata.ownerReferences[0].name}{"\\n"}{end}')
    assert got.returncode == 0, got.stderr
    return set(got.stdout.split())


def condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def verdict(case, status: dict, has_jobset: bool) -> tuple[bool, str] | None:
    """(as it should be, what happened), or None while the operator has not decided."""
    valid, created = condition(status, "Valid"), condition(status, "Created")
    if case.valid:
        if valid.get("status") == "True" and has_jobset:
            return True, "JobSet created"
        if valid.get("status") == "False" or created.get("status") == "False":
            return False, f"refused by the operator: {status.get('message', '')}"
        return None
    if has_jobset:
        return False, "accepted: the operator created its JobSet"
    if valid.get("status") == "False":
        message = valid.get("message", "")
        if status.get("phase") != "Failed":
            return False, f"Valid=False but phase {status.get('phase')}: {message}"
        expect = case.cluster_expect or case.expect
        if not names_field(message, expect):
            return False, f"reported without naming {expect!r}: {message}"
        return True, "reported"
    if created.get("status") == "False":  # judged valid, then the API refused what it rendered
        return False, f"accepted as valid, then the API refused its JobSet: {created.get('message', '')}"
    return None


def delete_trainings(cluster, namespace: str) -> None:
    """All of them, while the operator still runs to release its finalizers: the namespace's teardown
    lists what is left with the kubernetes client, whose json module cannot read a training nested
    thousands of levels deep. What still has a finalizer after a minute (the operator died) is left
    to that teardown; nothing here fails, so a failure of the test itself stays what it reports."""
    kubectl(cluster, "delete", "translationtrainings", "--all", "-n", namespace, "--wait=false")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = kubectl(cluster, "get", "translationtrainings", "-n", namespace, "-o",
                      'jsonpath={range .items[*]}{.metadata.name}{" "}{.metadata.finalizers}{"\\n"}{end}')
        if not any(len(line.split()) == 1 for line in got.stdout.splitlines()):
            return
        time.sleep(1)


@pytest.fixture
def planted_secret(monkeypatch) -> str:
    """In the environment the operator starts with (the test asks for it before live_operator)."""
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("ROSETTA_PLANTED_SECRET", secret)
    return secret


def test_every_document_is_refused_or_runs(live_cluster, live_namespace, planted_secret, live_operator, tmp_path):
    try:
        check_every_document(live_cluster, live_namespace, live_operator, tmp_path, planted_secret)
    finally:
        delete_trainings(live_cluster, live_namespace)


def check_every_document(live_cluster, namespace, live_operator, tmp_path, secret: str):
    started = time.monotonic()
    cases = [c for c in all_cases() if not c.cluster_skip]

    def apply(case):
        return kubectl(live_cluster, "apply", "-n", namespace, "-f", str(case.materialize(tmp_path)))

    with ThreadPoolExecutor(WORKERS) as pool:
        applied = list(zip(cases, pool.map(apply, cases)))

    problems, outcomes, waiting, already_said = [], {"refused": 0, "reported": 0, "JobSet created": 0}, {}, set()
    for case, got in applied:
        names = STORED.findall(got.stdout)
        if names:
            waiting.update((name, case) for name in names)
        elif case.valid:
            problems.append(f"{case.id}: kubectl apply refused it: {got.stderr.strip()}")
        elif got.returncode == 0:
            problems.append(f"{case.id}: kubectl apply stored no training and reported no error: {got.stdout.strip()}")
        elif not names_field(got.stderr, case.cluster_expect or case.expect):
            problems.append(f"{case.id}: refused without naming {case.cluster_expect or case.expect!r}: "
                            f"{got.stderr.strip()}")
        else:
            outcomes["refused"] += 1
    applied_s = time.monotonic() - started

    deadline = time.monotonic() + VERDICT_TIMEOUT
    while waiting and time.monotonic() < deadline and live_operator.proc.proc.poll() is None:
        current, owners = statuses(live_cluster, namespace), jobset_owners(live_cluster, namespace)
        for name, case in list(waiting.items()):
            decided = verdict(case, current.get(name, {}), name in owners)
            if decided is not None:
                ok, what = decided
                if ok:
                    outcomes[what] += 1
                else:
                    problems.append(f"{case.id}: {what}")
                    already_said.add(name)
                del waiting[name]
        time.sleep(1)
    current = statuses(live_cluster, namespace)
    problems += [f"{case.id}: no verdict from the operator (status: {json.dumps(current.get(name, {}))[:300]})"
                 for name, case in waiting.items()]
    # Late JobSets too: nothing may create one for a bad document after its verdict.
    bad = {name for case, got in applied if not case.valid for name in STORED.findall(got.stdout)} - already_said
    problems += [f"training {name}: a JobSet appeared after the operator refused it"
                 for name in sorted(bad & jobset_owners(live_cluster, namespace))]

    operator = live_operator.proc
    if operator.proc.poll() is not None:
        problems.append(f"the operator exited with {operator.proc.returncode}")
    else:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{live_operator.port}/healthz", timeout=5) as resp:
                assert resp.status == 200
        except (OSError, AssertionError) as exc:
            problems.append(f"the operator's /healthz does not answer: {exc}")
    log = operator.log.read_text(errors="replace")
    events = kubectl(live_cluster, "get", "events", "-n", namespace, "-o",
                     'jsonpath={range .items[*]}{.message}{"\\n"}{end}').stdout
    said = [got.stdout + got.stderr for _, got in applied] + [json.dumps(current), events, log]
    if any(secret in text for text in said):
        problems.append("the secret planted in the operator's environment is in its log, a status, an event or "
                        "kubectl's output")
    if "Traceback" in log:
        first = log.index("Traceback")
        problems.append(f"the operator logged a traceback:\n{log[max(0, first - 300):first + 2500]}")

    summary = (f"{len(cases)} documents applied in {applied_s:.0f} s; {outcomes}; "
               f"{time.monotonic() - started:.0f} s in all")
    print(summary)
    if problems:
        pytest.fail(f"{len(problems)} problems ({summary}):\n" + "\n".join(p[:1500] for p in problems), pytrace=False)
