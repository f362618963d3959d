"""Pipelined model parallelism for PyTorch (issue 16, part): a model cut into stages, one
process a stage, micro-batches scheduled one-forward-one-backward (1F1B, PipeDream-flush).

``pipeline(stages, loss_fn, microbatches)`` starts a process for each stage (spawned,
``torch.set_num_threads(threads)`` each) and is its coordinator.  ``Pipeline.step(x, y)``
cuts the mini-batch into ``microbatches`` equal parts and runs them through the stages:

- stage s first runs ``min(K - s - 1, m)`` forwards (the warm-up), then alternates one
  forward and one backward, then runs the backwards left.  So it holds the activations of
  at most ``K - s`` micro-batches at once, and every stage is busy in the steady state
  (a bubble of ``(K - 1) / (m + K - 1)`` of the time, GPipe's);
- activations go forward and gradients backward over ZeroMQ sockets between neighbouring
  stages, as raw float32 buffers behind a small header (nothing is unpickled off them);
- the last stage computes ``loss_fn(output, target) / m`` a micro-batch, so the gradients
  accumulated over the mini-batch are those of the mini-batch's mean loss (a synchronous
  flush: every micro-batch's backward is done before ``step`` returns);
- with ``lr``, each stage then takes an SGD step on its own parameters.

``gradients()`` returns each stage's accumulated gradients (to compare with one process);
``close()`` (or the context manager) stops the stages.

**Parameters on the servers, and a stage's death.**  With ``ps=`` (a cluster's scheduler
address, or the cluster) each stage keeps its parameters in its own table of the
namespace ``namespace`` (``"<namespace>/stage<s>"``), written at every mini-batch
boundary.  A table holds two slots, and step t writes slot t mod 2: the coordinator
commits a step once every stage has written it, so a committed copy is never half
overwritten.  When a stage process dies, ``step``:

1. tells the others to abort the mini-batch in flight (a stage waiting on a dead
   neighbour's activations hears it on its control socket); messages of the aborted
   attempt carry its generation and are dropped wherever they arrive later;
2. starts the stage again, wires it to its neighbours, and has *every* stage load the
   last committed slot (a survivor may have stepped already);
3. replays the mini-batch, so it counts once: one loss, one step of every stage.

Without ``ps`` a stage's death makes ``step`` raise ``PipelineError`` naming it, within
``timeout_s``, as it does after ``max_restarts`` restarts in one step.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import resource
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import numpy as np
import torch
import zmq
from torch import nn

from paramserver.errors import ConfigError, ParamServerError


class PipelineError(ParamServerError):
    """A stage failed or died."""


class _StageDied(PipelineError):
    def __init__(self, stage: int, message: str):
        super().__init__(message)
        self.stage = stage


class _Abort(Exception):
    """The coordinator aborted the mini-batch in flight (a stage died)."""


SLOT_WIDTH = 1024  # floats a row of a stage's table


class _Control:
    """A stage's control socket: commands, and a first or last stage's inputs or targets.
    What is read while the stage waits for something else (a tensor sent ahead) is kept
    for later; only an abort interrupts."""

    def __init__(self, sock: zmq.Socket[Any]):
        self.sock = sock
        self.pending: deque[list[Any]] = deque()

    def read_one(self) -> None:
        frames = self.sock.recv_multipart()
        if len(frames) == 1 and json.loads(frames[0]).get("op") == "abort":
            raise _Abort
        self.pending.append(frames)

    def command(self) -> dict[str, Any]:
        """The next command (tensors of an aborted attempt are dropped)."""
        while True:
            frames = self.pending.popleft() if self.pending else self.sock.recv_multipart()
            if len(frames) == 1:
                return json.loads(frames[0])  # type: ignore[no-any-return]  # our own coordinator's

    def send_json(self, obj: Any) -> None:
        self.sock.send_json(obj)


def _send(sock: zmq.Socket[Any], kind: str, index: int, tensor: torch.Tensor, generation: int = 0,
          ctrl: _Control | None = None) -> None:
    """Send a tensor; with ``ctrl``, a send that cannot go (a dead neighbour) gives way to an
    abort from the coordinator."""
    array = np.ascontiguousarray(tensor.detach().cpu().numpy(), dtype=np.float32)
    frames: list[Any] = [json.dumps({"kind": kind, "i": index, "g": generation, "shape": list(array.shape)}).encode(),
                         array.data]
    while True:
        try:
            sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK if ctrl is not None else 0)
            return
        except zmq.Again:
            assert ctrl is not None
            if ctrl.sock.poll(100):
                ctrl.read_one()


def _tensor(head: bytes, body: Any) -> tuple[dict[str, Any], torch.Tensor]:
    header = json.loads(head)
    array = np.frombuffer(body, np.float32).reshape(header["shape"]).copy()
    return header, torch.from_numpy(array)


def _recv(sock: zmq.Socket[Any]) -> tuple[dict[str, Any], torch.Tensor]:
    return _tensor(*sock.recv_multipart())


def _recv_data(sock: zmq.Socket[Any] | None, ctrl: _Control, generation: int) -> torch.Tensor:
    """The next tensor of this attempt on ``sock`` (``None``: the control socket, a stage's
    inputs and targets); tensors of an aborted attempt are dropped, an abort raises."""
    poller = zmq.Poller()
    poller.register(ctrl.sock, zmq.POLLIN)
    if sock is not None:
        poller.register(sock, zmq.POLLIN)
    while True:
        if sock is None and ctrl.pending:
            frames = ctrl.pending.popleft()
        else:
            ready = dict(poller.poll())
            if ctrl.sock in ready:
                ctrl.read_one()  # an abort raises; a tensor is kept
                continue
            assert sock is not None
            frames = sock.recv_multipart()
        if len(frames) == 2:
            header, tensor = _tensor(*frames)
            if header.get("g") == generation:
                return tensor


class _Slots:
    """A stage's parameters in its table on the servers: two slots of ``rows`` rows each."""

    def __init__(self, ps: dict[str, Any], module: nn.Module):
        from paramserver.client.client import Client

        self.client = Client(ps["scheduler"])
        self.table, self.rows, self.module = ps["table"], ps["rows"], module

    def keys(self, slot: int) -> np.ndarray:
        return np.arange(slot * self.rows, (slot + 1) * self.rows, dtype=np.uint64)

    def save(self, slot: int) -> None:
        flat = torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]).numpy()
        rows = np.zeros(self.rows * SLOT_WIDTH, np.float32)
        rows[:flat.size] = flat
        self.client.push(self.table, self.keys(slot), rows.reshape(self.rows, SLOT_WIDTH), op="assign").result()

    def load(self, slot: int) -> None:
        flat = torch.from_numpy(self.client.pull(self.table, self.keys(slot)).result().reshape(-1).copy())
        at = 0
        with torch.no_grad():
            for p in self.module.parameters():
                p.copy_(flat[at:at + p.numel()].reshape(p.shape))
                at += p.numel()
                p.grad = None

    def close(self) -> None:
        self.client.close()


def peak_rss_mb() -> float:
    """This process's peak resident memory.  ``VmHWM``, not ``ru_maxrss``: a spawned child's
    ``ru_maxrss`` carries its parent's peak from before its ``exec``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _stage_main(index: int, n_stages: int, payload: bytes, control_address: str, threads: int,
                ps: dict[str, Any] | None) -> None:
    """A stage's process: its module, its sockets, its 1F1B schedule for every mini-batch."""
    torch.set_num_threads(threads)
    module, loss_fn = cloudpickle.loads(payload)
    ctx = zmq.Context()
    ctrl = ctx.socket(zmq.PAIR)
    ctrl.connect(control_address)
    slots = _Slots(ps, module) if ps else None
    prev = nxt = None

    def bind_prev() -> int:
        nonlocal prev
        if prev is not None:
            prev.close(linger=0)
        prev = ctx.socket(zmq.PAIR)
        return int(prev.bind_to_random_port("tcp://127.0.0.1"))

    control = _Control(ctrl)
    ctrl.send_json({"ready": index, "port": bind_prev() if index > 0 else 0})
    try:
        while True:
            cmd = control.command()
            op = cmd["op"]
            if op == "connect":
                if nxt is not None:
                    nxt.close(linger=0)
                nxt = ctx.socket(zmq.PAIR)
                nxt.connect(cmd["next"])
                ctrl.send_json({"ok": True})
            elif op == "rebind":  # the stage before this one was started again
                ctrl.send_json({"port": bind_prev()})
            elif op == "batch":
                try:
                    loss = _one_f_one_b(module, loss_fn, index, n_stages, cmd["m"], cmd["g"], control, prev, nxt)
                    ctrl.send_json({"loss": loss})
                except _Abort:
                    ctrl.send_json({"aborted": True})
            elif op == "abort":
                ctrl.send_json({"aborted": True})
            elif op in ("save", "load"):
                assert slots is not None
                getattr(slots, op)(cmd["slot"])
                ctrl.send_json({"ok": True})
            elif op in ("grads", "params"):
                ctrl.send_json({"n": sum(1 for _ in module.parameters())})
                for p in module.parameters():
                    _send(ctrl, op, 0, p if op == "params" else p.grad if p.grad is not None else torch.zeros_like(p))
            elif op == "sgd":
                with torch.no_grad():
                    for p in module.parameters():
                        if p.grad is not None:
                            p.add_(p.grad, alpha=-cmd["lr"])
                            p.grad = None
                if slots is not None:  # this step's values, into the slot the coordinator commits next
                    slots.save(cmd["slot"])
                ctrl.send_json({"ok": True})
            elif op == "zero":
                for p in module.parameters():
                    p.grad = None
                ctrl.send_json({"ok": True})
            elif op == "rss":
                ctrl.send_json({"peak_rss_mb": peak_rss_mb()})
            elif op == "stop":
                ctrl.send_json({"ok": True})
                return
    except Exception as exc:  # said to the coordinator, which raises it
        ctrl.send_json({"error": f"stage {index}: {type(exc).__name__}: {exc}"})
    finally:
        if slots is not None:
            slots.close()
        ctx.destroy(linger=0)


def _one_f_one_b(module: nn.Module, loss_fn: Callable[..., torch.Tensor], s: int, k: int, m: int, g: int,
                 ctrl: _Control, prev: Any, nxt: Any) -> float:
    """One mini-batch of ``m`` micro-batches on stage ``s`` of ``k``: warm-up forwards,
    then one forward one backward, then the backwards left.  The first stage reads each
    micro-batch's input, the last its target, from the coordinator as it comes to it (the
    rest arrive meanwhile).  Returns the loss (last stage).  Raises ``_Abort`` (the
    gradients of the aborted attempt dropped) if the coordinator aborts it."""
    held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # micro-batch -> (its input, its output or loss)
    total = 0.0

    def forward(i: int) -> None:
        nonlocal total
        x = _recv_data(None, ctrl, g) if s == 0 else _recv_data(prev, ctrl, g).requires_grad_(True)
        out = module(x)
        if s == k - 1:
            loss = loss_fn(out, _recv_data(None, ctrl, g)) / m
            total += float(loss.detach())
            held[i] = (x, loss)
        else:
            _send(nxt, "act", i, out, g, ctrl)
            held[i] = (x, out)

    def backward(i: int) -> None:
        x, out = held.pop(i)
        if s == k - 1:
            out.backward()  # type: ignore[no-untyped-call]
        else:
            out.backward(_recv_data(nxt, ctrl, g))  # type: ignore[no-untyped-call]
        if s > 0:
            _send(prev, "grad", i, x.grad if x.grad is not None else torch.zeros_like(x), g, ctrl)

    warmup = min(k - s - 1, m)
    try:
        for i in range(warmup):
            forward(i)
        for i in range(warmup, m):
            forward(i)
            backward(i - warmup)
        for i in range(m - warmup, m):
            backward(i)
    except _Abort:
        for p in module.parameters():
            p.grad = None
        raise
    return total


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
        self.ctx = zmq.Context()
        self.ctrl: list[zmq.Socket[Any]] = [None] * len(stages)  # type: ignore[list-item]
        self.procs: list[Any] = [None] * len(stages)
        ports = [self._start(s) for s in range(len(stages))]
        for s in range(len(stages) - 1):
            self._ask(s, {"op": "connect", "next": f"tcp://127.0.0.1:{ports[s + 1]}"})
        if self.ps is not None:
            self._everyone({"op": "save", "slot": 0})

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

    def _start(self, s: int) -> int:
        """Start stage ``s``'s process (again); the port its input socket is bound on."""
        sock = self.ctx.socket(zmq.PAIR)
        sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)  # a send to a stage that is gone must not block
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        if self.ctrl[s] is not None:
            self.ctrl[s].close(linger=0)
        self.ctrl[s] = sock
        proc = mp.get_context("spawn").Process(
            target=_stage_main, daemon=True, args=(s, len(self.ctrl), self.payloads[s], f"tcp://127.0.0.1:{port}",
                                                   self.threads, self.ps[s] if self.ps else None))
        proc.start()
        self.procs[s] = proc
        return int(self._reply(s)["port"])

    def _ask(self, s: int, cmd: dict[str, Any]) -> dict[str, Any]:
        self.ctrl[s].send_json(cmd)
        return self._reply(s)

    def _reply(self, s: int) -> dict[str, Any]:
        """Stage ``s``'s answer; a stage that died or failed is said."""
        sock = self.ctrl[s]
        waited = 0
        while not sock.poll(200):
            waited += 200
            self._check_alive()  # any stage: the others would wait on a dead one forever
            if waited >= self.timeout_ms:
                raise PipelineError(f"stage {s} did not answer within {self.timeout_ms / 1000:g} s")
        reply: dict[str, Any] = sock.recv_json()  # type: ignore[assignment]
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
        for sock in self.ctrl:
            sock.send_json({"op": "batch", "m": self.m, "g": g})
        for i, (xs, ys) in enumerate(zip(torch.chunk(x, self.m), torch.chunk(y, self.m))):  # in the order read
            _send(self.ctrl[0], "input", i, xs, g)
            _send(self.ctrl[-1], "target", i, ys, g)
        losses = [self._reply(s)["loss"] for s in range(len(self.ctrl))]
        if self.lr is not None:  # with ps: each stage writes its new values into the next slot
            self._everyone({"op": "sgd", "lr": self.lr, "slot": (self.committed + 1) % 2})
        return float(losses[-1])

    def _recover(self, dead: int) -> None:
        """Stage ``dead`` died during a mini-batch: abort it everywhere, start the stage
        again, wire it in, and load every stage from the last committed slot."""
        self.restarts.append(dead)
        for s, sock in enumerate(self.ctrl):
            if s == dead or not self.procs[s].is_alive():
                continue
            sock.send_json({"op": "abort"})
            while "aborted" not in self._reply_alive(s):  # answers of the attempt (a loss, an ok) go first
                pass
        port = self._start(dead)
        if dead > 0:
            self._ask(dead - 1, {"op": "connect", "next": f"tcp://127.0.0.1:{port}"})
        if dead < len(self.ctrl) - 1:
            after = self._ask(dead + 1, {"op": "rebind"})["port"]
            self._ask(dead, {"op": "connect", "next": f"tcp://127.0.0.1:{after}"})
        self._everyone({"op": "load", "slot": self.committed % 2})

    def _reply_alive(self, s: int) -> dict[str, Any]:
        """Stage ``s``'s answer while another stage is known dead (not an error here)."""
        sock = self.ctrl[s]
        if not sock.poll(self.timeout_ms):
            raise PipelineError(f"stage {s} did not answer an abort within {self.timeout_ms / 1000:g} s")
        return sock.recv_json()  # type: ignore[return-value]

    def _everyone(self, cmd: dict[str, Any]) -> list[dict[str, Any]]:
        for sock in self.ctrl:
            sock.send_json(cmd)
        return [self._reply(s) for s in range(len(self.ctrl))]

    def gradients(self) -> list[list[np.ndarray]]:
        """Each stage's accumulated parameter gradients (before an SGD step zeroes them)."""
        return self._tensors("grads")

    def parameters(self) -> list[list[np.ndarray]]:
        """Each stage's parameter values (a copy)."""
        return self._tensors("params")

    def _tensors(self, op: str) -> list[list[np.ndarray]]:
        out = []
        for s, sock in enumerate(self.ctrl):
            sock.send_json({"op": op})
            n = self._reply(s)["n"]
            out.append([_recv(sock)[1].numpy() for _ in range(n)])
        return out

    def zero_grad(self) -> None:
        self._everyone({"op": "zero"})

    def peak_rss_mb(self) -> list[float]:
        return [r["peak_rss_mb"] for r in self._everyone({"op": "rss"})]

    def close(self) -> None:
        dead = any(not proc.is_alive() for proc in self.procs)  # then the others may be stuck on it: kill
        for s, sock in enumerate(self.ctrl):
            if self.procs[s].is_alive() and not dead:
                try:
                    sock.send_json({"op": "stop"})
                    self._reply(s)
                except (PipelineError, zmq.ZMQError):
                    pass
        for proc in self.procs:
            proc.join(timeout=0 if dead else 10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        self.ctx.destroy(linger=0)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def pipeline(stages: Sequence[nn.Module], loss_fn: Callable[..., torch.Tensor], microbatches: int,
             **options: Any) -> Pipeline:
    """Start a process for each of ``stages`` and return their coordinator (``Pipeline``)."""
    return Pipeline(stages, loss_fn, microbatches, **options)
