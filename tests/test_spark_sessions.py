"""The slots that hand the Spark server's sessions from one process to the next
(``ingest/_sessions.py``), against a model: held slots are never shared, a session given
back tidy is reused, one left in use is named for release and replaced, and a session of
an earlier server run is never reused. (tests/test_spark_server.py runs them on a real
server, processes in turn, killed and side by side.)"""

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, multiple, rule

from gpcdc_toolkit.ingest._sessions import take_slot


class Slots(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp())
        self.directory = self.root / "sessions"
        # per slot index: (server, session, in use) as the model expects the file to say;
        # a slot with no file is absent
        self.model: dict[int, tuple[str, str, bool]] = {}
        self.slots = 0  # slots ever taken: their lock files stay
        self.held: dict[int, object] = {}
        self.released: set[str] = set()
        self.damaged: set[int] = set()

    @rule(target=leases, server=st.sampled_from(["1:sc://127.0.0.1:1", "2:sc://127.0.0.1:1", "1:sc://127.0.0.1:2"]),
          unreachable=st.booleans())
    def take(self, server, unreachable):
        index = next(i for i in range(len(self.held) + 1) if i not in self.held)
        left_in_use = {i: session for i, (sv, session, in_use) in self.model.items()
                       if i not in self.held and sv == server and in_use}
        before = self.model.get(index)
        released = []

        def release(session):
            if unreachable:
                raise ConnectionError("the server does not answer")
            released.append(session)

        if unreachable and left_in_use:
            # Nothing is forgotten: the sessions stay named, for a later process to release.
            with pytest.raises(ConnectionError):
                take_slot(self.directory, server, release)
            if index not in left_in_use:  # its slot was taken before the failing release: left in use
                state = json.loads((self.directory / f"{index}.json").read_text())
                assert state["in_use"] and state["server"] == server
                self.model[index] = (server, state["session"], True)
                self.slots = max(self.slots, index + 1)
            return multiple()
        lease = take_slot(self.directory, server, release)
        assert lease.state_file.name == f"{index}.json"  # the first slot no one holds
        # Every free slot's session left in use is released, and only those.
        assert sorted(released) == sorted(left_in_use.values())
        self.released.update(released)
        if before is not None and before[0] == server and not before[2]:
            assert lease.session_id == before[1]  # given back tidy: reused
        else:
            assert lease.session_id not in {session for _sv, session, _u in self.model.values()} | self.released
        for i in left_in_use:
            del self.model[i]
        self.model[index] = (server, lease.session_id, True)
        self.held[index] = lease
        self.slots = max(self.slots, index + 1)
        return lease

    @rule(lease=leases)
    def start_anew(self, lease):
        if not lease.given_back:
            index = int(lease.state_file.stem)
            server, session, _in_use = self.model[index]
            lease.start_anew()
            assert lease.session_id != session
            self.model[index] = (server, lease.session_id, True)

    @rule(lease=consumes(leases), tidy=st.booleans(), twice=st.booleans())
    def give_back(self, lease, tidy, twice):
        index = int(lease.state_file.stem)
        lease.give_back(tidy)
        if twice:
            lease.give_back(not tidy)  # a second give-back changes nothing
        server, session, _in_use = self.model[index]
        self.model[index] = (server, session, not tidy)
        del self.held[index]

    @rule(index=st.integers(0, 3), text=st.sampled_from(['{"server": ', '[]', '{"server": "1:sc://127.0.0.1:1", '
                                                         '"session": "not a uuid", "in_use": true}']))
    def damage(self, index, text):
        """A slot's file half-written, or not the toolkit's: its next holder starts a new session."""
        if index in self.model and index not in self.held:
            (self.directory / f"{index}.json").write_text(text)
            del self.model[index]
            self.damaged.add(index)

    @invariant()
    def files_say_what_the_model_says(self):
        for index in range(self.slots):
            if index in self.model:
                server, session, in_use = self.model[index]
                assert json.loads((self.directory / f"{index}.json").read_text()) == {
                    "server": server, "session": session, "in_use": in_use}
            elif index not in self.damaged:  # its session released: nothing names it
                assert not (self.directory / f"{index}.json").exists()

    def teardown(self):
        for lease in self.held.values():
            lease.give_back(False)
        shutil.rmtree(self.root)


TestSlots = Slots.TestCase
TestSlots.settings = settings(max_examples=60, stateful_step_count=25)
