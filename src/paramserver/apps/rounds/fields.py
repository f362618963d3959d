"""What the round apps' whole-file readers (``ratings``, ``corpus``) share inside their numba
parsers: a line's end, and its first fields, separated by runs of the bytes a format
counts as separators (a 256-entry table from ``separators``).  Inlined: a reader's byte
loop pays no call.
"""

from __future__ import annotations

import numpy as np
from numba import njit

NL = 10


def separators(chars: bytes) -> np.ndarray:
    """A lookup table: entry ``c`` is True when byte ``c`` is in ``chars``."""
    table = np.zeros(256, np.bool_)
    table[np.frombuffer(chars, np.uint8)] = True
    return table


@njit(inline="always", nogil=True, cache=True)
def line_end(buf, pos):  # type: ignore[no-untyped-def]
    """The offset of the newline that ends the line starting at ``pos`` (``buf`` ends with one)."""
    end = pos
    while buf[end] != NL:
        end += 1
    return end


@njit(inline="always", nogil=True, cache=True)
def split_fields(buf, a, end, seps, bounds, most):  # type: ignore[no-untyped-def]
    """The first ``most`` fields of ``buf[a:end]`` at the most, separated by runs of bytes
    that are ``seps``: field f is ``buf[bounds[2f]:bounds[2f + 1]]``.  Returns how many
    there are (0 for a blank line)."""
    fields = 0
    while fields < most:
        while a < end and seps[buf[a]]:
            a += 1
        if a >= end:
            break
        b = a
        while b < end and not seps[buf[b]]:
            b += 1
        bounds[2 * fields] = a
        bounds[2 * fields + 1] = b
        fields += 1
        a = b
    return fields
