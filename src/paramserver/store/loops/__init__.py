"""The storage engine's compiled (numba) loops: the only code of ``store/`` that is not
typed (mypy's exception list), below the classes that call them (``store/*.py``).
A loop imports only other loops, ``tables.optim``'s row rules, ``routing.hashing`` and
``_runtime.intrinsics``; names shared between loops are public (``COUNT``, ``find``...).
"""
