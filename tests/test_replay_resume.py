"""A replay of a numbered stream with a lost part, stopped and resumed (no servers).

Transactions are simulated as a source runs them: each takes row locks on one to three
segments, a one-phase one commits on its segment, a two-phase one writes its commit
record and then its parts, one segment at a time, each releasing that segment's locks.
Capture's messages are rendered per partition: the numbered parts, watermarks (some
without a time, as capture's first of a session), the commit records. One part is
lost. A first run reads the partitions interleaved at random through the real Framer
and Reassembler, taking a checkpoint with every batch handed out as the replayer does
(``resume_point``); a second run resumes from one of those checkpoints, seeded as the
replayer seeds it (``ingest.last_numbering``, its Kafka reads served from the same
messages), in half the runs with everything before the resume point removed by
retention. Neither run may hand out the lost part's transaction, nor any transaction
that follows the lost part on its segment and writes one of its rows; both must report
the loss.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.ingest import _consumer, last_numbering
from gpcdc_toolkit.replay import Framer, Part, Reassembler, ReassemblyError, Record, Watermark
from gpcdc_toolkit.replay._order import resume_point

Row = tuple[int, int]  # (segment, key)


def simulate(rng: random.Random, segments: int, transactions: int) -> tuple[list[tuple[Any, ...]], dict[int, set[Row]]]:
    """Events in commit order: ("record", gxid, t), ("part", segment, gxid, t, one_phase),
    ("beat", segment, t); and each transaction's rows."""
    writes = {g: {(s, rng.randrange(3)) for s in rng.sample(range(segments), rng.choice([1, 1, 2, segments]))
                  for _ in range(rng.randint(1, 2))} for g in range(1, transactions + 1)}
    locks: dict[Row, int] = {}
    state = dict.fromkeys(writes, "waiting")
    pending: dict[int, list[int]] = {}
    events: list[tuple[Any, ...]] = []
    t = 0
    while any(v != "done" for v in state.values()):
        steps: list[tuple[Any, ...]] = []
        for g, now in state.items():
            if now == "waiting" and all(locks.get(w) in (None, g) for w in writes[g]):
                steps.append(("lock", g))
            elif now == "locked":
                steps.append(("commit", g))
            elif now == "recorded":
                steps += [("part", g, s) for s in pending[g]]
        step = rng.choice(steps)
        g, t = step[1], t + 10
        on = sorted({s for s, _ in writes[g]})
        if step[0] == "lock":
            locks.update(dict.fromkeys(writes[g], g))
            state[g] = "locked"
        elif step[0] == "commit" and len(on) == 1:
            events.append(("part", on[0], g, t, True))
            for w in writes[g]:
                del locks[w]
            state[g] = "done"
        elif step[0] == "commit":
            events.append(("record", g, t))
            pending[g], state[g] = on, "recorded"
        else:
            s = step[2]
            events.append(("part", s, g, t, False))
            for w in [w for w in writes[g] if w[0] == s]:
                del locks[w]
            pending[g].remove(s)
            state[g] = "done" if not pending[g] else "recorded"
        if rng.random() < 0.3:
            events.append(("beat", rng.randrange(segments), t + 5))
    return events, writes


def render(rng: random.Random, events: list[tuple[Any, ...]], writes: dict[int, set[Row]], segments: int,
           lost: tuple[int, int]) -> tuple[dict[int, list[dict[str, Any]]], list[list[int]]]:
    """Each partition's messages (-1: the coordinator's), the lost part left out (its
    number too); and each segment's commit order."""
    partitions: dict[int, list[dict[str, Any]]] = {
        s: [{"type": "pipeline", "pipeline": "p1", "segment": s, "version": 2, "parts": 0}] for s in range(segments)}
    partitions[-1] = [{"type": "pipeline", "pipeline": "p1", "segment": -1, "version": 2}]
    count, lsn, logs = [0] * segments, [0] * segments, [[] for _ in range(segments)]
    recorded: dict[int, int] = {}
    committed: set[tuple[int, int]] = set()
    for event in events:
        if event[0] == "record":
            _, g, t = event
            recorded[g] = t
            partitions[-1].append({"type": "commit", "gxid": g, "segments": sorted({s for s, _ in writes[g]}),
                                   "commit_ts_ms": t, "commit_lsn": t})
        elif event[0] == "part":
            _, s, g, t, one_phase = event
            count[s], lsn[s] = count[s] + 1, lsn[s] + 10
            committed.add((s, g))
            logs[s].append(g)
            if (s, g) != lost:
                partitions[s] += [{"status": "BEGIN", "segment": s, "commit_lsn": lsn[s], "gxid": g},
                                  {"status": "END", "segment": s, "commit_lsn": lsn[s], "gxid": g, "one_phase": one_phase,
                                   "commit_ts_ms": t, "event_count": 0, "number": count[s]}]
        else:
            _, s, t = event
            beat: dict[str, Any] = {"type": "resolved", "segment": s, "resolved": lsn[s], "parts": count[s]}
            if rng.random() < 0.3:
                beat["resolved_ts_ms"] = None  # a capture session's first, before its clock was read
            else:
                beat |= {"resolved_ts_ms": t, "prepared_ts_ms": t, "prepared": sorted(
                    g for g in recorded if (s, g) not in committed and any(w[0] == s for w in writes[g]))}
            partitions[s].append(beat)
    for s in range(segments):  # proves every absence
        partitions[s].append({"type": "resolved", "segment": s, "resolved": lsn[s] + 1, "parts": count[s],
                              "resolved_ts_ms": 10**9, "prepared_ts_ms": 10**9, "prepared": []})
    return partitions, logs


class _Message:
    def __init__(self, partition: int, offset: int, value: bytes) -> None:
        self._partition, self._offset, self._value = partition, offset, value

    def value(self) -> bytes:
        return self._value

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


def _serve(monkeypatch: pytest.MonkeyPatch, partitions: dict[int, list[dict[str, Any]]],
           low: dict[int, int] | None = None) -> None:
    """``last_numbering``'s Kafka reads, served from the partitions' messages from
    ``low`` on (where retention removed those before)."""
    encoded = {p: [orjson.dumps(m) for m in ms] for p, ms in partitions.items()}

    def read_to_end(kafka: Any, topic: str, *, start: dict[int, int] | None = None,
                    partitions: list[int], **_: Any) -> Iterator[_Message]:
        (p,) = partitions
        for offset in range(max((start or {}).get(p, 0), (low or {}).get(p, 0)), len(encoded[p])):
            yield _Message(p, offset, encoded[p][offset])

    monkeypatch.setattr(_consumer, "read_to_end", read_to_end)
    monkeypatch.setattr(_consumer, "first_message", lambda kafka, topic, p, **_: next(
        read_to_end(kafka, topic, partitions=[p]), None))


def replay(rng: random.Random, partitions: dict[int, list[dict[str, Any]]], resume: dict[int, int],
           read: dict[int, int], lsns: dict[int, int], applied: list[int]) -> tuple[list[int], list[Any], list[Any]]:
    """(gxids handed out, missing, the checkpoints written) of one run from ``resume``."""
    segments = len(partitions) - 1
    framer = Framer("p", read=read, lsn=lsns)
    r = Reassembler(segments, clock_skew_ms=0, applied=frozenset(applied))
    for s in range(segments):
        if resume.get(s, 0) > 0 and isinstance(found := last_numbering({}, "p.changes", s, resume[s]), tuple):
            r.add_watermark(s, -1, parts=found[1])  # as the replayer seeds a partition read partway
    handed: list[int] = []
    checkpoints = []
    next_offsets = dict(resume)
    queue = [p for p in partitions for _ in range(resume.get(p, 0), len(partitions[p]))]
    rng.shuffle(queue)  # each partition in its own order, interleaved at random
    for p in queue:
        offset = next_offsets.get(p, 0)
        next_offsets[p] = offset + 1
        framed = framer.feed(p, offset, partitions[p][offset])
        if isinstance(framed, Part):
            r.add_part(framed)
        elif isinstance(framed, Record):
            r.add_record(framed)
        elif isinstance(framed, Watermark):
            r.add_watermark(framed.segment, framed.resolved_ts_ms, framed.prepared, framed.prepared_ts_ms,
                            framed.parts, framed.lost, framed.offset, framed.resolved_lsn, at=framed.offset)
        if out := r.ready():
            handed += [w.gxid for w in out]
            checkpoints.append((resume_point(next_offsets, r, [], framer.resume_offsets()), dict(next_offsets),
                                dict(framer.last_lsn), applied + handed))
        if r.missing():
            break
    return handed, r.missing(), checkpoints


@settings(max_examples=400, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(2, 3), st.integers(4, 30))
def test_a_lost_part_is_reported_and_nothing_it_must_precede_goes_out_before_or_after_a_resume(
        rng, segments, transactions):
    events, writes = simulate(rng, segments, transactions)
    lost_event = rng.choice([e for e in events if e[0] == "part"])
    lost = segment, victim = lost_event[1], lost_event[2]
    partitions, logs = render(rng, events, writes, segments, lost)
    after = logs[segment][logs[segment].index(victim) + 1:]
    forbidden = {victim} | {g for g in after if any(w in writes[victim] for w in writes[g] if w[0] == segment)}

    with pytest.MonkeyPatch.context() as monkeypatch:
        _serve(monkeypatch, partitions)
        handed, missing, checkpoints = replay(rng, partitions, {}, {}, {}, [])
        assert not forbidden & set(handed), f"{sorted(forbidden & set(handed))} went out; {lost} was lost"
        assert missing, f"the loss of {lost} is not reported"
        assert missing[0].gxid in (None, victim) and missing[0].segment in (segment, *range(segments))
        if not checkpoints:
            return
        resume, read, lsns, applied = rng.choice(checkpoints)
        if rng.random() < 0.5:
            _serve(monkeypatch, partitions, low=resume)  # retention removed everything before the resume point
        try:
            handed, missing, _ = replay(rng, partitions, resume, read, lsns, applied)
        except ReassemblyError:
            return  # stopped another way: nothing more went out
    assert not forbidden & set(handed), f"resumed at {resume}: {sorted(forbidden & set(handed))} went out"
    assert missing, f"resumed at {resume}: the loss of {lost} is no longer reported"
