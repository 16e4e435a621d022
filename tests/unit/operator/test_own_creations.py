"""OwnCreations: which JobSet ADDED events the operator may skip (its reconcile writes that status)."""

import threading
import time

from rosetta_operator.event_memory import OwnCreations


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


def created(namespace: str, name: str, uid: str, version: str) -> dict:
    return {"metadata": {"namespace": namespace, "name": name, "uid": uid, "resourceVersion": version}}


def test_an_added_event_that_overtakes_the_post_waits_for_it():
    """The watch may deliver ADDED before the POST has returned: the claim waits for the outcome."""
    own = OwnCreations(wait_seconds=30)
    posted, result = threading.Event(), []
    event = created("ns", "mt", "a", "5")

    def reconcile():
        with own.creating("ns", "mt"):
            posted.wait(30)  # the POST is still on its way back
            own.add(event)

    creator = threading.Thread(target=reconcile)
    creator.start()
    claimer = threading.Thread(target=lambda: result.append(own.claim(event)))
    claimer.start()
    claimer.join(timeout=0.3)
    assert claimer.is_alive(), "the claim must wait while the JobSet's creation is in flight"
    posted.set()
    claimer.join(timeout=30)
    creator.join(timeout=30)
    assert result == [True]


def test_a_failed_creation_releases_waiting_claims():
    own = OwnCreations(wait_seconds=30)
    posting, result = threading.Event(), []
    event = created("ns", "mt", "a", "5")

    def reconcile():
        try:
            with own.creating("ns", "mt"):
                posting.set()
                time.sleep(0.3)  # the claim below is waiting by now
                raise RuntimeError("POST refused")
        except RuntimeError:
            pass

    creator = threading.Thread(target=reconcile)
    creator.start()
    posting.wait(30)
    started = time.monotonic()
    result.append(own.claim(event))
    creator.join(timeout=30)
    # Released when the POST failed, not after wait_seconds; nothing was added: the event is news.
    assert result == [False]
    assert time.monotonic() - started < 10


def test_a_hung_creation_stalls_a_claim_for_wait_seconds_only():
    own = OwnCreations(wait_seconds=0.2)
    with own.creating("ns", "mt"):
        started = time.monotonic()
        assert not own.claim(created("ns", "mt", "a", "5"))
        assert time.monotonic() - started >= 0.2  # it did wait for the creation in flight
        # Other JobSets never wait on this one.
        started = time.monotonic()
        own.add(created("ns", "other", "b", "1"))
        assert own.claim(created("ns", "other", "b", "1"))
        assert time.monotonic() - started < 0.2
