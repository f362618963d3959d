"""Every test can fail, checked by ``make lint``: a test function that asserts nothing is flagged.

    python tools/asserts.py        # exits 1 naming every test function that checks nothing

A test function is a ``def test_*`` (a method of a class too) in ``tests/**/test_*.py``. It
checks something when its body (nested functions and lambdas included) holds one of:

- an ``assert`` statement;
- ``pytest.raises``, ``pytest.warns``, ``pytest.fail`` or ``pytest.approx`` (the last only
  counts inside an ``assert``, which already counts), as a call or a ``with``;
- a call to a function whose name starts with ``assert`` (``np.testing.assert_array_equal``,
  ``self.assertEqual``, a helper ``assert_rows``);
- a call to a helper that checks: a function defined anywhere under ``tests/`` (a conftest,
  a support module, the test file itself) whose body raises (a ``raise`` statement) or
  checks as above, or calls such a helper, transitively.

Helpers are resolved by name alone (``helper(...)``, ``module.helper(...)`` and
``obj.helper(...)`` all name ``helper``), without following imports: a name defined twice
counts as checking if either definition does. That is lenient on purpose: it catches the test
that asserts nothing, not the one whose helper is weak. Functions outside ``tests/`` (the
package's own) do not count: a test says what it expects of them.

``EXCEPTIONS`` below lists the tests that check by other means, each with why; an exception
that checks now, or that no longer exists, fails the check too: the list only shrinks.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (path under the repository, test name): why it checks without an assert
EXCEPTIONS: dict[tuple[str, str], str] = {}

PYTEST_CHECKS = {"raises", "warns", "fail", "deprecated_call"}


def _called_name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


def _is_pytest_check(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr in PYTEST_CHECKS and isinstance(f.value, ast.Name)
            and f.value.id == "pytest")


def checks_itself(fn: ast.AST, raising_counts: bool) -> bool:
    """True if ``fn``'s body asserts, calls pytest's checks or an ``assert*``, or (for a
    helper, ``raising_counts``) raises."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert) or (raising_counts and isinstance(node, ast.Raise)):
            return True
        if isinstance(node, ast.Call) and (_is_pytest_check(node) or _called_name(node).startswith("assert")):
            return True
    return False


def calls(fn: ast.AST) -> set[str]:
    """The names ``fn`` calls (its own body, nested functions included)."""
    return {_called_name(n) for n in ast.walk(fn) if isinstance(n, ast.Call)} - {""}


def _functions(tree: ast.AST) -> Iterable[ast.FunctionDef | ast.AsyncFunctionDef]:
    return (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def checking_helpers(trees: Iterable[ast.AST]) -> set[str]:
    """The names of every function under the trees that checks, directly or through
    another such function (a fixed point over names)."""
    bodies: dict[str, list[ast.AST]] = {}
    for tree in trees:
        for fn in _functions(tree):
            bodies.setdefault(fn.name, []).append(fn)
    checking = {name for name, fns in bodies.items() if any(checks_itself(f, raising_counts=True) for f in fns)}
    called = {name: set().union(*(calls(f) for f in fns)) for name, fns in bodies.items()}
    grew = True
    while grew:
        grew = False
        for name in bodies.keys() - checking:
            if called[name] & checking:
                checking.add(name)
                grew = True
    return checking


def test_functions(tree: ast.Module) -> Iterable[ast.FunctionDef | ast.AsyncFunctionDef]:
    """``def test_*`` at the top level of a file, and in its classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in node.body
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_"))


def check(root: Path = ROOT, exceptions: dict[tuple[str, str], str] | None = None) -> list[str]:
    """One line per test function under ``root / "tests"`` that checks nothing."""
    exceptions = EXCEPTIONS if exceptions is None else exceptions
    trees = {p.relative_to(root).as_posix(): ast.parse(p.read_text(), str(p))
             for p in sorted((root / "tests").rglob("*.py"))}
    helpers = checking_helpers(trees.values())
    problems, seen = [], set()
    for rel, tree in trees.items():
        if not Path(rel).name.startswith("test_"):
            continue
        for fn in test_functions(tree):
            key = (rel, fn.name)
            seen.add(key)
            if checks_itself(fn, raising_counts=False) or calls(fn) & helpers:
                if key in exceptions:
                    problems.append(f"{rel}: {fn.name} checks now: remove its entry from EXCEPTIONS in "
                                    "tools/asserts.py")
            elif key not in exceptions:
                problems.append(f"{rel}:{fn.lineno}: {fn.name} asserts nothing: no assert, no pytest.raises or "
                                "pytest.warns, no call to a helper that asserts or raises; say what it expects")
    for rel, name in sorted(set(exceptions) - seen):
        problems.append(f"{rel}: {name} is listed in EXCEPTIONS (tools/asserts.py) but is no test: remove it")
    return problems


def main() -> int:
    problems = check()
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
