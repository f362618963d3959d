"""``share_one_arena`` (``_runtime/malloc.py``): the threads a process starts after it allocate
from malloc's main arena, where each would otherwise take an arena of its own (glibc)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas")

_ARENAS = """
import ctypes, os, sys, tempfile, threading
from paramserver._runtime.malloc import share_one_arena
if sys.argv[1] == "cap":
    assert share_one_arena()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.fdopen.restype, libc.fdopen.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fflush.argtypes = [ctypes.c_void_p]
def work():  # a block past the thread's cache: its first allocation takes an arena
    libc.free(libc.malloc(1 << 16))
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
fd, path = tempfile.mkstemp()
f = libc.fdopen(fd, b"w")
libc.malloc_info(0, f)
libc.fflush(f)
print(open(path).read().count("<heap nr="))
os.remove(path)
"""


def _arenas(mode: str) -> int:
    run = subprocess.run([sys.executable, "-c", _ARENAS, mode], capture_output=True, text=True, timeout=60)
    if run.returncode:
        pytest.skip(f"not glibc's malloc here: {run.stderr.strip()[-200:]}")
    return int(run.stdout.strip())


def test_threads_started_after_the_cap_share_the_main_arena():
    assert _arenas("free") > 1  # without it, glibc gave the threads arenas of their own
    assert _arenas("cap") == 1
