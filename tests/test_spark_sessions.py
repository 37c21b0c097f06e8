"""The slots that hand the Spark server's sessions from one process to the next
(``ingest/_sessions.py``), against a model: held slots are never shared, a session given
back tidy is reused, one left in use is named for release and replaced, and a session of
an earlier server run is never reused. (tests/test_spark_server.py runs them on a real
server, processes in turn, killed and side by side.)"""

import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from gpcdc_toolkit.ingest._sessions import take_slot


class Slots(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp())
        self.directory = self.root / "sessions"
        # per slot index: (server, session, in use) as the model expects the file to say
        self.model: dict[int, tuple[str, str, bool]] = {}
        self.held: dict[int, object] = {}

    @rule(target=leases, server=st.sampled_from(["1:sc://127.0.0.1:1", "2:sc://127.0.0.1:1", "1:sc://127.0.0.1:2"]))
    def take(self, server):
        index = next(i for i in range(len(self.held) + 1) if i not in self.held)
        before = self.model.get(index)
        lease = take_slot(self.directory, server)
        assert lease.state_file.name == f"{index}.json"  # the first slot no one holds
        if before is None or before[0] != server:
            assert lease.stale_session_id is None
            assert before is None or lease.session_id != before[1]
        elif before[2]:  # left in use by a holder that did not give it back
            assert lease.stale_session_id == before[1] and lease.session_id != before[1]
        else:
            assert (lease.session_id, lease.stale_session_id) == (before[1], None)
        assert lease.session_id not in {s for i, (_sv, s, _u) in self.model.items() if i != index}
        self.model[index] = (server, lease.session_id, True)
        self.held[index] = lease
        return lease

    @rule(lease=consumes(leases), tidy=st.booleans(), twice=st.booleans())
    def give_back(self, lease, tidy, twice):
        index = int(lease.state_file.stem)
        lease.give_back(tidy)
        if twice:
            lease.give_back(not tidy)  # a second give-back changes nothing
        server, session, _in_use = self.model[index]
        self.model[index] = (server, session, not tidy)
        del self.held[index]

    @rule(index=st.integers(0, 3))
    def damage(self, index):
        """A slot's file half-written or emptied: its next holder starts a new session."""
        if index in self.model and index not in self.held:
            (self.directory / f"{index}.json").write_text("{\"server\": ")
            self.model[index] = ("", "", False)

    @invariant()
    def files_say_what_the_model_says(self):
        for index, (server, session, in_use) in self.model.items():
            if server:
                assert json.loads((self.directory / f"{index}.json").read_text()) == {
                    "server": server, "session": session, "in_use": in_use}

    def teardown(self):
        for lease in self.held.values():
            lease.give_back(False)
        shutil.rmtree(self.root)


TestSlots = Slots.TestCase
TestSlots.settings = settings(max_examples=60, stateful_step_count=25)
