"""What a driver hands down to the nodes it forks (``_runtime/handed``): the driver's copy
inside the block, in the driver and in a forked child; nothing outside it, for a file
changed since, for another tag, or for a URL."""

from __future__ import annotations

import os

import pytest

from paramserver._runtime.handed import handed, handed_down


def test_a_forked_child_takes_the_drivers_copy_and_nothing_outlives_the_block(tmp_path):
    path = tmp_path / "data.svm"
    path.write_text("1 1:1\n")
    value = {"read": "once"}
    assert handed(str(path), "squared") is None
    with handed_down(str(path), "squared", value):
        assert handed(str(path), "squared") is value
        assert handed(str(tmp_path / ".." / tmp_path.name / "data.svm"), "squared") is value  # the same file
        assert handed(str(path), "logistic") is None  # read another way: not this copy
        if not hasattr(os, "fork"):
            pytest.skip("no fork on this platform")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: what a forked worker sees
            os.write(w, b"1" if handed(str(path), "squared") == {"read": "once"} else b"0")
            os._exit(0)
        os.close(w)
        assert os.read(r, 1) == b"1"
        os.waitpid(pid, 0)
        os.close(r)
    assert handed(str(path), "squared") is None


def test_a_file_changed_since_the_driver_read_it_is_read_again(tmp_path):
    path = tmp_path / "data.svm"
    path.write_text("1 1:1\n")
    with handed_down(str(path), "squared", "old copy"):
        path.write_text("1 1:1\n-1 2:1\n")  # another size
        assert handed(str(path), "squared") is None


def test_a_url_or_a_missing_file_is_never_handed_down(tmp_path):
    for path in ("s3://bucket/data.svm", str(tmp_path / "absent.svm")):
        with handed_down(path, "squared", "copy"):
            assert handed(path, "squared") is None
