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
``close()`` (or the context manager) stops the stages.  A stage process that dies makes
``step`` raise ``PipelineError`` naming it, within ``timeout_s``.

Not yet: each stage's parameters in its own namespace on the parameter servers, and a
dead stage restarted from there with the micro-batches in flight replayed.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import resource
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


def _send(sock: zmq.Socket[Any], kind: str, index: int, tensor: torch.Tensor) -> None:
    array = np.ascontiguousarray(tensor.detach().cpu().numpy(), dtype=np.float32)
    sock.send_multipart([json.dumps({"kind": kind, "i": index, "shape": list(array.shape)}).encode(), array.data],
                        copy=False)


def _recv(sock: zmq.Socket[Any]) -> tuple[dict[str, Any], torch.Tensor]:
    head, body = sock.recv_multipart()
    header = json.loads(head)
    array = np.frombuffer(body, np.float32).reshape(header["shape"]).copy()
    return header, torch.from_numpy(array)


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


def _stage_main(index: int, n_stages: int, payload: bytes, control: str, threads: int) -> None:
    """A stage's process: its module, its sockets, its 1F1B schedule for every mini-batch."""
    torch.set_num_threads(threads)
    module, loss_fn = cloudpickle.loads(payload)
    ctx = zmq.Context()
    ctrl = ctx.socket(zmq.PAIR)
    ctrl.connect(control)
    prev = nxt = None
    port = 0
    if index > 0:
        prev = ctx.socket(zmq.PAIR)
        port = prev.bind_to_random_port("tcp://127.0.0.1")
    ctrl.send_json({"ready": index, "port": port})
    try:
        while True:
            cmd: dict[str, Any] = ctrl.recv_json()  # type: ignore[assignment]  # our own coordinator's
            op = cmd["op"]
            if op == "connect":
                nxt = ctx.socket(zmq.PAIR)
                nxt.connect(cmd["next"])
                ctrl.send_json({"ok": True})
            elif op == "batch":
                loss = _one_f_one_b(module, loss_fn, index, n_stages, cmd["m"], ctrl, prev, nxt)
                ctrl.send_json({"loss": loss})
            elif op == "grads":
                ctrl.send_json({"n": sum(1 for _ in module.parameters())})
                for p in module.parameters():
                    _send(ctrl, "grad", 0, p.grad if p.grad is not None else torch.zeros_like(p))
            elif op == "sgd":
                with torch.no_grad():
                    for p in module.parameters():
                        if p.grad is not None:
                            p.add_(p.grad, alpha=-cmd["lr"])
                            p.grad = None
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
        ctx.destroy(linger=0)


def _one_f_one_b(module: nn.Module, loss_fn: Callable[..., torch.Tensor], s: int, k: int, m: int,
                 ctrl: Any, prev: Any, nxt: Any) -> float:
    """One mini-batch of ``m`` micro-batches on stage ``s`` of ``k``: warm-up forwards,
    then one forward one backward, then the backwards left.  The first stage reads each
    micro-batch's input, the last its target, from the coordinator as it comes to it (the
    rest arrive meanwhile).  Returns the loss (last stage)."""
    held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # micro-batch -> (its input, its output or loss)
    total = 0.0

    def forward(i: int) -> None:
        nonlocal total
        x = _recv(ctrl)[1] if s == 0 else _recv(prev)[1].requires_grad_(True)
        out = module(x)
        if s == k - 1:
            loss = loss_fn(out, _recv(ctrl)[1]) / m
            total += float(loss.detach())
            held[i] = (x, loss)
        else:
            _send(nxt, "act", i, out)
            held[i] = (x, out)

    def backward(i: int) -> None:
        x, out = held.pop(i)
        if s == k - 1:
            out.backward()  # type: ignore[no-untyped-call]
        else:
            out.backward(_recv(nxt)[1])  # type: ignore[no-untyped-call]
        if s > 0:
            _send(prev, "grad", i, x.grad if x.grad is not None else torch.zeros_like(x))

    warmup = min(k - s - 1, m)
    for i in range(warmup):
        forward(i)
    for i in range(warmup, m):
        forward(i)
        backward(i - warmup)
    for i in range(m - warmup, m):
        backward(i)
    return total


class Pipeline:
    """The coordinator of ``pipeline``'s stage processes (see the module's doc)."""

    def __init__(self, stages: Sequence[nn.Module], loss_fn: Callable[..., torch.Tensor], microbatches: int,
                 *, lr: float | None = None, threads: int = 1, timeout_s: float = 300.0):
        if len(stages) < 1:
            raise ConfigError("a pipeline needs at least one stage")
        if microbatches < 1:
            raise ConfigError(f"microbatches must be >= 1, got {microbatches}")
        self.m, self.lr, self.timeout_ms = microbatches, lr, int(timeout_s * 1000)
        self.ctx = zmq.Context()
        self.ctrl: list[zmq.Socket[Any]] = []
        self.procs: list[Any] = []
        spawn = mp.get_context("spawn")
        for s, module in enumerate(stages):
            sock = self.ctx.socket(zmq.PAIR)
            sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)  # a send to a stage that is gone must not block
            port = sock.bind_to_random_port("tcp://127.0.0.1")
            self.ctrl.append(sock)
            proc = spawn.Process(target=_stage_main, args=(s, len(stages), cloudpickle.dumps((module, loss_fn)),
                                                           f"tcp://127.0.0.1:{port}", threads), daemon=True)
            proc.start()
            self.procs.append(proc)
        ports = [self._reply(s)["port"] for s in range(len(stages))]
        for s in range(len(stages) - 1):
            self.ctrl[s].send_json({"op": "connect", "next": f"tcp://127.0.0.1:{ports[s + 1]}"})
            self._reply(s)

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
            if not proc.is_alive():
                raise PipelineError(f"stage {t}'s process died (exit code {proc.exitcode}); the pipeline cannot "
                                    "go on: start it again")

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One mini-batch through the stages (and an SGD step with ``lr``); its mean loss."""
        if x.shape[0] % self.m or y.shape[0] != x.shape[0]:
            raise ConfigError(f"a mini-batch of {x.shape[0]} rows (targets {y.shape[0]}) cannot be cut into "
                              f"{self.m} equal micro-batches")
        self._check_alive()
        for sock in self.ctrl:
            sock.send_json({"op": "batch", "m": self.m})
        for i, (xs, ys) in enumerate(zip(torch.chunk(x, self.m), torch.chunk(y, self.m))):  # in the order read
            _send(self.ctrl[0], "input", i, xs)
            _send(self.ctrl[-1], "target", i, ys)
        losses = [self._reply(s)["loss"] for s in range(len(self.ctrl))]
        if self.lr is not None:
            self._everyone({"op": "sgd", "lr": self.lr})
        return float(losses[-1])

    def _everyone(self, cmd: dict[str, Any]) -> list[dict[str, Any]]:
        for sock in self.ctrl:
            sock.send_json(cmd)
        return [self._reply(s) for s in range(len(self.ctrl))]

    def gradients(self) -> list[list[np.ndarray]]:
        """Each stage's accumulated parameter gradients (before an SGD step zeroes them)."""
        out = []
        for s, sock in enumerate(self.ctrl):
            sock.send_json({"op": "grads"})
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
