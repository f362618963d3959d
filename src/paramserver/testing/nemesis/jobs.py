"""What a nemesis run puts on its client host, and what it checks once the faults are healed.

- ``Counters``: adds to a replicas-2 and a replicas-3 table, each acknowledged before the next, and a
  read after each (``workload.py``); every acknowledged add there exactly once (``check``).
- ``Training``: a real ``paramserver train`` job joined to the emulated cluster (``--cluster
  tcp://...``, its driver and workers on the client host, the model's table at replicas 2), on
  files (``--data``) or as a stream (``--stream FOLDER --max-examples ROWS``: the shards are cut
  by the driver as it goes, issue 32's path), watched
  through the scheduler (``watch.py``).  It must end by itself (exit 0) within ``JOB_S`` of the last
  heal, have trained every row once (the report's examples), and its model must be the fault-free
  run's within what its consistency allows (``TrainingData.allowed``).

What the consistency allows, measured once a campaign on the same rows (``TrainingData.make``,
a local cluster of the same shape, no fault): at the default two batches in flight a batch's pull
may or may not see the push just before it, and across a failover which of the two it does depends
on what was resent when (measured: a run through four failovers ended 3.9e-10 of log loss from the
fault-free run, one worker).  The tolerance is the log-loss difference between two batches in
flight and ``--pipeline 1``, where every pull sees that push; with several workers also the difference
between two fault-free runs (their pushes interleave differently every run) and the difference to
one worker's model: which worker trains which shard is the queue's to decide, and a fault that
stalls one worker hands the shards to the others, up to all of them to one (measured: two workers
through a pause ended 7.8e-4 from the fault-free two-worker run, at one worker's model).  A lost
vnode, rows reset, or a shard trained twice moves the model by far more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import IO, TYPE_CHECKING, Any

from paramserver.testing.nemesis import check
from paramserver.testing.nemesis.workload import WAIT_S

if TYPE_CHECKING:
    from paramserver.testing.nemesis.run import Run

JOB_S = 180.0  # the longest a training job may run on after the last heal
REPLICAS = 2


def _tail(path: str, lines: int = 12) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).strip()
    except OSError:
        return ""


class Counters:
    """The counters' workload (``workload.py``), and its checks."""

    log = "acks.jsonl"
    ended_at: float | None = None
    looks = False  # its plans space kills apart (``plan.draw``)

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, run: Run) -> None:
        out = open(os.path.join(run.folder, "workload.log"), "ab")
        self.proc = run.spawn(run.plan.client_host, ["-m", "paramserver.testing.nemesis.workload", run.scheduler,
                                                     run.folder], out)

    def ended(self, run: Run) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise check.Stuck(f"the workload exited ({self.proc.returncode}) before the run ended")
        return False

    def finish(self, run: Run, heals: list[float], verdict: check.Verdict) -> None:
        """After the last heal: an add acknowledged, the workload stopped, every key read back and checked."""
        if heals:
            run.first_ack_after(heals[-1], "after the last heal")
        open(os.path.join(run.folder, "stop"), "w").close()
        assert self.proc is not None
        try:
            self.proc.wait(timeout=WAIT_S * 2 + 5)
        except subprocess.TimeoutExpired as e:
            raise check.Stuck("the workload did not stop within its deadline (an add waited on)") from e
        reader = run.spawn(run.plan.client_host, ["-m", "paramserver.testing.nemesis.workload", run.scheduler,
                                                  run.folder, "--read"], open(os.devnull, "wb"))
        try:
            reader.wait(timeout=WAIT_S + 30)
        except subprocess.TimeoutExpired as e:
            reader.kill()
            raise check.Stuck("reading the counters back did not finish within its deadline") from e
        with open(os.path.join(run.folder, "values.json")) as f:
            values: dict[str, list[float]] = json.load(f)
        lines = run.acks()
        check.counters(lines, values, verdict)
        check.reads(lines, verdict)

    def stop(self) -> None:
        _kill(self.proc)


@dataclass(frozen=True)
class TrainingData:
    """The rows a training workload trains on, and the fault-free run's report on them."""

    source: tuple[str, ...]  # the arguments that name the rows: --data FILE, or --stream FOLDER --max-examples N
    test: str
    rows: int
    workers: int
    logloss: float  # the fault-free run's test log loss
    allowed: float  # |a faulted run's - logloss| allowed (the module's docstring)

    @staticmethod
    def make(folder: str, rows: int, workers: int, servers: int, seed: int = 47, stream: bool = False) -> TrainingData:
        """``rows`` heavy-tailed rows (and a tenth as many to test on) in ``folder``, and the
        fault-free runs: the same command on a local cluster of ``servers`` at replicas 2, again
        at ``--pipeline 1``, and with several workers once more and with one worker."""
        os.makedirs(os.path.join(folder, "stream"), exist_ok=True)
        train, test = os.path.join(folder, "stream", "rows.tsv"), os.path.join(folder, "test.tsv")
        for path, n, s in ((train, rows, seed), (test, max(rows // 10, 1000), seed + 1)):
            _command(["synth", "--rows", str(n), "--shape", "heavy", "--seed", str(s), "--out", path], folder)
        source = _stream_source(train, rows) if stream else ("--data", train)
        runs = [[], ["--pipeline", "1"]] + ([[], ["--workers", "1"]] if workers > 1 else [])
        ref, *others = [_logloss(train_args(source, test, workers, os.path.join(folder, f"reference-{i}.json"))
                                 + ["--servers", str(servers), *more], folder) for i, more in enumerate(runs)]
        return TrainingData(source, test, rows, workers, ref, sum(abs(x - ref) for x in others))

    def streamed(self) -> TrainingData:
        """The same rows read as a stream, judged against the same fault-free runs (a campaign of
        both workloads makes the rows and runs the references once).  One worker only: it takes
        a stream's shards in the file's order and trains the file's model (the same test log loss
        to the last digit, measured); several workers split a stream otherwise than a file."""
        if self.workers != 1 or self.source[0] != "--data":
            raise ValueError(f"only one worker's file rows read again as a stream (workers={self.workers}, "
                             f"source {' '.join(self.source)})")
        return replace(self, source=_stream_source(self.source[1], self.rows))


def _stream_source(train: str, rows: int) -> tuple[str, ...]:
    """The arguments that read the file ``train`` (alone in its folder) as a stream of ``rows``."""
    return "--stream", os.path.dirname(train), "--max-examples", str(rows)


def train_args(source: tuple[str, ...], test: str, workers: int, report: str) -> list[str]:
    """``paramserver train``'s arguments for the workload (its cluster given apart).  Two batches
    in flight, not the default ``link``: that times the link before the first batch, which a
    delay fault lengthens, and a deeper pipeline trains another model (0.0028 of log loss at
    16 on 900 000 rows) than the fault-free reference, which the check compares with."""
    return ["train", *source, "--test", test, "--workers", str(workers), "--replicas", str(REPLICAS), "--quiet",
            "--metrics-out", report, "--pipeline", "2"]


def _command(args: list[str], folder: str) -> None:
    done = subprocess.run([sys.executable, "-m", "paramserver", *args], capture_output=True, text=True,
                          timeout=600, cwd=folder)
    if done.returncode:
        raise RuntimeError(f"paramserver {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


def _logloss(args: list[str], folder: str) -> float:
    """``paramserver train ARGS``'s test log loss (its report is ``--metrics-out``'s file)."""
    _command(args, folder)
    with open(args[args.index("--metrics-out") + 1]) as f:
        return float(json.load(f)["logloss"])


class Training:
    """A ``paramserver train`` job on the emulated cluster, and its checks."""

    log = "progress.jsonl"
    looks = True  # the watch reports the cluster's copies (``watch.py``)

    def __init__(self, data: TrainingData) -> None:
        self.data = data
        self.proc: subprocess.Popen[bytes] | None = None
        self.watcher: subprocess.Popen[bytes] | None = None
        self.ended_at: float | None = None
        self.folder = ""

    def start(self, run: Run) -> None:
        self.folder = run.folder
        args = train_args(self.data.source, self.data.test, self.data.workers, self._report)
        self.proc = run.spawn(run.plan.client_host, ["-m", "paramserver", *args, "--cluster", run.scheduler],
                              self._out("train.log"))
        self.watcher = run.spawn(run.plan.client_host, ["-m", "paramserver.testing.nemesis.watch", run.scheduler,
                                                        run.folder], self._out("watch.log"))

    @property
    def _report(self) -> str:
        return os.path.join(self.folder, "report.json")

    def _out(self, name: str) -> IO[bytes]:
        return open(os.path.join(self.folder, name), "ab")

    def ended(self, run: Run) -> bool:
        """The job exited 0 (then the rest of the plan is not struck); any other exit is a failure."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            return False
        if self.ended_at is None:
            self.ended_at = time.monotonic()
        if code:
            raise check.Stuck(f"the training job failed (exit {code}): {_tail(os.path.join(self.folder, 'train.log'))}")
        return True

    def finish(self, run: Run, heals: list[float], verdict: check.Verdict) -> None:
        """The job's end waited for (``JOB_S``), then its report checked against the fault-free run's."""
        assert self.proc is not None
        if heals and not self.ended(run):
            run.first_ack_after(heals[-1], "after the last heal")
        try:
            self.proc.wait(timeout=JOB_S)
        except subprocess.TimeoutExpired as e:
            raise check.Stuck(f"the training job did not end within {JOB_S:g} s of the last heal") from e
        self.ended(run)
        # its rows were all trained when the watch saw the job finished (scoring the test set and
        # leaving came after): no progress is due after a heal past that
        finished = [x["t"] for x in run.acks() if x.get("finished")]
        if finished and self.ended_at is not None:
            self.ended_at = min(self.ended_at, float(finished[0]))
        open(os.path.join(self.folder, "stop"), "w").close()
        with open(self._report) as f:
            report = json.load(f)
        self.check(report, verdict)

    def check(self, report: dict[str, Any], verdict: check.Verdict) -> None:
        verdict.acked = {"examples": int(report.get("examples", 0))}
        if report.get("examples") != self.data.rows:
            verdict.violations.append(f"examples: the job trained {report.get('examples')} examples of the "
                                      f"{self.data.rows} rows (a shard lost, or trained twice)")
        if report.get("failed_workers"):
            verdict.violations.append(f"workers: {report['failed_workers']} died")
        got, want, allowed = float(report.get("logloss", float("nan"))), self.data.logloss, self.data.allowed
        verdict.model = {"logloss": got, "fault_free": want, "allowed": allowed}
        if not abs(got - want) <= allowed:
            verdict.violations.append(f"model: test log loss {got!r} against the fault-free run's {want!r} "
                                      f"(|difference| {abs(got - want):.3g}, its consistency allows {allowed:.3g})")

    def stop(self) -> None:
        _kill(self.proc)
        _kill(self.watcher)


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
