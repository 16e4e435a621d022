"""OwnCreations: which JobSet ADDED events the operator may skip (its reconcile writes that status)."""

import threading

from rosetta_operator.handlers import OwnCreations


def jobset(uid: str, version: str) -> dict:
    return {"metadata": {"uid": uid, "resourceVersion": version, "name": "mt"}}


def test_claims_exactly_the_created_version_once():
    own = OwnCreations()
    own.add(jobset("a", "10"))
    assert not own.claim(jobset("a", "11"))  # changed since: the controller moved, that is news
    assert not own.claim(jobset("b", "10"))  # another object
    assert own.claim(jobset("a", "10"))
    assert not own.claim(jobset("a", "10"))  # once: a re-delivered event is handled


def test_objects_without_identity_are_never_claimed():
    own = OwnCreations()
    own.add({"metadata": {"uid": "a"}})
    own.add({})
    assert not own.claim({"metadata": {"uid": "a"}})
    assert not own.claim({})


def test_bounded_oldest_entries_go_first():
    own = OwnCreations(limit=3)
    for i in range(5):
        own.add(jobset(f"u{i}", "1"))
    assert [own.claim(jobset(f"u{i}", "1")) for i in range(5)] == [False, False, True, True, True]


def test_concurrent_add_and_claim_lose_nothing():
    own = OwnCreations()
    uids = [f"u{i}" for i in range(2000)]
    claimed = []

    def add():
        for uid in uids:
            own.add(jobset(uid, "7"))

    def claim():
        for uid in uids:
            while not own.claim(jobset(uid, "7")):
                pass
            claimed.append(uid)

    threads = [threading.Thread(target=add), threading.Thread(target=claim)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert claimed == uids
