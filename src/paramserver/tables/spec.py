"""``TableSpec``: what a table is (name, width, optimiser, initialiser, seed, layout).

Tables are named namespaces: several jobs can share one server group, each under its
own table names.  A spec is validated when it is built and travels as a plain dict.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from paramserver.config import parse_bytes
from paramserver.errors import ConfigError
from paramserver.filters.chain import FilterSpec
from paramserver.lifecycle.spec import Lifecycle
from paramserver.tables.optim import FTRL, Initializer, Optimizer, Zeros

_NAME = re.compile(r"^[A-Za-z0-9_.\-/]{1,128}$")


#: The fields a spec on the wire may have, and the types each may take there (a bool is
#: never taken for an int).  Their values are then checked by ``TableSpec.__init__``.
_WIRE_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,), "dim": (int,), "seed": (int,), "optimizer": (str, dict), "initializer": (str, dict),
    "consistency": (str, int, float, type(None)), "aggregate": (bool,), "replicas": (int,), "key_bits": (int,),
    "block_size": (int,), "filters": (str, dict), "lifecycle": (str, dict), "storage": (str,),
    "memory": (int,), "hot_keys": (str,), "key_bytes": (int,)}

#: How a server may store a table's rows (``store/compact.py``).
STORAGES = ("float32", "fp16", "bf16")
#: What a memory budget's hot tier keeps of each key (``store/fingerprints.py``).
HOT_KEYS = ("full", "fingerprint")


#: What a spec's ``optimizer`` may be given as: a spec object (``FTRL(l1=2)``), a name with
#: optional hyper-parameters (``"adagrad"``, the CLI's ``"ftrl:alpha=0.1"``, a user's rule
#: ``"module:function"``) or a wire dict (``{"name": "ftrl", "alpha": 0.1}``).
OptimizerLike: TypeAlias = Optimizer | str | dict[str, Any]
#: What a spec's ``initializer`` may be given as, the same three ways.
InitializerLike: TypeAlias = Initializer | str | dict[str, Any]
#: What a spec's ``consistency`` may be given as: ``"asp"``, ``"bsp"``, ``"ssp:S"``, the
#: staleness S as a number, or ``None`` (asp).
ConsistencyLike: TypeAlias = str | float | None


@dataclass(frozen=True, init=False)
class TableSpec:
    """A table of uint64 keys → float32 rows of width ``dim``.

    Args:
        name: 1–128 characters from ``[A-Za-z0-9_.-/]``.
        dim: values per key (1 for a linear model, k for an embedding).
        optimizer: ``"sgd" | "adagrad" | "ftrl" | "adam"``, a dict with hyper-parameters
            (``{"name": "ftrl", "alpha": 0.1}``) or a spec object such as ``FTRL(l1=2)``.
        initializer: ``"zeros" | "normal" | "uniform"``, a dict, or a spec object.
        seed: a key's initial row depends only on ``(seed, key)``.
        consistency: ``"asp"`` (default: reads never wait), ``"bsp"``, ``"ssp:S"`` or the
            staleness S as a number (see docs/consistency.md); stored as ``staleness``.
        aggregate: BSP only: sum each clock's pushes and apply them once, when every
            live worker has finished that clock (serial large-batch semantics).
        replicas: copies of every vnode (1 = no backup; 2 or 3): a push is acknowledged
            once every live copy applied it, and a dead primary's backup takes over.
        key_bits: 0 (default): any uint64 key, stored in hash tables.  ``b`` in
            [1, 32]: keys must be < 2**b (hashed features folded to b bits, or ids),
            and the table is *dense*: every vnode is a plain array over its share of
            the 2**b keys, so a read or an update is one memory access, not a probe.
            Memory is ``2**b * (row bytes + 4)`` per copy, mapped when the table is
            created; it pays when a good part of the key space is used.
        block_size: 0 (default): a dense table's keys are scattered over the vnodes.
            ``B`` (a power of two, at most ``2**key_bits``; needs ``key_bits``): the
            table is *range-partitioned* into parameter blocks of ``B`` contiguous keys
            (block ``j`` is keys ``[j B, (j + 1) B)``), each wholly on one server, so a
            scheduled worker pulls or pushes a block in one request; the client knows
            where every block is without asking (``Client.blocks``).
        filters: what a push, a pull request and a pull reply go through on the wire
            (``paramserver.filters``): text like ``"push=int8,keycache,zstd;pull=keycache"``,
            a preset (``"lossless"``, ``"compact"``), a map by direction, or None (none).
        lifecycle: what happens to keys over time (``paramserver.lifecycle``): admission
            (``"admit=after:2"``), eviction (``"ttl=1e6"``, ``"cap_keys=1000000"``,
            ``"half_life=1e6;min_score=0.5"``) and change tracking for delta exports
            (``"track"``), as text or a map; None (default): keys stay for ever.  Needs a
            hash table (``key_bits=0``).
        storage: how servers store the rows: ``"float32"`` (default), or 16 bits a
            column to cut the memory a key takes (dim-1 FTRL: 14 bytes a slot instead of
            20): ``"fp16"`` (values as IEEE half, rounded to nearest even: 11
            significant bits, finite up to 65504) or ``"bf16"`` (values as bfloat16: 8
            significant bits, float32's range).  The optimiser state is then bfloat16
            with deterministic stochastic rounding (accumulators cannot overflow, and
            small increments are kept on average).  Updates are computed in float32 or
            float64 as for float32 rows; pulls, exports and checkpoints see float32.
        key_bytes: 8 (default): any uint64 key.  4: every key is below 2**32 (hashed
            features of up to 32 bits): a hash table keeps each key in 4 bytes, so a
            dim-1 FTRL slot is 16 bytes instead of 20, four to a cache line (float32 rows
            in memory only: not with ``key_bits``, 16-bit ``storage`` or ``memory``).  A
            key past 2**32 is refused, by the client and by the server.
        memory: 0 (default): a server keeps all the table's rows it holds in memory.
            ``B`` bytes (an int, or text like ``"512M"``): each server keeps at most
            that much of them in memory (hash tables); the least recently used rows go
            to a cold tier on the server's local disk (``--cold-dir``) and come back when
            a request asks for them.  Nothing else changes: pulls, pushes, replication,
            checkpoints and exports see every row, and a model trained with a budget is
            the one trained without.  A server's ``--table-memory`` gives every table
            without one of its own this budget.
        hot_keys: with a memory budget, what the hot tier keeps of each key in memory:
            ``"full"`` (default) the key, or ``"fingerprint"``, 16 bits of its hash, the
            full key kept in the cold tier's files (9 bytes a slot for dim-1 FTRL in
            ``bf16``, against 18).  Keys whose fingerprints meet on a probe share a row
            (about 1 in 10^4), so the model is no longer bit for bit the one trained
            without a budget (docs/tiers.md).  Takes effect where the table has a budget
            (its own or a server's ``--table-memory``); needs no lifecycle.

    Example:
        >>> TableSpec("w", dim=1, optimizer={"name": "ftrl", "alpha": 0.1}).optimizer
        FTRL(alpha=0.1, beta=1.0, l1=1.0, l2=0.0)
    """

    name: str
    dim: int
    optimizer: Optimizer
    initializer: Initializer
    seed: int
    consistency: float  # the staleness bound S: 0.0 (bsp), S (ssp:S) or inf (asp)
    aggregate: bool
    replicas: int
    key_bits: int
    block_size: int
    filters: FilterSpec
    lifecycle: Lifecycle
    storage: str
    memory: int  # bytes of a server's memory the rows may take (0: no budget)
    hot_keys: str  # what the hot tier keeps of a key: "full" or "fingerprint"
    key_bytes: int  # what a key takes in a server's hash slot: 8, or 4 (every key < 2**32)

    def __init__(self, name: str, dim: int = 1, *, optimizer: OptimizerLike = "sgd",
                 initializer: InitializerLike = "zeros", seed: int = 0, consistency: ConsistencyLike = "asp",
                 aggregate: bool = False, replicas: int = 1, key_bits: int = 0, block_size: int = 0,
                 filters: Any = None, lifecycle: Any = None, storage: str = "float32", memory: int | str = 0,
                 hot_keys: str = "full", key_bytes: int = 8) -> None:
        """The one constructor path (``from_wire`` and ``dataclasses.replace`` go through it
        too; the fields after ``dim`` are passed by name): checks every field, and stores
        ``optimizer``, ``initializer`` and ``consistency`` in their normal form (spec
        objects, the staleness as a float)."""
        from paramserver.consistency.clock import parse_consistency

        for key, value in (("name", name), ("dim", dim), ("seed", seed), ("aggregate", aggregate),
                           ("replicas", replicas), ("key_bits", key_bits), ("block_size", block_size),
                           ("storage", storage), ("hot_keys", hot_keys), ("key_bytes", key_bytes)):
            object.__setattr__(self, key, value)
        object.__setattr__(self, "consistency", parse_consistency(consistency))
        object.__setattr__(self, "memory", parse_bytes(f"table {name!r}: memory", memory))
        self._check_fields()
        opt: Optimizer = Optimizer.parse(optimizer)
        init: Initializer = Initializer.parse(initializer)
        if isinstance(opt, FTRL) and not isinstance(init, Zeros):
            raise ConfigError(f"table {self.name!r}: FTRL derives weights from its state (z, n), so "
                              f"its initializer must be 'zeros', got {init.name!r}")
        object.__setattr__(self, "optimizer", opt)
        object.__setattr__(self, "initializer", init)
        try:
            object.__setattr__(self, "filters", FilterSpec.parse(filters))
            object.__setattr__(self, "lifecycle", Lifecycle.parse(lifecycle))
        except ConfigError as exc:
            raise ConfigError(f"table {self.name!r}: {exc}") from None
        if self.lifecycle and self.key_bits:
            raise ConfigError(f"table {self.name!r}: a lifecycle ({self.lifecycle}) needs a hash table, whose memory "
                              f"follows its keys; this one is dense (key_bits={self.key_bits}): use key_bits=0")
        if self.lifecycle.stats and any(e[0] in ("int8", "fp16", "bf16", "sigmod") for e in self.filters.push):
            raise ConfigError(f"table {self.name!r}: admission {self.lifecycle.admit!r} counts the shows and clicks "
                              f"pushes carry beside the values, which the push filters {str(self.filters)!r} would "
                              "round: keep the value codecs off the pushes (keycache, delta and zstd are fine)")
        if self.memory:
            self._check_memory()
        if self.hot_keys != "full":
            self._check_fingerprints()
        if self.key_bytes == 4:
            self._check_narrow_keys()
        if self.lifecycle and self.aggregate:
            raise ConfigError(f"table {self.name!r}: a lifecycle ({self.lifecycle}) needs pushes applied as they "
                              "arrive; aggregate=True holds them to the end of each clock: drop one of them")

    def _check_memory(self) -> None:
        """A memory budget needs a hash table and a lifecycle that keeps its keys."""
        if self.key_bits:
            raise ConfigError(f"table {self.name!r}: a memory budget ({self.memory:,} bytes) needs a hash table, "
                              f"whose rows can move to disk; this one is dense (key_bits={self.key_bits}): use "
                              "key_bits=0, or no budget")
        if self.lifecycle.evicts:
            raise ConfigError(f"table {self.name!r}: a memory budget moves the rows over it to disk, and the "
                              f"lifecycle {str(self.lifecycle)!r} drops keys: keep one of them (a budget keeps "
                              "what was learnt; admission and change tracking go with it)")

    def _check_fingerprints(self) -> None:
        """Fingerprints are a memory budget's hot tier, and leave no room for life columns."""
        if self.lifecycle:
            raise ConfigError(f"table {self.name!r}: hot_keys='fingerprint' keeps one byte a key beside its row, "
                              f"for when it was last seen; the lifecycle {str(self.lifecycle)!r} needs columns of "
                              "its own: drop one of them")
        if self.key_bits:
            raise ConfigError(f"table {self.name!r}: hot_keys='fingerprint' is a hash table's hot tier; this one "
                              f"is dense (key_bits={self.key_bits}), its keys are positions: use hot_keys='full'")

    def narrow_refusal(self) -> str:
        """Why this table may not keep 4-byte keys (``key_bytes``), or "" where it may: they are
        a float32 hash table's whose rows stay in memory."""
        return ("it is dense (key_bits), its keys are positions" if self.key_bits else
                f"its rows are {self.storage}" if self.storage != "float32" else
                "it has a memory budget, whose tiers keep 8-byte keys" if self.memory else "")

    def _check_narrow_keys(self) -> None:
        if why := self.narrow_refusal():
            raise ConfigError(f"table {self.name!r}: key_bytes=4 stores a hash table's keys in 4 bytes (a float32 "
                              f"row's slot 4 bytes smaller); {why}: use key_bytes=8")

    def _check_fields(self) -> None:
        """``ConfigError`` naming the first field (after ``consistency``) out of its range."""
        from paramserver.routing.hashing import MAX_KEY_BITS
        from paramserver.routing.ring import MAX_REPLICAS

        if self.aggregate and self.consistency != 0:
            raise ConfigError(f"table {self.name!r}: aggregate=True needs consistency 'bsp', "
                              f"got staleness {self.consistency}")
        if (not isinstance(self.name, str) or not _NAME.match(self.name)
                or any(part in ("", ".", "..") for part in self.name.split("/"))):
            # names become checkpoint paths, one to one: no empty, '.' or '..' part ('a' and 'a/.' were one file)
            raise ConfigError(f"table name must be parts of [A-Za-z0-9_.-] joined by single '/' (1-128 characters), "
                              f"with no empty, '.' or '..' part, got {self.name!r}; e.g. 'model/lr'")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or not 1 <= self.dim <= 1 << 16:
            raise ConfigError(f"table {self.name!r}: dim must be an int in [1, 65536], got {self.dim!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 64:
            raise ConfigError(f"table {self.name!r}: seed must be an int in [0, 2**64), got {self.seed!r}")
        if (isinstance(self.replicas, bool) or not isinstance(self.replicas, int)
                or not 1 <= self.replicas <= MAX_REPLICAS):
            raise ConfigError(f"table {self.name!r}: replicas must be an int in [1, {MAX_REPLICAS}] "
                              f"(1 = no backup), got {self.replicas!r}")
        if (isinstance(self.key_bits, bool) or not isinstance(self.key_bits, int)
                or not 0 <= self.key_bits <= MAX_KEY_BITS):
            raise ConfigError(f"table {self.name!r}: key_bits must be an int in [0, {MAX_KEY_BITS}] (0: any "
                              f"uint64 key, hash layout; b: keys < 2**b, dense layout), got {self.key_bits!r}")
        if self.block_size != 0:
            b = self.block_size
            if isinstance(b, bool) or not isinstance(b, int) or b < 1 or b & (b - 1):
                raise ConfigError(f"table {self.name!r}: block_size must be a power of two (keys per parameter "
                                  f"block), or 0 for no blocks; got {b!r}")
            if not self.key_bits or b > 1 << self.key_bits:
                raise ConfigError(f"table {self.name!r}: block_size={b} needs a dense table with at least that "
                                  f"many keys: key_bits >= {b.bit_length() - 1}, got key_bits={self.key_bits}")
        if self.hot_keys not in HOT_KEYS:
            raise ConfigError(f"table {self.name!r}: hot_keys must be one of {list(HOT_KEYS)} (what a memory "
                              f"budget's hot tier keeps of a key), got {self.hot_keys!r}; e.g. hot_keys='fingerprint'")
        if isinstance(self.key_bytes, bool) or self.key_bytes not in (4, 8):
            raise ConfigError(f"table {self.name!r}: key_bytes must be 8 (any uint64 key) or 4 (every key < 2**32: "
                              f"hashed features of up to 32 bits), got {self.key_bytes!r}")
        if self.storage not in STORAGES:
            raise ConfigError(f"table {self.name!r}: storage must be one of {list(STORAGES)} (how servers store "
                              f"rows: float32, or 16 bits a column), got {self.storage!r}; e.g. storage='bf16'")

    @property
    def staleness(self) -> float:
        return float(self.consistency)

    @property
    def width(self) -> int:
        """Floats a key's row takes in a server: the value, then the optimiser state."""
        return self.dim + self.optimizer.state_width(self.dim)

    @property
    def push_width(self) -> int:
        """Floats a pushed key carries: its values, and its shows and clicks where the
        table's admission counts them (``Lifecycle.stats``)."""
        from paramserver.lifecycle.spec import STATS

        return self.dim + (STATS if self.lifecycle.stats else 0)

    @property
    def layout(self) -> int:
        """How keys map to vnodes, as one int for the routing kernels
        (``hashing.layout_code``): 0 is the hash layout."""
        from paramserver.routing.hashing import layout_code

        return layout_code(self.key_bits, self.block_size)

    @property
    def n_blocks(self) -> int:
        """Parameter blocks of a range-partitioned table (0 if it has none)."""
        return (1 << self.key_bits) // self.block_size if self.block_size else 0

    def check_keys(self, keys: np.ndarray) -> None:
        """Raise ``ConfigError`` if a key is outside a dense table's key space, or past 2**32 in
        a table of 4-byte keys."""
        if self.key_bytes == 4 and keys.size and keys.dtype.itemsize > 4 and int(keys.max()) >> 32:
            bad = np.flatnonzero(keys >> np.uint64(32))
            raise ConfigError(f"table {self.name!r} stores 4-byte keys (key_bytes=4): keys must be < 2**32, got "
                              f"{int(keys[bad[0]])} at index {int(bad[0])} ({bad.size} such keys); fold them "
                              "(--hash-bits 32 or fewer) or create the table with key_bytes=8")
        if self.key_bits and keys.size and int(keys.max()) >> self.key_bits:  # one pass, no temporary
            bad = np.flatnonzero(keys >> np.uint64(self.key_bits))
            if bad.size:
                raise ConfigError(f"table {self.name!r} is dense with key_bits={self.key_bits}: keys must be "
                                  f"< 2**{self.key_bits}, got {int(keys[bad[0]])} at index {int(bad[0])} "
                                  f"({bad.size} such keys); fold them (keys & (2**{self.key_bits} - 1), "
                                  "--hash-bits) or create the table with key_bits=0")

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "seed": self.seed,
                "optimizer": self.optimizer.to_wire(), "initializer": self.initializer.to_wire(),
                "consistency": None if math.isinf(self.consistency) else int(self.consistency),
                "aggregate": self.aggregate, "replicas": self.replicas,
                "key_bits": self.key_bits, "block_size": self.block_size,
                **({"filters": self.filters.to_wire()} if self.filters else {}),
                **({"lifecycle": self.lifecycle.to_wire()} if self.lifecycle else {}),
                **({"storage": self.storage} if self.storage != "float32" else {}),
                **({"memory": self.memory} if self.memory else {}),
                **({"hot_keys": self.hot_keys} if self.hot_keys != "full" else {}),
                **({"key_bytes": self.key_bytes} if self.key_bytes != 8 else {})}

    @classmethod
    def from_wire(cls, d: Any) -> TableSpec:
        """The spec a peer sent (``to_wire``'s map); ``ConfigError`` naming the field, the
        rule and the fix for a missing, unknown or wrong-typed one (never a ``TypeError``:
        a scheduler answers a malformed ``create_table`` with the reason, not a traceback)."""
        if not isinstance(d, dict):
            raise ConfigError(f"a table spec must be a map like {{'name': 't', 'dim': 1}}, got {str(d)[:100]!r}")
        extra = [k for k in d if k not in _WIRE_FIELDS]
        if extra:
            raise ConfigError(f"unknown table spec fields {sorted(str(k)[:50] for k in extra)} "
                              f"(known: {sorted(_WIRE_FIELDS)}); drop them")
        if "name" not in d:
            raise ConfigError(f"a table spec needs a name (like {{'name': 'model/w', 'dim': 8}}), got the fields "
                              f"{sorted(d)}")
        for key, types in _WIRE_FIELDS.items():
            if key in d and not (isinstance(d[key], types) and not (isinstance(d[key], bool) and bool not in types)):
                wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
                raise ConfigError(f"table spec field {key!r} must be {wanted}, got {str(d[key])[:100]!r} "
                                  f"({type(d[key]).__name__}); see TableSpec for each field's meaning")
        return cls(**d)


def spec_given(name: str | TableSpec, dim: int, fields: dict[str, Any]) -> TableSpec:
    """The spec ``Client.create_table`` was given: a whole ``TableSpec`` alone, or a name, a
    width and the keyword ``fields`` to build one from.  A spec with other arguments beside
    it is refused, naming them (one of the two would be dropped without a word)."""
    if not isinstance(name, TableSpec):
        return TableSpec(name, dim, **fields)
    defaults = TableSpec.__init__.__kwdefaults__ or {}
    given = {"dim": dim} if dim != 1 else {}
    given.update({k: v for k, v in fields.items() if v is not defaults.get(k) and v != defaults.get(k)})
    if given:
        said = ", ".join(f"{k}={v!r}" for k, v in sorted(given.items()))
        raise ConfigError(f"create_table was given the spec of {name.name!r} and also {said}: pass the spec alone, "
                          f"changed where it must be (dataclasses.replace(spec, ...)), or a name and the fields")
    return name
