"""The storage engine: a table's rows on one server, and the compiled loops that read and
update them.  It sits on a floor of its own, below ``server/`` (which receives requests,
copies vnodes and holds leases) and above ``tables/`` (specs and update rules):

* ``vnodes.py``: ``VnodeSet``, the vnodes of one table on one server, worked many vnodes
  per compiled call; ``protocol.py``: ``VnodeStore``, what a server uses of it;
* ``table.py``: ``VnodeTable``, one hash vnode (open addressing, growth);
* ``dense.py``: ``DenseVnode``, one dense vnode (a row per key position);
* ``compact.py``: 16-bit rows' dtypes and whole-row conversions; ``memory.py``: dense
  vnodes' memory (the up-front check, pages mapped off the hot path);
* ``kernels.py``: which compiled loops a table's pushes run (a user rule's own);
* ``life.py``: ``TableLife``, a table's key lifecycle (admission, eviction, deltas);
* ``loops/``: every ``@njit`` loop (``hash``, ``dense``, ``many``, ``life``, ``compact``),
  below the classes, which import them and never the reverse.
"""
