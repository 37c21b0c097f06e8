"""Releasing DataFrames checkpointed on a Spark Connect server outside the garbage
collector.

PySpark 4's ``CachedRemoteRelation.__del__`` (the plan of a DataFrame checkpointed on
the server) tells the server to drop its copy with a blocking gRPC call. The cyclic
collector runs finalizers wherever an allocation sets it off, including in the thread
gRPC starts for another call while that call holds the channel: the release then waits
for a lock its own caller holds, and the process hangs for good (an audit's second run
in one session did, its first run's checkpoints collected meanwhile). The release is
the library's own; here the finalizer only queues it, and one thread sends the queued
releases as any other caller of the channel would.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
_queued: queue.SimpleQueue[tuple[Callable[[Any], None], Any] | threading.Event] = queue.SimpleQueue()  # put: finalizer-safe
_installed = threading.Lock()
_installed_in: int | None = None  # the process whose thread sends (a forked child starts its own)


def release_outside_the_collector() -> None:
    """Queue the server-cached relations' releases for a thread of their own (once per
    process)."""
    global _installed_in
    from pyspark.sql.connect.plan import CachedRemoteRelation

    with _installed:
        if _installed_in == os.getpid():
            return
        if _installed_in is None:
            release = CachedRemoteRelation.__del__

            def queue_release(relation: Any) -> None:
                if getattr(relation, "_relation_id", None) is not None:
                    _queued.put((release, relation))  # the relation lives on until the thread has released it

            CachedRemoteRelation.__del__ = queue_release  # type: ignore[method-assign]
        threading.Thread(target=_send_releases, name="spark-connect-releases", daemon=True).start()
        _installed_in = os.getpid()


def _send_releases() -> None:
    while True:
        item = _queued.get()
        if isinstance(item, threading.Event):
            item.set()  # everything queued before it is sent
            continue
        release, relation = item
        try:
            release(relation)  # the library's, which logs its own failures
        except Exception as e:  # noqa: BLE001 (this thread must go on releasing the others)
            log.warning("releasing a DataFrame checkpointed on the Spark server failed: %s", e)
        relation._relation_id = None  # released: a finalizer run again finds nothing to do
        del item, release, relation  # not kept alive (nor its session) until the next one


def releases_sent(timeout: float) -> bool:
    """Wait until every release queued so far is sent; whether it was within ``timeout``."""
    sent = threading.Event()
    _queued.put(sent)
    return sent.wait(timeout)


def release_checkpoints(session: Any, timeout: float) -> bool:
    """Release every DataFrame ``session`` checkpointed on the server, those this process
    still holds too (they are of no use once their session stops); whether the queued
    releases were sent in time. A held one whose release fails raises."""
    import gc

    from pyspark.sql.connect.plan import CachedRemoteRelation, RemoveRemoteCachedRelation

    gc.collect()  # the dropped ones: queued by their finalizers
    if not releases_sent(timeout):
        return False
    held: list[Any] = [o for o in gc.get_objects() if isinstance(o, CachedRemoteRelation)
                       and o._spark_session is session and getattr(o, "_relation_id", None) is not None]
    for relation in held:
        # Not the library's finalizer, which logs a failure and goes on: this one must be known.
        session.client.execute_command(RemoveRemoteCachedRelation(relation).command(session.client))
        relation._relation_id = None
    return True
