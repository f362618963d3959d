"""The client a worker (or a driver script) uses: pull, push, clock, barrier, tables.

Example:
    >>> with Client("tcp://127.0.0.1:7000") as c:                     # doctest: +SKIP
    ...     c.create_table("w", dim=1, optimizer="ftrl")
    ...     keys = np.array([3, 7, 3], np.uint64)
    ...     c.push("w", keys, np.ones((3, 1), np.float32)).result()   # key 3 gets 2.0
    ...     c.pull("w", keys).result(timeout=10)                      # shape (3, 1)
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from paramserver.client.admin import Admin
from paramserver.client.cached_calls import CachedCalls, CallerPort
from paramserver.client.caller import Caller
from paramserver.client.calls import FunctionCalls
from paramserver.client.core import Piece, as_keys, rows_into
from paramserver.client.filter_calls import Flushes
from paramserver.client.filtering import packed_push
from paramserver.client.io_thread import IOThread
from paramserver.client.job import Job
from paramserver.client.life_calls import Delta, LifeCalls, with_stats
from paramserver.client.losses import Losses
from paramserver.client.moved import MOVED, moved
from paramserver.client.prefetch import Prefetched, prefetch
from paramserver.client.rpc import Rpc
from paramserver.client.state import ClientState
from paramserver.client.stats import Stats
from paramserver.client.step_calls import StepCalls
from paramserver.client.sync_calls import Clocks
from paramserver.config import Config, load_config
from paramserver.errors import ConfigError, ConnectError, ParamServerError
from paramserver.filters.packed import PackedRows
from paramserver.routing.blocks import BlockMap
from paramserver.routing.partition import combine_duplicates
from paramserver.routing.ring import Ring
from paramserver.tables.push_ops import PUSH_OPS
from paramserver.tables.spec import TableSpec, spec_given
from paramserver.wire.message import Message, Op
from paramserver.wire.sockets import refused_for

logger = logging.getLogger(__name__)


class Client:
    """A node's handle on the cluster.

    Args:
        scheduler: scheduler address (default: ``PARAMSERVER_SCHEDULER``).
        role: ``"worker"`` (counted in barriers, gets a rank) or ``"driver"``.
        connect_timeout_s: how long to try to reach the scheduler.
        config: a full ``Config`` instead of the others.
        metrics_url: where this node serves its metrics (listed by ``cluster status``).
        secret_file: the cluster's keys (default: ``PARAMSERVER_SECRET_FILE``): every link
            is CurveZMQ (``wire/security.py``).
        allow_loss: when a server dies holding data no backup held, log it and go on
            (``Client.losses``) instead of raising ``DataLossError`` on the next call
            (default: ``PARAMSERVER_ALLOW_LOSS``, else False; ``client/losses.py``).

    Raises:
        ConnectError: the scheduler did not answer within ``connect_timeout_s``, or (with
            a ``secret_file``) refused its keys: said in about a second, naming the file.
    """

    def __init__(self, scheduler: str | None = None, *, role: str = "driver",
                 connect_timeout_s: float | None = None, config: Config | None = None, metrics_url: str = "",
                 secret_file: str | None = None, allow_loss: bool | None = None):
        self.config = config or load_config(scheduler=scheduler, connect_timeout_s=connect_timeout_s,
                                            secret_file=secret_file)
        self._losses = Losses(self.config.allow_loss if allow_loss is None else bool(allow_loss))
        if not self.config.scheduler:
            raise ConnectError("no scheduler address: give --scheduler tcp://HOST:PORT (the address the scheduler "
                               "printed), set PARAMSERVER_SCHEDULER, or in Python pass Client('tcp://HOST:PORT')")
        self.role = role
        if role == "driver":  # a person waiting: nothing listening is said in seconds, not after the timeout
            refused_for(self.config.scheduler, min(3.0, self.config.connect_timeout_s))
        self._io = IOThread(self.config)
        self._io.notifications.append(self._on_notification)
        self._io.start()
        self._state = ClientState(self.config, self._io)  # what every call shares: view, push numbers, counts
        self._lock = self._state.lock
        self._rpc = Rpc(self.config, self._io, self._state, role)
        self.stats = Stats(self._rpc, self._io, self._state, self._losses)  # what was measured
        self._caller = Caller(self.config, role, self._io, self._state, self._rpc, self._losses)
        self.admin = Admin(self._rpc, self._state, self.stats, self._caller.spec)  # the cluster's administration
        self._flushes = Flushes(self._caller)
        self._clocks = Clocks(self._caller, self._flushes.due)
        self._functions = FunctionCalls(self._caller)
        self.steps = StepCalls(self._caller)  # batches trained where their rows are: client.steps.take
        self._life = LifeCalls(self._caller)
        # the tables whose rows this client caches
        self._cached = CachedCalls(CallerPort(self._caller), self._state.row_caches)
        try:
            view = self._call(self.config.scheduler, {"op": Op.REGISTER.value, "role": role, "metrics": metrics_url},
                              timeout_s=self.config.connect_timeout_s, connecting=True)
        except BaseException:
            self._io.close()
            raise
        self.node_id: int = view["node_id"]
        self._caller.node_id, self._caller.token = self.node_id, str(view.get("node_token") or "")
        # a dead scheduler from a stalled one
        self._state.scheduler_process = self._io.watch.process = str(view.get("scheduler_process") or "")
        self.rank: int = view.get("rank", -1)
        self.num_workers: int = view.get("num_workers", 0)
        # set by LocalCluster's worker loop while it runs a function this worker joined midway
        # (started after the others): a program dealt in parts at its start has none for it
        self.joined_midway = False
        self._apply_view(view)
        self.job = Job(self._caller, self._clocks)  # the job's shard queue: start, next_shard, shard_done, status
        self._io.start_heartbeats()
        if role == "worker":  # a worker that joins starts at the current minimum clock
            self._clocks.resync()

    # ---- plumbing ----------------------------------------------------------------------
    def _apply_view(self, view: dict[str, Any]) -> None:
        self._state.apply_view(view)

    @property
    def _ring(self) -> Ring:
        return self._state.ring()

    @property
    def _servers(self) -> dict[int, str]:
        return self._state.view.servers

    @property
    def _tables(self) -> dict[str, TableSpec]:
        return self._state.tables

    def _on_notification(self, msg: Message) -> None:
        if msg.op is Op.RING:
            self._apply_view(msg.header)
        elif msg.op is Op.NODE_LOST and msg.header.get("role") == "server":
            self._losses.record(msg.header)
            self._state.refresh_view()  # the ring will move: ask for it now, as the simulated worker does

    def _call(self, address: str, header: dict[str, Any], timeout_s: float | None = None,
              connecting: bool = False) -> dict[str, Any]:
        return self._rpc.call(address, header, timeout_s, connecting)

    def _spec(self, table: str) -> TableSpec:
        return self._caller.spec(table)

    def _pieces(self, kind: Op, keys: np.ndarray, extra: np.ndarray | None, layout: int,
                distinct: bool = False, ordered: bool = False) -> list[Piece]:
        """Route ``keys`` with the current ring into one piece per server (``core.route``)."""
        return self._state.routed(kind, keys, extra, layout, distinct, ordered)

    # ---- public API --------------------------------------------------------------------
    def create_table(self, name: str | TableSpec, dim: int = 1, *, optimizer: Any = "sgd",
                     initializer: Any = "zeros", seed: int = 0, consistency: Any = "asp",
                     aggregate: bool = False, replicas: int = 1, key_bits: int = 0,
                     block_size: int = 0, filters: Any = None, lifecycle: Any = None,
                     storage: str = "float32", memory: int | str = 0, hot_keys: str = "full",
                     row_cache: Any = None) -> TableSpec:
        """Create a table on every server (idempotent for an identical spec).

        ``consistency`` is ``"asp"``, ``"bsp"`` or ``"ssp:S"``; ``aggregate`` (BSP only)
        applies each clock's summed pushes once; ``replicas`` (1–3) copies of every vnode
        on distinct servers survive ``replicas - 1`` failures; ``key_bits = b`` makes a
        dense table of keys < 2**b (one memory access a key), and ``block_size = B``
        range-partitions it into parameter blocks of B contiguous keys (``blocks``,
        ``pull_block``, ``push_block``); ``filters`` says what its pushes, pulls and pull
        replies go through on the wire (``"lossless"``, ``"compact"``,
        ``"push=int8,keycache,zstd;pull=keycache"``: ``paramserver.filters``); ``lifecycle``
        what happens to its keys over time (``"admit=after:2;ttl=1e6"``: ``paramserver.lifecycle``);
        ``storage`` ``"fp16"`` or ``"bf16"`` stores its rows in 16 bits a column;
        ``memory`` (``"512M"``) is the memory its rows may take on each server, the least
        recently used kept on the server's disk past it (a hash table; the model is the same);
        ``hot_keys`` ``"fingerprint"`` keeps 16 bits of each key in that memory, not the key
        (about half the bytes a key; docs/tiers.md);
        ``row_cache`` caches its rows on this client (``cache_rows``).  See ``TableSpec``:
        a whole spec may be given instead of ``name``, alone (``create_table(spec)``).

        Raises:
            ConfigError: a bad spec, or the name is taken by a different spec.
        """
        spec = self.admin.create_table_spec(spec_given(name, dim, {
            "optimizer": optimizer, "initializer": initializer, "seed": seed, "consistency": consistency,
            "aggregate": aggregate, "replicas": replicas, "key_bits": key_bits, "block_size": block_size,
            "filters": filters, "lifecycle": lifecycle, "storage": storage, "memory": memory,
            "hot_keys": hot_keys}))
        if row_cache is not None:
            self.cache_rows(spec.name, row_cache)
        return spec

    def cache_rows(self, table: str, row_cache: Any = "hot") -> None:
        """Cache ``table``'s rows on this client, read while at most ``s`` of a server's
        updates behind, trained here by the table's rule (``apply=local``, where its state
        adds) or its gradients summed (``apply=server``), and what it gathered pushed every
        ``s`` uses (``"s=8,rows=262144"``, ``"s=100,apply=server"``, the preset ``"hot"``, or
        ``"off"``: ``client/row_cache.py``).  Every worker of a job says it for itself; ``s=0``
        (``off``) is no cache, what it held pushed first."""
        self._cached.use(self._spec(table), row_cache)

    def drop_table(self, name: str) -> None:
        self._call(self.config.scheduler, {"op": Op.DROP_TABLE.value, "name": name})
        with self._lock:
            self._tables.pop(name, None)

    def tables(self) -> dict[str, TableSpec]:
        tables = self._call(self.config.scheduler, {"op": Op.TABLE_INFO.value})["tables"]
        return {n: TableSpec.from_wire(w) for n, w in tables.items()}

    def pull(self, table: str, keys: Any, *, out: np.ndarray | None = None) -> Future[Any]:
        """Values of ``keys`` (duplicates allowed) as a future of ``float32[len(keys), dim]``.

        Keys never pushed read as their initial value.  ``out``: an array of that shape to
        write them into (C order; float32, or int32 for a table of counts, each value
        converted as ``astype(np.int32)`` converts: a sparse answer is decoded straight into
        it, with no float copy to cast), which the future then gives; a pull that fails may
        have written some of its rows.
        """
        spec = self._spec(table)
        keys = as_keys(keys)
        spec.check_keys(keys)
        if out is not None:
            _check_out(table, out, keys.shape[0], spec.dim)
        cache = self._state.row_caches.get(table)
        if cache is not None:
            if out is not None and out.dtype != np.float32:
                raise ConfigError(f"pull from {table!r}: its rows are cached on this client as float32; "
                                  f"pull them into a float32 out, or without out=, got {out.dtype}")
            self._losses.check()
            return self._cached.pull(spec, keys, cache, out)
        if out is None:
            out = np.empty((keys.shape[0], spec.dim), np.float32)
        filters = self._state.filters
        replies = filters.reply_chain(spec)
        return self._caller.scatter(Op.PULL, table, keys, None, rows_into(out, spec.dim, replies), result=out,
                             reply_row_bytes=4 * spec.dim,
                             wire=filters.wire(spec, "pull"),
                             extra_header={"reply_filters": True} if replies is not None else None)

    def prefetch(self, table: str, keys: Any) -> Future[Prefetched]:
        """Name ``keys`` that a later pull or push of ``table`` will ask for.  Where the
        table has a memory budget (``memory=``) and its rows on disk are slow to read, its
        servers begin reading those of ``keys`` in the background, so that the pull finds
        them in place; no value, clock or order changes.  The future (``Prefetched``):
        whether any server holds the table in tiers, and reads ahead now.  Pass the very
        array the pull will take: it is routed once, for both."""
        spec = self._spec(table)
        keys = as_keys(keys)
        spec.check_keys(keys)
        return prefetch(self._caller, table, keys)

    def push(self, table: str, keys: Any, grads: Any, *, distinct: bool = False, op: str = "update",
             stats: Any = None) -> Future[Any]:
        """Send gradients (or values); the future completes once every live replica
        applied them (each exactly once, retries included).

        ``op`` says what a row becomes: ``"update"`` (the table's rule, on gradients),
        ``"add"`` (plain increments, for counts), ``"assign"``, ``"max"`` or ``"min"``
        (on the values; the rule's state is left alone).  Duplicate keys are merged first
        as the op would apply them in turn: summed for ``update`` and ``add``, the largest
        or smallest kept for ``max``/``min``, the last for ``assign``.

        ``distinct=True`` says ``keys`` has no duplicates (they came from ``np.unique``
        or ``Batch.unique``), so the client does not look for them: routing a push costs
        a third.  Should one slip through, the server applies it as a second update.
        ``stats``: each key's shows and clicks (``[n, 2]``), for a table whose admission
        counts them (``lifecycle="admit=score:10"``; default one show, no click).
        ``grads`` may be ``PackedRows`` (``filters/packed.py``), for op ``add``: sent as
        they are packed where ``admin.takes_packed(table)``, else made dense first.
        """
        if op not in PUSH_OPS:
            raise ConfigError(f"push to {table!r}: op must be one of {sorted(PUSH_OPS)}, got {op!r}")
        spec = self._spec(table)
        if op != "update" and spec.aggregate:
            raise ConfigError(f"push to {table!r}: op {op!r} on a table with BSP aggregation (it sums a clock's "
                              "pushes and applies the rule once): use op='update', or a table without aggregate")
        keys = as_keys(keys)
        spec.check_keys(keys)
        if isinstance(grads, PackedRows):  # as their producer packed them (``filters/packed.py``)
            grads = packed_push(table, spec, keys, grads, op,
                                distinct and stats is None and self._state.filters.takes_packed(spec))
            if isinstance(grads, PackedRows):
                return self._caller.push(spec, keys, grads, op, True)
        grads = np.asarray(grads, np.float32)
        if grads.ndim == 1 and spec.dim == 1:
            grads = grads.reshape(-1, 1)
        if grads.shape != (keys.shape[0], spec.dim):
            raise ConfigError(f"push to {table!r}: grads must have shape ({keys.shape[0]}, {spec.dim}) "
                              f"for {keys.shape[0]} keys of dim {spec.dim}, got {grads.shape}")
        if not np.isfinite(grads).all():
            raise ConfigError(f"push to {table!r}: grads contain NaN or inf (check the learning "
                              "rate and the loss)")
        grads = with_stats(spec, grads, stats)
        cache = self._state.row_caches.get(table)
        if cache is not None and op == "update":
            return self._cached.push(spec, keys, grads, distinct, cache)
        if op in ("assign", "max", "min") and not distinct:
            keys, grads = combine_duplicates(keys, grads, op)
            distinct = True
        return self._caller.push(spec, keys, grads, op, distinct)

    def blocks(self, table: str) -> BlockMap:
        """Where the parameter blocks of range-partitioned ``table`` are, as of the ring
        this client holds: ``server_of(blocks)``, ``of_server(s)``, ``keys(block)``."""
        spec = self._spec(table)
        if not spec.block_size:
            raise ConfigError(f"table {table!r} has no parameter blocks: create it with key_bits=b and "
                              "block_size=B (a power of two) to range-partition it")
        return BlockMap(table, spec.block_size, spec.n_blocks, self._ring)

    def pull_block(self, table: str, block: int) -> Future[Any]:
        """The rows of parameter block ``block`` (keys ``[block B, (block + 1) B)``, in
        order) as a future of ``float32[B, dim]``: one request to the block's server."""
        return self.pull(table, self.blocks(table).keys(block))

    def push_block(self, table: str, block: int, values: Any, *, op: str = "update") -> Future[Any]:
        """Push ``float32[B, dim]`` onto block ``block``'s rows with ``op`` (see ``push``):
        one request, applied exactly once, acknowledged once every replica has it."""
        return self.push(table, self.blocks(table).keys(block), values, distinct=True, op=op)

    def export_table(self, table: str) -> tuple[np.ndarray, np.ndarray]:
        """Every stored key of ``table`` and its value row (optimiser state left out)."""
        self._losses.check()
        spec = self._spec(table)
        arrays = [m.arrays for m in self._on_every_server({"op": Op.EXPORT.value, "table": table})]
        keys = np.concatenate([a[0] for a in arrays]) if arrays else np.zeros(0, np.uint64)
        rows = np.concatenate([a[1] for a in arrays]) if arrays else np.zeros((0, spec.dim), np.float32)
        return keys, rows

    # ---- cold backup ------------------------------------------------------------------
    def _on_every_server(self, header: dict[str, Any], timeout_s: float | None = None) -> list[Message]:
        return self._rpc.on_every_server(header, timeout_s)

    def checkpoint(self, url: str, *, step: str | None = None, extra: dict[str, Any] | None = None,
                   incremental: bool = False) -> str:
        """Write every table (keys, values, optimiser state) under ``url``; return the step's URL.

        Call it at a clock boundary (workers between batches); the manifest is written
        last and atomically, so an interrupted checkpoint is never restored.  ``step``
        names the step (``checkpoint.step_url``) when the caller must know it first (the
        rounds of ``schedule.run_rounds`` write their own files into it); ``extra`` goes
        into the manifest as is.  A local path is made absolute here, so every server
        writes into the same folder (an empty one is refused).  ``incremental``: the
        tables with a lifecycle write only what changed since the newest step under
        ``url`` (rows set, keys evicted), a step that ``restore`` applies on its base; a
        whole step where that cannot be (none yet, the servers changed, too much changed).
        """
        from paramserver.checkpoint import store as ckpt

        url = ckpt.local_url(url)
        step = ckpt.local_url(step, "checkpoint step") if step is not None else ckpt.new_step_url(url)
        self._losses.check()  # a checkpoint of a model that lost data would hide the loss
        base = ckpt.incremental_since(url, self._ring.version, set(self._servers)) if incremental else None
        header = {"op": Op.CHECKPOINT.value, "url": step, **({"since": base[1]} if base else {})}
        replies = self._on_every_server(header)
        if base and not all(all(m.header.get("whole", {}).values()) for m in replies):
            ckpt.remove_step(step)  # a delta that cannot be whole: the step is written whole instead
            return self.checkpoint(url, extra=extra)
        tables = {n: TableSpec.from_wire(w).to_wire()
                  for n, w in self._call(self.config.scheduler, {"op": Op.TABLE_INFO.value})["tables"].items()}
        extra = {**(extra or {}), **({"base": base[0]} if base else {})}  # an incremental step names its base
        ckpt.write_manifest(step, ckpt.assemble_manifest([m.header for m in replies], self._ring.to_wire(), tables,
                                                         **extra))
        return step

    def restore(self, url: str, *, allow_unverified: bool = False) -> dict[str, int]:
        """Create the tables of a checkpoint and load them, onto any number of servers.

        ``url`` is a checkpoint folder (its newest complete step is used) or one step; a
        local path is made absolute here.  Returns the keys restored per table.
        ``allow_unverified`` restores a first-format checkpoint, whose files have no
        sha256 to check them against (refused otherwise: an edited file would go unseen).

        Raises:
            CheckpointError: no complete step, a missing or corrupt manifest or file, an
                unverifiable (first-format) checkpoint without ``allow_unverified``.
        """
        from paramserver.checkpoint.store import local_url, restore_tables

        return restore_tables(self, local_url(url), allow_unverified)

    def together(self) -> AbstractContextManager[None]:
        """A block whose pulls and pushes go out when it ends, those to one server as one
        message (``wire/batch.py``), answered as if sent one by one, in order: a worker's
        push and its next pull cost one message each way.  Nothing in the block may wait
        on a pull's or a push's answer (its request has not gone yet); other calls go at
        once (the client's own: a table's spec for its first push), unless a pull or push
        to the same node is held ahead of them."""
        return self._io.together()

    # ---- clocks, server functions, filters, lifecycle: the groups' calls, on the client ----
    def clock(self, clocks: int = 1) -> int:
        """Finish this worker's clock, or ``clocks`` of them at once (``Clocks.clock``): every
        server hears it, on the next pull or push to it or on its own; returns the clocks finished."""
        if isinstance(clocks, bool) or not isinstance(clocks, int) or clocks < 1:
            raise ConfigError(f"clock: clocks must be an int of 1 or more, got {clocks!r}")
        if self._state.row_caches:
            self._cached.on_clock()  # a BSP or SSP table's sums go with the clock they were made in
        return self._clocks.clock(clocks)

    @property
    def current_clock(self) -> int:
        """Clocks this worker has finished (its pulls are gated on it)."""
        return self._clocks.current

    def send_ticks(self, wait: bool = False, landed: bool = False) -> None:
        """Send the finished clock no request carried yet (``Clocks.send_ticks``)."""
        self._clocks.send_ticks(wait, landed)

    def barrier(self, timeout_s: float | None = None) -> list[int]:
        """Block until every live worker has called ``barrier`` (``Clocks.barrier``)."""
        return self._clocks.barrier(timeout_s)

    def arrive(self, generation: int) -> Future[Any]:
        """Arrive at the numbered barrier ``generation`` without waiting (``Clocks.arrive``)."""
        return self._clocks.arrive(generation)

    def call(self, table: str, function: str, keys: Any = None, args: dict[str, Any] | None = None) -> Future[Any]:
        """Run a server-side function on every server and merge the results
        (``FunctionCalls.call``, ``paramserver.tables.functions``)."""
        return self._functions.call(table, function, keys, args)

    def flush(self, table: str | None = None, timeout_s: float | None = None, rounding: bool = False) -> int:
        """Push what this client's row caches hold (``push_held``) and what its filters
        still owe (``Flushes.flush``); the keys pushed."""
        return self.push_held(table, timeout_s) + self._flushes.flush(table, timeout_s, rounding)

    def push_held(self, table: str | None = None, timeout_s: float | None = None) -> int:
        """Push the gradients this client's row caches summed and hold (``table``'s, or
        every cached table's), and wait until applied; the keys pushed.  ``paramserver
        train`` calls it before a shard is reported done."""
        return self._cached.flush(table, timeout_s)

    def set_time(self, time: float | None) -> None:
        """The time this client's pushes carry from now on (``LifeCalls.set_time``)."""
        self._life.set_time(time)

    def export_delta(self, table: str, since: str | None = None, timeout_s: float | None = None) -> Delta:
        """The keys of ``table`` changed since the token ``since`` (``LifeCalls.export_delta``)."""
        return self._life.export_delta(table, since, timeout_s)

    def close(self) -> None:
        """Leave the cluster and stop the I/O thread (idempotent)."""
        stopped = self.admin.stopped or self.config.scheduler in self._io._lost
        if self._io.is_alive() and not self._io._closed.is_set() and not stopped:
            self.send_ticks()  # a clock no request carried yet: the servers' vector clocks hear it
            try:
                self._call(self.config.scheduler, {"op": Op.LEAVE.value}, timeout_s=2)
            except (ParamServerError, TimeoutError):
                pass
        self._io.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        """The names that moved into ``admin`` and ``stats`` still answer, with a note of
        where they live now (``client/moved.py``)."""
        group = MOVED.get(name)
        if group is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(getattr(self, group), moved(name, group))

    def __setattr__(self, name: str, value: Any) -> None:
        if name in MOVED:  # ``client.allow_loss = True``: set where it lives now, not on the client
            setattr(getattr(self, MOVED[name]), moved(name, MOVED[name]), value)
            return
        super().__setattr__(name, value)


def _check_out(table: str, out: Any, n: int, dim: int) -> None:
    """A pull's ``out=``: a writeable C-order float32 or int32 array of ``n`` rows of ``dim``."""
    ok = isinstance(out, np.ndarray) and out.dtype in (np.float32, np.int32) and out.shape == (n, dim) \
        and out.flags.c_contiguous and out.flags.writeable
    if not ok:
        got = (f"{out.dtype}{out.shape}{'' if out.flags.c_contiguous else ', not C order'}"
               f"{'' if out.flags.writeable else ', read-only'}") if isinstance(out, np.ndarray) else type(out).__name__
        raise ConfigError(f"pull from {table!r}: out must be a writeable C-order float32 or int32 array of shape "
                          f"({n}, {dim}) for {n} keys of dim {dim}, got {got}")
