"""Passwords stay out of what others can read: error messages and process lists (no servers)."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=300)
@given(st.text(alphabet="abcdefghijkXYZ0123456789!#%&*+,.:;<>?[]^_{|}~", min_size=6, max_size=16),
       st.sampled_from(["host=db password={p} bogus", "host=db password='{p}' port", "password {p} host=x",
                        "postgresql://u:{p}@db:1/x?y", "host=db port=1 password={p} dbname"]))
def test_a_malformed_dsn_is_quoted_without_its_password(password, form):
    from gpcdc_toolkit.cluster._cluster import _where
    from gpcdc_toolkit.errors import ClusterError

    dsn = form.format(p=password)
    with pytest.raises(ClusterError) as refused:
        _where(dsn)
    said = str(refused.value)
    assert "***" in said and password not in said, said
    for quoted in re.findall(r'"([^"]*)"', said):  # what libpq quotes from the DSN
        assert not any(password[i:i + 3] in quoted for i in range(len(password) - 2)), said
    assert "\n" not in str(refused.value)
