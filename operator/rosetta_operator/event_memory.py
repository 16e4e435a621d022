"""What the operator remembers between watch events so that a repeat costs no API call: the JobSets
it created itself (their ADDED event is no news) and the last decision each Kueue Workload said."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Mapping, Optional


class OwnCreations:
    """JobSets this process created whose ADDED event it has not handled yet.

    `reconcile` writes the first status from the JobSet its POST returned, so the ADDED event of
    that same object (same resourceVersion) has nothing new to say; handling it anyway costs a
    training GET and, when it lands between the POST and reconcile's status PATCH (often, under
    load), a 409 for one of the two writers. Bounded: an event that never comes (a watch that
    restarted past it) does not pin memory. Empty after a restart, when every JobSet's ADDED
    event is handled as news.

    The watch can deliver the ADDED event before the POST that caused it has returned here, so a
    creation is announced by name first (`creating`) and `claim` waits, briefly, for its outcome.
    """

    def __init__(self, limit: int = 4096, wait_seconds: float = 10.0):
        self.limit = limit
        self.wait_seconds = wait_seconds
        self._versions: dict[str, str] = {}
        self._creating: dict[tuple[str, str], threading.Event] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def creating(self, namespace: str, name: str) -> Iterator[None]:
        """Around the POST of JobSet `namespace/name` and the `add` of what it returned."""
        key, done = (namespace, name), threading.Event()
        with self._lock:
            self._creating[key] = done
        try:
            yield
        finally:
            with self._lock:
                if self._creating.get(key) is done:
                    del self._creating[key]
            done.set()

    @staticmethod
    def _identity(jobset: Mapping[str, Any]) -> Optional[tuple[str, str]]:
        meta = jobset.get("metadata") or {}
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        return (uid, version) if uid and version else None

    def add(self, jobset: Mapping[str, Any]) -> None:
        identity = self._identity(jobset)
        if identity is None:
            return
        with self._lock:
            self._versions[identity[0]] = identity[1]
            while len(self._versions) > self.limit:
                del self._versions[next(iter(self._versions))]  # the oldest (dicts keep insertion order)

    def claim(self, jobset: Mapping[str, Any]) -> bool:
        """True (once) when `jobset` is exactly what this process created."""
        identity = self._identity(jobset)
        if identity is None:
            return False
        uid, version = identity
        meta = jobset["metadata"]
        with self._lock:
            pending = self._creating.get((meta.get("namespace"), meta.get("name")))
        if pending is not None:
            # Bounded: a POST that hangs must not stall the watch; the event is then handled as news.
            pending.wait(self.wait_seconds)
        with self._lock:
            if self._versions.get(uid) != version:
                return False
            del self._versions[uid]
            return True


class Decisions:
    """The last decision each Kueue Workload said, for at most `limit` of them (the oldest forgotten
    first): an event that repeats it (Kueue's own bookkeeping) costs no API call."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._last: dict[str, Any] = {}
        self._lock = threading.Lock()

    def changed(self, key: str, value: Any) -> bool:
        """True, and remembered, when `value` is not what `key` said last."""
        with self._lock:
            if key in self._last and self._last[key] == value:
                return False
            self._last.pop(key, None)
            self._last[key] = value
            while len(self._last) > self.limit:
                del self._last[next(iter(self._last))]
            return True

    def forget(self, key: str) -> None:
        with self._lock:
            self._last.pop(key, None)
