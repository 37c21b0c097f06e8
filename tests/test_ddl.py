import pytest

from gpcdc_toolkit.protocol import DdlError, parse_create_table


def test_distributed_by_is_split_off():
    parsed = parse_create_table('create table if not exists s."My T" (a int, "B" int, primary key (a, "B")) distributed by (a, "B");')
    assert parsed.table == 's."My T"'
    assert parsed.distribution_key == ("a", "B")
    assert "distributed" not in parsed.statement.lower()
    assert parsed.statement.endswith('primary key (a, "B"))')


def test_other_statements_pass_through():
    assert parse_create_table("ALTER TABLE t ADD COLUMN c int") is None
    assert parse_create_table("DROP TABLE t") is None


@pytest.mark.parametrize("statement,message", [
    ("CREATE TABLE t (a int)", "no DISTRIBUTED BY clause"),
    ("CREATE TABLE t (a int) DISTRIBUTED RANDOMLY", "only DISTRIBUTED BY"),
    ("CREATE TABLE t (a int) DISTRIBUTED BY ()", "empty DISTRIBUTED BY"),
])
def test_unsupported_distribution(statement, message):
    with pytest.raises(DdlError, match=message):
        parse_create_table(statement)
