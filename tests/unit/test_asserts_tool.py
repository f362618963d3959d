"""tools/asserts.py, the lint that every test can fail: run on small fake test trees."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from scripts import load_script


@pytest.fixture(scope="module")
def asserts():
    return load_script("tools/asserts.py", "asserts_tool")


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "tests" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


CHECKING = '''
import numpy as np
import pytest
from helpers import must_be_two, via

def test_assert():
    assert 1 + 1 == 2

def test_raises():
    with pytest.raises(ValueError):
        int("x")

def test_warns_as_a_call():
    pytest.warns(UserWarning, lambda: None)

def test_numpy_testing():
    np.testing.assert_array_equal(np.zeros(2), np.zeros(2))

def test_helper_in_another_file():
    must_be_two(2)

def test_helper_two_calls_away():
    via(2)

def test_helper_that_asserts_found_through_an_attribute(fixture_obj):
    fixture_obj.check_rows()

class TestInAClass:
    def test_method(self):
        self.assertEqual(1, 1)

def test_assert_in_a_nested_function():
    def inner():
        assert True
    inner()
'''

HELPERS = '''
def must_be_two(x):
    if x != 2:
        raise ValueError(f"{x} is not 2")

def via(x):
    return must_be_two(x)

def check_rows():
    assert True

def quiet(x):
    return x

def test_not_a_test_file():  # a support module's function is no test
    pass
'''

NOT_CHECKING = '''
import pytest
from helpers import quiet

def test_nothing():
    quiet(1)

def test_swallows_the_error():
    try:
        int("x")
    except ValueError:
        pass

def test_only_skips():
    pytest.importorskip("numpy")

class TestQuiet:
    def test_method(self):
        quiet(2)

def helper_not_a_test():
    pass
'''


def test_every_way_of_checking_counts_and_nothing_in_a_support_module_is_a_test(asserts, tmp_path):
    root = _tree(tmp_path, {"unit/test_checking.py": CHECKING, "unit/helpers.py": HELPERS,
                            "conftest.py": "def fixture_obj():\n    return None\n"})
    assert asserts.check(root, exceptions={}) == []


def test_each_test_that_checks_nothing_is_named_with_its_line(asserts, tmp_path):
    root = _tree(tmp_path, {"unit/test_quiet.py": NOT_CHECKING, "unit/helpers.py": HELPERS})
    problems = asserts.check(root, exceptions={})
    named = sorted(p.split(": ")[1].split()[0] for p in problems)
    assert named == ["test_method", "test_nothing", "test_only_skips", "test_swallows_the_error"]
    assert any(p.startswith("tests/unit/test_quiet.py:5: test_nothing asserts nothing") for p in problems)
    assert all("say what it expects" in p for p in problems)


def test_the_exception_list_excuses_a_test_and_only_shrinks(asserts, tmp_path):
    root = _tree(tmp_path, {"unit/test_quiet.py": NOT_CHECKING, "unit/helpers.py": HELPERS,
                            "unit/test_checking.py": "def test_assert():\n    assert True\n"})
    excused = {("tests/unit/test_quiet.py", name): "checked by other means"
               for name in ("test_nothing", "test_swallows_the_error", "test_only_skips", "test_method")}
    assert asserts.check(root, exceptions=excused) == []
    stale = {**excused, ("tests/unit/test_checking.py", "test_assert"): "x", ("tests/unit/test_gone.py", "test_x"): "y"}
    problems = asserts.check(root, exceptions=stale)
    assert problems == [
        "tests/unit/test_checking.py: test_assert checks now: remove its entry from EXCEPTIONS in "
        "tools/asserts.py",
        "tests/unit/test_gone.py: test_x is listed in EXCEPTIONS (tools/asserts.py) but is no test: remove it",
    ]


def test_the_repository_s_tests_all_check_something(asserts):
    assert asserts.check() == []
