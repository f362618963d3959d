"""Dense vnode memory (store/memory.py) and the kernel warm-up (warm.py)."""

import subprocess
import sys
import threading

import numpy as np
import pytest

from paramserver.store import memory
from paramserver.store.memory import BACKGROUND_BYTES, PAGE, zeroed_rows


def test_zeroed_rows_are_zero_and_keep_writes_made_while_pages_are_mapped():
    n = (64 << 20) // 16  # 64 MiB: the background thread maps it in 16 MiB steps
    rows = zeroed_rows(n, 4)
    assert rows.shape == (n, 4) and rows.dtype == np.float32
    picks = np.arange(0, n, 997)
    rows[picks, 1] = picks + 0.5  # while the thread may still be mapping the pages
    memory._populater.wait()
    assert threading.active_count() == 1 or all(t.name != "paramserver-populate" for t in threading.enumerate())
    assert np.array_equal(rows[picks, 1], picks + np.float32(0.5))
    rows[picks, 1] = 0
    assert not rows.any()


def test_small_and_empty_arrays_are_mapped_at_once():
    before = threading.active_count()
    small = zeroed_rows(BACKGROUND_BYTES // 16 - 1, 4)
    assert not small.any() and threading.active_count() == before
    assert zeroed_rows(0, 4).shape == (0, 4)


def test_without_madvise_populate_the_pages_are_touched_at_once(monkeypatch):
    monkeypatch.setattr(memory._populater, "supported", False)
    rows = zeroed_rows(BACKGROUND_BYTES // PAGE * 8, PAGE // 4)
    assert memory._populater._thread is None
    assert rows[::97].sum() == 0


def test_a_dense_vnodes_rows_start_on_a_huge_page_and_are_advised_to_use_them():
    for n, width in (((4 << 20) // 16, 4), ((3 << 20) // 12, 3), (300_001, 4)):  # 4, 3 and 4.6 MiB
        rows = zeroed_rows(n, width)
        memory._populater.wait()
        # on a 2 MiB boundary, whatever the length (the kernel itself aligns only whole multiples of
        # 2 MiB), so each whole 2 MiB of it can be a huge page (whether one is, is the kernel's to say)
        assert rows.ctypes.data % (2 << 20) == 0 and rows.shape == (n, width) and not rows.any()
    small = zeroed_rows(1000, 4)  # under 2 MiB: a plain mapping, no huge page to ask for
    assert small.shape == (1000, 4) and not small.any()


def test_a_mapping_the_machine_refuses_is_a_memory_error():
    with pytest.raises(MemoryError, match="cannot map"):
        zeroed_rows(1 << 45, 4)  # 512 TiB: more than the address space
    with pytest.raises(MemoryError, match="cannot map"):
        zeroed_rows(1 << 62, 4)


def test_numba_loads_without_importing_scipy_for_blas_and_dot_still_works():
    pytest.importorskip("scipy")
    code = """if True:
        import sys
        import numpy as np
        from numba import njit
        from paramserver._runtime.warm import load_numba
        from paramserver.apps.ctr.warmup import warm_all
        load_numba()
        warm_all()
        assert "scipy.linalg" not in sys.modules, "numba's BLAS probe imported scipy.linalg"
        assert "scipy.linalg.cython_blas" not in sys.modules  # the hiding entry is gone again
        a = np.arange(4.0)
        assert njit(lambda x, y: np.dot(x, y))(a, a) == 14.0  # 1-d dot: a loop
        m = np.eye(2)
        assert (njit(lambda x, y: np.dot(x, y))(m, m) == m).all()  # 2-d dot: BLAS, scipy imported now
        assert "scipy.linalg.cython_blas" in sys.modules
        print("ok")
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
