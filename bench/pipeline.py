"""Pipelined model parallelism (issue 16): an MLP of 4 large layers cut into 2 stages, one
process a stage (1 thread each), m micro-batches under 1F1B, against the same model in
one process (1 thread, the whole mini-batch at once) and against PyTorch's own
`torch.distributed.pipelining.Schedule1F1B` on CPU/gloo (2 processes, 1 thread each).

Each row: the mini-batch's seconds (median of `--repeat` after one warm-up step) as a
speedup over one process, the largest difference between the pipeline's accumulated
gradients and one process's, and the peak RSS of each stage.

    .venv/bin/python bench/pipeline.py [--hidden 2048] [--batch 8192] [--microbatches 1 2 4 8 16] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import sys
import time

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import nn

from paramserver.integrations.pipeline import peak_rss_mb, pipeline


def layers(hidden: int, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()) for _ in range(4)]


def one_process(model: nn.Module, x: torch.Tensor, y: torch.Tensor, repeat: int) -> tuple[float, list[np.ndarray]]:
    times = []
    for r in range(repeat + 1):
        model.zero_grad()
        t = time.perf_counter()
        nn.functional.mse_loss(model(x), y).backward()
        if r:
            times.append(time.perf_counter() - t)
    return statistics.median(times), [p.grad.numpy().copy() for p in model.parameters()]


def ours(parts: list[nn.Module], x: torch.Tensor, y: torch.Tensor, m: int, repeat: int):
    with pipeline(parts, nn.functional.mse_loss, m) as pipe:
        times = []
        for r in range(repeat + 1):
            pipe.zero_grad()
            t = time.perf_counter()
            pipe.step(x, y)
            if r:
                times.append(time.perf_counter() - t)
        grads = [g for stage in pipe.gradients() for g in stage]
        return statistics.median(times), grads, pipe.peak_rss_mb()


def _torch_stage(rank: int, port: int, part: nn.Module, x, y, m: int, repeat: int, out) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    stage = PipelineStage(part, stage_index=rank, num_stages=2, device=torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=nn.functional.mse_loss)
    times = []
    for r in range(repeat + 1):
        part.zero_grad()
        dist.barrier()
        t = time.perf_counter()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        dist.barrier()
        if r:
            times.append(time.perf_counter() - t)
    out.put((rank, statistics.median(times), [p.grad.numpy().copy() for p in part.parameters()],
             peak_rss_mb()))
    dist.destroy_process_group()


def torch_pipelining(parts: list[nn.Module], x, y, m: int, repeat: int):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_torch_stage, args=(r, port, parts[r], x, y, m, repeat, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return max(g[1] for g in got), [a for g in got for a in g[2]], [g[3] for g in got]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true", help="skip torch.distributed.pipelining")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = layers(args.hidden)
    x, y = torch.randn(args.batch, args.hidden), torch.randn(args.batch, args.hidden)
    single, want = one_process(nn.Sequential(*copy.deepcopy(base)), x, y, args.repeat)
    rows = []
    for m in args.microbatches:
        parts = [nn.Sequential(*copy.deepcopy(base[:2])), nn.Sequential(*copy.deepcopy(base[2:]))]
        seconds, grads, rss = ours(parts, x, y, m, args.repeat)
        row = {"stages": 2, "microbatches": m, "speedup": round(single / seconds, 3),
               "max_grad_diff": max(float(np.abs(a - b).max()) for a, b in zip(grads, want)),
               "peak_rss_mb": [round(r, 1) for r in rss], "seconds": round(seconds, 3),
               "one_process_seconds": round(single, 3), "ideal": round(2 * m / (m + 1), 3)}
        if not args.no_torch and m < 2:  # Schedule1F1B refuses fewer micro-batches than stages
            row.update({"torch_speedup": None, "torch_max_grad_diff": None})
        elif not args.no_torch:
            parts = [nn.Sequential(*copy.deepcopy(base[:2])), nn.Sequential(*copy.deepcopy(base[2:]))]
            t_seconds, t_grads, t_rss = torch_pipelining(parts, x, y, m, args.repeat)
            row.update({"torch_speedup": round(single / t_seconds, 3), "torch_seconds": round(t_seconds, 3),
                        "torch_max_grad_diff": max(float(np.abs(a - b).max()) for a, b in zip(t_grads, want)),
                        "torch_peak_rss_mb": [round(r, 1) for r in t_rss]})
        rows.append(row)
        if not args.json:
            print(json.dumps(row), flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
