"""Suites as the toolkit loads them for great-expectations: a malformed one is refused
in one line naming its file or suite, before anything is read."""

import json
import logging

import pytest

from gpcdc_toolkit._expect import Expectations, load_suites
from gpcdc_toolkit.errors import ConfigError


@pytest.mark.parametrize("expectations", [5, "expect_x", [5], [{"kwargs": {}}], [{"type": 1}],
                                          [{"type": "expect_column_values_to_not_be_null", "kwargs": [1]}]])
def test_expectations_that_are_not_a_list_of_typed_objects_name_the_file(tmp_path, expectations):
    (tmp_path / "bad.json").write_text(json.dumps({"name": "bad", "expectations": expectations}))
    with pytest.raises(ConfigError) as refused:
        load_suites(tmp_path)
    assert str(refused.value) == (f"{tmp_path / 'bad.json'}: expectations is not a list of objects, each with a "
                                  'type and its kwargs: write each as {"type": "expect_...", "kwargs": {...}}')


@pytest.mark.parametrize(("expectation", "said"), [
    ({"type": "expect_no_such_thing", "kwargs": {}}, "great-expectations kept 0 of its 1 expectations"),
    ({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": 5, "bogus": True}},
     "great-expectations cannot load it ("),
])
def test_an_expectation_great_expectations_cannot_load_is_one_line_and_nothing_is_logged(expectation, said, caplog):
    with caplog.at_level(logging.DEBUG), pytest.raises(ConfigError) as refused:
        Expectations().suite("odd", {"name": "odd", "expectations": [expectation]})
    assert str(refused.value).startswith(f"suite odd: {said}") and "\n" not in str(refused.value), refused.value
    assert not [r for r in caplog.records if r.name.startswith("great_expectations") and r.levelno >= logging.ERROR]
