"""PyTorch on the parameter server (the ``torch`` extra; CPU torch is enough).

- ``ShardedEmbeddingBag`` and ``ShardedEmbedding``: embedding tables that live on the
  servers, sharded, larger than any process.  A forward pass pulls only the rows the
  batch touches (deduplicated); the backward pass pushes their gradients, and the
  servers apply the table's rule (AdaGrad, Adam, any plug-in rule).  ``prefetch(ids)``
  pulls the next batch's rows while this batch computes; the rows this batch then
  changes are pulled again once its push is applied, so a prefetched step is exactly a
  synchronous one.
- ``DenseParameters``: a module's dense parameters trained Downpour style: each step
  pushes their gradients to a dense table, whose rule applies them; the parameters are
  pulled back every ``every`` steps (1: synchronous for one worker).
- ``sync=True`` (either kind): synchronous data parallelism over several workers.  The
  table is BSP with server-side aggregation: each step's pushes from every worker are
  summed and applied once, and a step's pulls wait until every worker has ended the one
  before (``Client.clock``), so W workers of batch b train as one of batch W·b (scale
  each worker's loss by 1/W for a mean).
- ``fit``: the loop over a ``torch.utils.data`` loader, with checkpoints of the tables
  through the servers' cold backup (``Client.checkpoint``/``restore``).
- ``pipeline(stages, loss_fn, microbatches)``: a model cut into stages, a process each,
  micro-batches scheduled 1F1B (``torch_pipeline.py``).

A table's keys are the embedding ids (``0 <= id < num_embeddings``).  Up to 2**22 rows
the table is dense (one memory access a key, its memory mapped up front across the
servers); above, it is hashed, and a row exists on a server once an id has touched it,
so no process ever holds a table of 2**26 rows whole (``key_bits=`` overrides).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from paramserver.errors import ConfigError
from paramserver.integrations.pipeline import Pipeline, PipelineError, pipeline

__all__ = ["DenseParameters", "Pipeline", "PipelineError", "ShardedEmbedding", "ShardedEmbeddingBag", "fit",
           "pipeline", "sharded_modules"]

DENSE_KEY_BITS = 22  # num_embeddings up to this many bits: a dense table; above, hashed


def _sync_options(sync: bool) -> dict[str, Any]:
    """A synchronous table: BSP, each clock's pushes from every worker summed and applied
    once, so W workers of batch b train as one of batch W·b (docs/consistency.md)."""
    return {"consistency": "bsp", "aggregate": True} if sync else {}


def _keys(ids: torch.Tensor, num_embeddings: int) -> np.ndarray:
    if ids.dtype not in (torch.int64, torch.int32):
        raise ConfigError(f"embedding ids must be int64 or int32, got {ids.dtype}")
    keys = ids.detach().cpu().numpy().astype(np.int64, copy=False)
    if keys.size and (keys.min() < 0 or keys.max() >= num_embeddings):
        bad = int(keys.min() if keys.min() < 0 else keys.max())
        raise ConfigError(f"embedding id {bad} is outside [0, {num_embeddings}): hash or clip ids before the lookup")
    return keys


class _ShardedRows(nn.Module):
    """The part both modules share: the table, the pulls (prefetched or not) and the pushes."""

    def __init__(self, client: Any, table: str, num_embeddings: int, embedding_dim: int, *,
                 optimizer: Any = None, initializer: Any = None, replicas: int = 1, create: bool = True,
                 key_bits: int | None = None, sync: bool = False):
        super().__init__()
        if num_embeddings < 1 or embedding_dim < 1:
            raise ConfigError(f"num_embeddings and embedding_dim must be >= 1, got {num_embeddings}, {embedding_dim}")
        self.client, self.table, self.sync = client, table, sync
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if create:
            bits = max(int(num_embeddings - 1).bit_length(), 1)
            client.create_table(table, embedding_dim,
                                optimizer=optimizer or {"name": "adagrad", "lr": 0.01},
                                initializer=initializer or {"name": "normal", "std": 1.0 / math.sqrt(embedding_dim)},
                                replicas=replicas, **_sync_options(sync),
                                key_bits=key_bits if key_bits is not None else (bits if bits <= DENSE_KEY_BITS else 0))
        self._pushes: list[tuple[np.ndarray, Future[Any]]] = []  # this module's pushes not yet known applied
        self._prefetched: tuple[np.ndarray, Future[Any]] | None = None
        self._changed_since_prefetch: list[np.ndarray] = []

    # -- pulls ------------------------------------------------------------------------------------------
    def prefetch(self, ids: torch.Tensor) -> None:
        """Pull the rows of the next batch's ``ids`` now, while this batch computes."""
        unique = np.unique(_keys(ids, self.num_embeddings))
        self._prefetched = (unique, self.client.pull(self.table, unique.astype(np.uint64)))
        self._changed_since_prefetch = []

    def _rows(self, unique: np.ndarray) -> np.ndarray:
        """The current rows of ``unique`` (sorted): a pushed batch's rows are applied first."""
        self.flush()
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is None or not np.array_equal(prefetched[0], unique):
            return np.asarray(self.client.pull(self.table, unique.astype(np.uint64)).result(timeout=600))
        rows = np.array(prefetched[1].result(timeout=600))
        if self._changed_since_prefetch:  # pulled before the last push was applied: those rows again
            stale = np.intersect1d(unique, np.concatenate(self._changed_since_prefetch), assume_unique=True)
            if stale.size:
                at = np.searchsorted(unique, stale)
                rows[at] = self.client.pull(self.table, stale.astype(np.uint64)).result(timeout=600)
        return rows

    def _leaf(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the batch's rows as a leaf tensor whose gradient is pushed, each id's row index)."""
        keys = _keys(ids, self.num_embeddings)
        unique, inverse = np.unique(keys.reshape(-1), return_inverse=True)
        rows = torch.from_numpy(self._rows(unique))
        if torch.is_grad_enabled() and self.training:
            rows.requires_grad_(True)
            rows.register_hook(lambda grad: self._push(unique, grad))  # type: ignore[no-untyped-call]
        return rows, torch.from_numpy(inverse.reshape(keys.shape)).to(torch.int64)

    # -- pushes -----------------------------------------------------------------------------------------
    def _push(self, unique: np.ndarray, grad: torch.Tensor) -> None:
        values = np.ascontiguousarray(grad.detach().cpu().numpy(), dtype=np.float32)
        self._pushes.append((unique, self.client.push(self.table, unique.astype(np.uint64), values,
                                                      distinct=True)))
        if self._prefetched is not None:
            self._changed_since_prefetch.append(unique)

    def flush(self) -> None:
        """Wait until every gradient this module pushed is applied on the servers."""
        pending, self._pushes = self._pushes, []
        for _, future in pending:
            future.result(timeout=600)


class ShardedEmbeddingBag(_ShardedRows):
    """``nn.EmbeddingBag`` whose table lives on the parameter server (see the module's doc).

    ``forward(input, offsets=None, per_sample_weights=None)`` takes what
    ``nn.EmbeddingBag`` takes (a 2-d ``input`` of fixed-size bags, or a 1-d one with
    ``offsets``), ``mode`` ``"sum"``, ``"mean"`` or ``"max"``."""

    def __init__(self, client: Any, table: str, num_embeddings: int, embedding_dim: int, mode: str = "mean",
                 **table_options: Any):
        if mode not in ("sum", "mean", "max"):
            raise ConfigError(f"mode must be sum, mean or max, got {mode!r}")
        super().__init__(client, table, num_embeddings, embedding_dim, **table_options)
        self.mode = mode

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        rows, index = self._leaf(input)
        return F.embedding_bag(index, rows, offsets, mode=self.mode, per_sample_weights=per_sample_weights)


class ShardedEmbedding(_ShardedRows):
    """``nn.Embedding`` whose table lives on the parameter server: ``forward(ids)`` is
    ``float32[*ids.shape, embedding_dim]``."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows, index = self._leaf(ids)
        return F.embedding(index, rows)


class DenseParameters:
    """A module's dense parameters on a dense table of the servers, trained Downpour style.

    ``step()`` (after ``backward``) pushes every parameter's gradient, which the table's
    rule applies (``optimizer``: the same dicts as ``create_table``'s), and every
    ``every`` steps pulls the parameters back into the module.  With one worker and
    ``every=1`` it is synchronous: the module's parameters after ``step()`` are those an
    optimiser with the same rule would give.  Workers sharing one table push to it
    concurrently (asynchronous SGD, as Downpour).  The table starts from the module's
    values, or with ``sync=True`` (several workers in lockstep) from ``initializer``,
    which every worker's module then takes."""

    def __init__(self, client: Any, table: str, module: nn.Module, *, optimizer: Any = None, every: int = 1,
                 block: int = 256, create: bool = True, init_from_module: bool | None = None, sync: bool = False,
                 initializer: Any = None):
        if every < 1 or (sync and every != 1):
            raise ConfigError(f"every must be >= 1 (steps between pulls), and 1 with sync=True, got {every}")
        self.client, self.table, self.every, self.block, self.sync = client, table, every, block, sync
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.sizes = [p.numel() for p in self.params]
        total = sum(self.sizes)
        self.rows = max(-(-total // block), 1)
        self.keys = np.arange(self.rows, dtype=np.uint64)
        self.steps = 0
        if create:
            client.create_table(table, block, optimizer=optimizer or {"name": "adam", "lr": 1e-3},
                                initializer=initializer or {"name": "normal", "std": 0.01},
                                key_bits=max(int(self.rows - 1).bit_length(), 1), **_sync_options(sync))
            if init_from_module and sync:
                raise ConfigError("a synchronous table sums its pushes, so the module's values cannot be assigned "
                                  "to it: its parameters start from the table's initializer (initializer=...)")
            if init_from_module if init_from_module is not None else not sync:
                client.push(table, self.keys, self._flat(lambda p: p.detach()), op="assign",
                            distinct=True).result(timeout=600)
        self.pull()

    def _flat(self, take: Callable[[torch.Tensor], torch.Tensor | None]) -> np.ndarray:
        out = np.zeros(self.rows * self.block, np.float32)
        at = 0
        for p, n in zip(self.params, self.sizes):
            t = take(p)
            if t is not None:
                out[at:at + n] = t.reshape(-1).cpu().numpy()
            at += n
        return out.reshape(self.rows, self.block)

    def step(self) -> None:
        """Push the gradients (then zero them); pull the parameters if ``every`` steps passed.
        With ``sync``, this ends the worker's step (``Client.clock``: call it after the
        step's every push; the embeddings push theirs in ``backward``), and the pull
        waits until every worker has ended it."""
        grads = self._flat(lambda p: None if p.grad is None else p.grad.detach())
        self.client.push(self.table, self.keys, grads, distinct=True).result(timeout=600)
        for p in self.params:
            p.grad = None
        if self.sync:
            self.client.clock()
        self.steps += 1
        if self.steps % self.every == 0:
            self.pull()

    @torch.no_grad()
    def pull(self) -> None:
        flat = np.asarray(self.client.pull(self.table, self.keys).result(timeout=600)).reshape(-1)
        at = 0
        for p, n in zip(self.params, self.sizes):
            p.copy_(torch.from_numpy(flat[at:at + n].copy()).reshape(p.shape))
            at += n


def sharded_modules(model: nn.Module) -> list[_ShardedRows]:
    return [m for m in model.modules() if isinstance(m, _ShardedRows)]


def fit(model: nn.Module, loader: Iterable[Any], loss_fn: Callable[..., torch.Tensor], *,
        dense: DenseParameters | torch.optim.Optimizer, epochs: int = 1,
        forward: Callable[[nn.Module, Any], tuple[torch.Tensor, torch.Tensor]] | None = None,
        checkpoint_url: str | None = None, checkpoint_every: int = 0, client: Any = None,
        on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Train ``model`` over ``loader`` for ``epochs``; returns every step's loss.

    ``forward(model, batch)`` returns ``(prediction, target)`` (default: a batch is
    ``(inputs, target)`` and the prediction ``model(*inputs)``).  The embedding tables
    are trained by the servers (their gradients pushed by the backward pass); the dense
    parameters by ``dense``: a ``DenseParameters`` (on the servers) or a local torch
    optimiser.  With ``checkpoint_url`` (and ``client``) every table is checkpointed
    every ``checkpoint_every`` steps and at the end, through the servers' cold backup;
    ``client.restore(url)`` brings it back into a new cluster."""
    if checkpoint_url and client is None:
        raise ConfigError("checkpoints need the client (fit(..., client=client))")
    if client is None and isinstance(dense, torch.optim.Optimizer) and any(m.sync for m in sharded_modules(model)):
        raise ConfigError("synchronous tables need the client, whose clock ends each step (fit(..., client=client))")

    def default_forward(m: nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, target = batch
        inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
        return m(*inputs), target

    run = forward or default_forward
    sharded = sharded_modules(model)
    losses: list[float] = []
    model.train()
    for _ in range(epochs):
        for batch in loader:
            prediction, target = run(model, batch)
            loss = loss_fn(prediction, target)
            if isinstance(dense, torch.optim.Optimizer):
                dense.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]  # pushes the embeddings' gradients
            dense.step()
            if client is not None and isinstance(dense, torch.optim.Optimizer) and any(m.sync for m in sharded):
                client.clock()  # the step ends (a DenseParameters with sync=True says so itself)
            losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(len(losses), losses[-1])
            if checkpoint_url and checkpoint_every and len(losses) % checkpoint_every == 0:
                for m in sharded:
                    m.flush()
                client.checkpoint(checkpoint_url)
    for m in sharded:
        m.flush()
    if checkpoint_url:
        client.checkpoint(checkpoint_url)
    return losses
