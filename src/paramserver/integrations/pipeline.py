"""Pipelined model parallelism for PyTorch (issue 16, part): a model cut into stages, one
process a stage, micro-batches scheduled one-forward-one-backward (1F1B, PipeDream-flush).

``pipeline(stages, loss_fn, microbatches)`` starts a process for each stage (spawned,
``torch.set_num_threads(threads)`` each) and is its coordinator.  ``Pipeline.step(x, y)``
cuts the mini-batch into ``microbatches`` equal parts and runs them through the stages:

- stage s first runs ``min(K - s - 1, m)`` forwards (the warm-up), then alternates one
  forward and one backward, then runs the backwards left.  So it holds the activations of
  at most ``K - s`` micro-batches at once, and every stage is busy in the steady state
  (a bubble of ``(K - 1) / (m + K - 1)`` of the time, GPipe's);
- activations go forward and gradients backward over links between neighbouring stages
  (``wire.link``: the nodes' ZeroMQ transport, ``message`` encoding and CurveZMQ when
  ``PARAMSERVER_SECRET_FILE`` names the cluster's keys), as raw float32 arrays behind a
  msgpack header (nothing is unpickled off them);
- the last stage computes ``loss_fn(output, target) / m`` a micro-batch, so the gradients
  accumulated over the mini-batch are those of the mini-batch's mean loss (a synchronous
  flush: every micro-batch's backward is done before ``step`` returns);
- with ``lr``, each stage then takes an SGD step on its own parameters.

``gradients()`` returns each stage's accumulated gradients (to compare with one process);
``close()`` (or the context manager) stops the stages.  This module is the coordinator;
a stage's process is ``pipeline_stage``, its 1F1B order ``pipeline_schedule``.

**Parameters on the servers, and a stage's death.**  With ``ps=`` (a cluster's scheduler
address, or the cluster) each stage keeps its parameters in its own table of the
namespace ``namespace`` (``"<namespace>/stage<s>"``), written at every mini-batch
boundary.  A table holds two slots, and step t writes slot t mod 2: the coordinator
commits a step once every stage has written it, so a committed copy is never half
overwritten.  When a stage process dies, ``step``:

1. tells the others to abort the mini-batch in flight (a stage waiting on a dead
   neighbour's activations hears it on its control link); messages of the aborted
   attempt carry its generation and are dropped wherever they arrive later;
2. starts the stage again, wires it to its neighbours, and has *every* stage load the
   last committed slot (a survivor may have stepped already);
3. replays the mini-batch, so it counts once: one loss, one step of every stage.

Without ``ps`` a stage's death makes ``step`` raise ``PipelineError`` naming it, within
``timeout_s``, as it does after ``max_restarts`` restarts in one step.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import numpy as np
import torch
import zmq
from torch import nn

from paramserver.errors import ConfigError, ParamServerError
from paramserver.integrations.pipeline_schedule import send_tensor, tensor_of
from paramserver.integrations.pipeline_stage import SLOT_WIDTH, peak_rss_mb, stage_main
from paramserver.wire.link import Link, link_transport, release

__all__ = ["SLOT_WIDTH", "Pipeline", "PipelineError", "peak_rss_mb", "pipeline"]


class PipelineError(ParamServerError):
    """A stage failed or died."""


class _StageDied(PipelineError):
    def __init__(self, stage: int, message: str):
        super().__init__(message)
        self.stage = stage


class Pipeline:
    """The coordinator of ``pipeline``'s stage processes (see the module's doc)."""

    def __init__(self, stages: Sequence[nn.Module], loss_fn: Callable[..., torch.Tensor], microbatches: int,
                 *, lr: float | None = None, threads: int = 1, timeout_s: float = 300.0, ps: Any = None,
                 namespace: str = "pipeline", max_restarts: int = 3):
        if len(stages) < 1:
            raise ConfigError("a pipeline needs at least one stage")
        if microbatches < 1:
            raise ConfigError(f"microbatches must be >= 1, got {microbatches}")
        self.m, self.lr, self.timeout_ms = microbatches, lr, int(timeout_s * 1000)
        self.threads, self.max_restarts = threads, max_restarts
        self.payloads = [cloudpickle.dumps((module, loss_fn)) for module in stages]
        self.generation = 0  # attempts at a mini-batch: every message of one carries its number
        self.committed = 0  # mini-batches done: every stage's values of it are in slot committed % 2
        self.restarts: list[int] = []  # the stages started again, in order
        self.ps = self._namespace(ps, namespace, stages) if ps is not None else None
        self.secret_file = os.environ.get("PARAMSERVER_SECRET_FILE", "")  # the links are CurveZMQ with it
        self.transport = link_transport(secret_file=self.secret_file)
        self.ctrl: list[Link] = [None] * len(stages)  # type: ignore[list-item]
        self.procs: list[Any] = [None] * len(stages)
        inputs = [self._start(s) for s in range(len(stages))]
        for s in range(len(stages) - 1):
            self._ask(s, {"cmd": "connect", "next": inputs[s + 1]})
        if self.ps is not None:
            self._everyone({"cmd": "save", "slot": 0})

    def _namespace(self, ps: Any, namespace: str, stages: Sequence[nn.Module]) -> list[dict[str, Any]]:
        """A table a stage in ``namespace`` on the cluster ``ps`` (its scheduler's address,
        or a cluster): two slots of the stage's parameters, ``SLOT_WIDTH`` floats a row."""
        from paramserver.client.client import Client
        from paramserver.tables.namespaces import check_name

        address = ps if isinstance(ps, str) else ps.address
        check_name(namespace)
        out = []
        with Client(address) as client:
            for s, module in enumerate(stages):
                size = sum(p.numel() for p in module.parameters())
                table = f"{namespace}/stage{s}"
                client.create_table(table, dim=SLOT_WIDTH, optimizer="sgd")
                out.append({"scheduler": address, "table": table, "rows": max(1, math.ceil(size / SLOT_WIDTH))})
        return out

    def _start(self, s: int) -> str:
        """Start stage ``s``'s process (again); the address of its input link."""
        link = Link.bind(self.transport)
        link.sock.raw.setsockopt(zmq.SNDTIMEO, self.timeout_ms)  # a send to a stage that is gone must not block
        if self.ctrl[s] is not None:
            self.ctrl[s].close()
        self.ctrl[s] = link
        proc = mp.get_context("spawn").Process(
            target=stage_main, daemon=True, args=(s, len(self.ctrl), self.payloads[s], link.address, self.threads,
                                                  self.ps[s] if self.ps else None, self.secret_file))
        proc.start()
        self.procs[s] = proc
        return str(self._reply(s)["address"])

    def _ask(self, s: int, cmd: dict[str, Any]) -> dict[str, Any]:
        self.ctrl[s].send(cmd)
        return self._reply(s)

    def _reply(self, s: int) -> dict[str, Any]:
        """Stage ``s``'s answer; a stage that died or failed is said."""
        link = self.ctrl[s]
        waited = 0
        while not link.poll(200):
            waited += 200
            self._check_alive()  # any stage: the others would wait on a dead one forever
            if waited >= self.timeout_ms:
                raise PipelineError(f"stage {s} did not answer within {self.timeout_ms / 1000:g} s")
        reply = link.recv().header
        if "error" in reply:
            raise PipelineError(reply["error"])
        return reply

    def _check_alive(self) -> None:
        for t, proc in enumerate(self.procs):
            if proc is not None and not proc.is_alive():
                raise _StageDied(t, f"stage {t}'s process died (exit code {proc.exitcode}); "
                                    + ("it was started again " + f"{self.restarts.count(t)} time(s) this step"
                                       if self.ps is not None else "the pipeline cannot go on (give it ps= to "
                                       "restart a stage from its namespace on the servers)"))

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One mini-batch through the stages (and an SGD step with ``lr``); its mean loss.
        With ``ps``, a stage that dies meanwhile is started again and the mini-batch
        replayed (at most ``max_restarts`` times a step)."""
        if x.shape[0] % self.m or y.shape[0] != x.shape[0]:
            raise ConfigError(f"a mini-batch of {x.shape[0]} rows (targets {y.shape[0]}) cannot be cut into "
                              f"{self.m} equal micro-batches")
        for attempt in range(self.max_restarts + 1):
            try:
                self._check_alive()
                loss = self._attempt(x, y)
                self.committed += 1
                return loss
            except _StageDied as died:
                if self.ps is None or attempt == self.max_restarts:
                    raise
                self._recover(died.stage)
        raise AssertionError("unreachable")

    def _attempt(self, x: torch.Tensor, y: torch.Tensor) -> float:
        self.generation += 1
        g = self.generation
        for link in self.ctrl:
            link.send({"cmd": "batch", "m": self.m, "g": g})
        for i, (xs, ys) in enumerate(zip(torch.chunk(x, self.m), torch.chunk(y, self.m))):  # in the order read
            send_tensor(self.ctrl[0], "input", i, xs, g)
            send_tensor(self.ctrl[-1], "target", i, ys, g)
        losses = [self._reply(s)["loss"] for s in range(len(self.ctrl))]
        if self.lr is not None:  # with ps: each stage writes its new values into the next slot
            self._everyone({"cmd": "sgd", "lr": self.lr, "slot": (self.committed + 1) % 2})
        return float(losses[-1])

    def _recover(self, dead: int) -> None:
        """Stage ``dead`` died during a mini-batch: abort it everywhere, start the stage
        again, wire it in, and load every stage from the last committed slot."""
        self.restarts.append(dead)
        for s, link in enumerate(self.ctrl):
            if s == dead or not self.procs[s].is_alive():
                continue
            link.send({"cmd": "abort"})
            while "aborted" not in self._reply_alive(s):  # answers of the attempt (a loss, an ok) go first
                pass
        address = self._start(dead)
        if dead > 0:
            self._ask(dead - 1, {"cmd": "connect", "next": address})
        if dead < len(self.ctrl) - 1:
            after = self._ask(dead + 1, {"cmd": "rebind"})["address"]
            self._ask(dead, {"cmd": "connect", "next": after})
        self._everyone({"cmd": "load", "slot": self.committed % 2})

    def _reply_alive(self, s: int) -> dict[str, Any]:
        """Stage ``s``'s answer while another stage is known dead (not an error here)."""
        link = self.ctrl[s]
        if not link.poll(self.timeout_ms):
            raise PipelineError(f"stage {s} did not answer an abort within {self.timeout_ms / 1000:g} s")
        return link.recv().header

    def _everyone(self, cmd: dict[str, Any]) -> list[dict[str, Any]]:
        for link in self.ctrl:
            link.send(cmd)
        return [self._reply(s) for s in range(len(self.ctrl))]

    def gradients(self) -> list[list[np.ndarray]]:
        """Each stage's accumulated parameter gradients (before an SGD step zeroes them)."""
        return self._tensors("grads")

    def parameters(self) -> list[list[np.ndarray]]:
        """Each stage's parameter values (a copy)."""
        return self._tensors("params")

    def _tensors(self, op: str) -> list[list[np.ndarray]]:
        out = []
        for s, link in enumerate(self.ctrl):
            link.send({"cmd": op})
            n = self._reply(s)["n"]
            out.append([tensor_of(link.recv()).numpy() for _ in range(n)])
        return out

    def zero_grad(self) -> None:
        self._everyone({"cmd": "zero"})

    def peak_rss_mb(self) -> list[float]:
        return [r["peak_rss_mb"] for r in self._everyone({"cmd": "rss"})]

    def close(self) -> None:
        dead = any(not proc.is_alive() for proc in self.procs)  # then the others may be stuck on it: kill
        for s, link in enumerate(self.ctrl):
            if self.procs[s].is_alive() and not dead:
                try:
                    link.send({"cmd": "stop"})
                    self._reply(s)
                except (PipelineError, zmq.ZMQError):
                    pass
        for proc in self.procs:
            proc.join(timeout=0 if dead else 10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        release(self.transport, self.ctrl)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def pipeline(stages: Sequence[nn.Module], loss_fn: Callable[..., torch.Tensor], microbatches: int,
             **options: Any) -> Pipeline:
    """Start a process for each of ``stages`` and return their coordinator (``Pipeline``)."""
    return Pipeline(stages, loss_fn, microbatches, **options)
