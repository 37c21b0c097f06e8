"""A table's fix as planned from its row differences (no servers): run on a model of the
target's nodes, statement by statement as PostgreSQL would run it, the fix leaves each
node holding exactly the source's rows that the distribution sends there. Whatever
copies the target holds and wherever (a key held twice where a node lost its unique
index, copies on nodes their key does not name), each copy is counted once."""

from collections import Counter
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from gpcdc_toolkit.cluster._cluster import Table
from gpcdc_toolkit.validate._checksum import DELETE, INSERT, UPDATE, _as_multiset, _by_key, planned

NODES = 3
KEYED = Table('public."Keyed"', ("k", "v"), ("integer", "text"), ("k",), ("k",), parts=("public", "Keyed"))
KEYLESS = Table('public."log"', ("k", "v"), ("integer", "text"), ("k",), (), parts=("public", "log"))


def home(row):
    return int(row[0]) % NODES


TARGET = SimpleNamespace(cluster=SimpleNamespace(home_of=lambda values: int(values[0]) % NODES, writer_of=lambda n: n))
ROWS = st.tuples(st.sampled_from(["0", "1", "2", "3", "-4"]), st.sampled_from(["a", "it's", "(1,a)", None]))


def run(nodes, fix):
    """One statement on the model, as the server runs it: a delete or update by key
    reaches every row of the node under the key; a delete of one copy, one row."""
    held = nodes[fix.node]
    text = fix.statement.as_string(None)
    if fix.step == DELETE and "ctid" in text:
        assert held[fix.row.target] > 0, f"{text} finds no row on node {fix.node}"
        held[fix.row.target] -= 1
    elif fix.step == DELETE:
        for row in [r for r in held if r[0] == fix.row.key[0]]:
            del held[row]
    elif fix.step == UPDATE:
        for row in [r for r in held if r[0] == fix.row.key[0]]:
            held[fix.row.source] += held.pop(row)
    else:
        assert fix.step == INSERT
        row = fix.row.target if fix.row.kind == "misplaced" else fix.row.source
        assert fix.node == home(row)
        held[row] += 1


@settings(max_examples=400, deadline=None)
@given(keyed=st.booleans(), source=st.lists(ROWS, max_size=8),
       target=st.lists(st.tuples(st.integers(0, NODES - 1), ROWS), max_size=10))
def test_the_planned_fix_leaves_each_node_the_source_rows_it_is_home_to_and_counts_each_copy_once(keyed, source, target):
    info = KEYED if keyed else KEYLESS
    if keyed:  # the source keeps its key unique
        source = list({row[0]: row for row in source}.values())
    src = [(home(row), row, repr(row)) for row in source]
    tgt = [(node, row, repr(row)) for node, row in target]
    misplaced = [(node, sql.Identifier("shard"), row, repr(row)) for node, row in target if node != home(row)]
    diff, fixes = (_by_key if keyed else _as_multiset)(info, TARGET, src, tgt, misplaced)
    moved, plan = planned(TARGET, info, diff, fixes, misplaced)

    nodes = {node: Counter() for node in range(NODES)}
    for node, row in target:
        nodes[node][row] += 1
    for fix in plan:
        run(nodes, fix)
    for node in range(NODES):
        assert +nodes[node] == Counter(row for row in source if home(row) == node), (diff, moved, plan)
    # Each copy on the target is named once at most: extra (or a changed version), or misplaced.
    named = Counter((r.target_segment, r.target) for r in (*diff.rows, *moved) if r.target is not None)
    assert named <= Counter(target), (diff, moved)
    if not keyed:  # per row: the copies short and each misplaced one, or the most of the copies too many and those misplaced
        want, have, stray = Counter(source), Counter(row for _node, row in target), Counter(row for _n, _r, row, _t in misplaced)
        least = sum(want[row] - have[row] + stray[row] if have[row] <= want[row] else max(have[row] - want[row], stray[row])
                    for row in want | have)
        assert diff.missing + diff.extra + len(moved) == least, (diff, moved)
    for node in range(NODES):
        steps = [fix.step for fix in plan if fix.node == node]
        assert steps == sorted(steps)


class _Said:
    def __init__(self):
        self.statements = []

    def execute(self, statement):
        self.statements.append(statement.as_string(None))


def _side(hosts):
    nodes = [SimpleNamespace(content=i, host=host) for i, host in enumerate(hosts)]
    conns = [_Said() for _ in nodes]
    return SimpleNamespace(cluster=SimpleNamespace(segments=nodes), segments=lambda: list(zip(nodes, conns))), conns


def test_nodes_on_this_machine_get_parallel_workers_only_for_its_spare_cores(monkeypatch):
    from gpcdc_toolkit.validate import _checksum

    for cores, hosts, workers in ((2, ["127.0.0.1"] * 5, 0), (16, ["127.0.0.1"] * 3 + ["/tmp/sock", "localhost"], 2),
                                  (64, ["127.0.0.1"] * 2, 31)):
        monkeypatch.setattr(_checksum.os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        (source, said), (target, told) = _side(hosts[:len(hosts) // 2]), _side(hosts[len(hosts) // 2:])
        _checksum._share_cores((source, target))
        assert {s for conn in said + told for s in conn.statements} == {f"SET LOCAL max_parallel_workers_per_gather = {workers}"}
    (source, said), (target, told) = _side(["127.0.0.1"] * 3), _side(["db.example.com"])
    _checksum._share_cores((source, target))  # a remote server keeps its own settings, and so do the local ones beside it
    assert not any(conn.statements for conn in said + told)
