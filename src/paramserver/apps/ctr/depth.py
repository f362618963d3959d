"""How many mini-batches a training worker keeps in flight (``--pipeline``): ``link`` (the
default: an LR pulled and pushed 4, or more on a link whose round trip is long; a factor
model, or a table gated by clocks, 2), a fixed number, or (``auto``) one that grows while
more in flight makes the worker wait less on its pulls, so that a link's round trip is
covered by batches computing rather than by a worker waiting (issue 47.5).

``link`` times the link before the job's first batch: ``LINK_PROBES`` pings to each server,
one at a time (``client.stats.round_trip_floor``), whose least round trip is the link's floor,
and keeps 2 + one batch for each whole ``LINK_MS`` of it, at least ``LINK_BASE`` and up to
``LINK_MAX``, for the rest of the job (batches that go as steps, which read no stale rows:
``STEP_DEPTH``, the most ``--pipeline`` takes, on any link).
On one machine the floor is ~0.3-0.45 ms (two threads' hand-offs at each end), so the depth
is ``LINK_BASE`` there and one worker trains the same model every run; over 10 ms it is 12
(0.15x the loopback run's examples/s at 2, 0.55x at 12: docs/benchmarks-history.md, "A pipeline as
deep as the link").  Only a linear model deepens: a factor model's loss grows with its reads'
delay (FM on the Criteo sample: 0.474 at 2, 0.662 at 4, settled), so it stays at 2.  The
floor was once the least round trip of the job's first requests; but those go out together,
each queued behind the ones before it and the server's first calls of its kernels, and on
one machine it read 1-9 ms (steps 16 in flight), deepening a loopback job that should not.

Depth ``d`` means a batch's rows are pulled while the ``d - 1`` batches before it compute,
so it sees the pushes of all but those: bounded delay (``train_loop.py``).  ``auto`` starts
at 2, today's default, and looks at windows of ``WINDOW`` iterations: when the worker spent
more than ``WAIT_SHARE`` of a window waiting on its pulls it adds one batch in flight, and
when the window after such a step did not take ``GAIN`` or less of the time an iteration
took before it, the step is taken back and the depth stays.  On a link whose round trip
is longer than a batch's work each batch more in flight shortens an iteration; waiting
that more in flight does not shorten is the servers' (a busy server on loopback), and a
deeper pipeline would cost staleness for nothing there.  It is not the default: the depth
it reaches depends on timing, and one worker at a fixed depth trains the same model every
run (measured in ``docs/benchmarks.md``, "Links of a given rate and round trip").  Deeper
than 2, a worker's last batches of the job go one at a time (``Depth.settles``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from paramserver.errors import ConfigError

#: ``auto``'s cap when none is given
AUTO_MAX = 16
#: ``link``: the pings to each server whose least round trip is the link's floor ...
LINK_PROBES = 8
#: ... each answered within this, or the floor is unknown and the depth stays where it starts;
#: a floor that would deepen is timed again this much later, the least of the two kept: a stall
#: of either end (a loaded machine: once in ~20 jobs on this one) must not pass for a link
PROBE_TIMEOUT_S = 10.0
RECHECK_S = 0.05
#: ... each whole this many milliseconds of which adds a batch in flight (about a batch's work
#: halfway up the ramp, ~500 examples at ~500 k examples/s) ...
LINK_MS = 1.0
#: ... but never fewer than this for a linear model pulled and pushed from a table not gated by clocks (a gated one,
#: ``--consistency bsp|ssp:S``, reads s + depth - 1 clocks late and keeps 2, the bound it always came with:
#: ``train_loop._train_stream``), one machine's loopback (pings 0.3-0.45 ms) included.  A batch waits on its own
#: pull's round trip and the servers' turns, which 2 in flight left the worker doing for a third of its time (2
#: servers, 10^6 heavy rows).  Measured 2026-12-07 on one machine, depths taking turns in one script: 2 servers
#: 309-329 k examples/s at 2, 365-386 k at 4, 392-406 k at 8; `--steps off` on one server 427-473 k at 2, 484-563 k
#: at 8; 3 servers +7-9 %, 2 workers +6-9 % at 4.  The test log loss at 4 was below 2's on all six sets tried (heavy
#: rows 0.42220 against 0.42235, a9a, w8a, mushrooms, the Criteo and Avazu samples: the job's last batches settle),
#: at 8 above it on the Criteo sample; a 1 ms link went 1.09-1.13x loopback's examples/s at 4 against 0.70-0.83x at
#: 2 (`compact` at 100 Mbit/s, 2026-12-02)
LINK_BASE = 4
#: ... up to this
LINK_MAX = 16
#: iterations a window, the unit ``auto`` judges by
WINDOW = 20
#: a window that waited on its pulls for more than this share of its time asks for one more in flight ...
WAIT_SHARE = 0.2
#: ... which is kept if the next window's iterations take at most this fraction of the time they took before
GAIN = 0.85


def parse_pipeline(value: object) -> tuple[int, int]:
    """``--pipeline``'s value as (start, cap): ``N`` is (N, N), ``auto`` (2, 16), ``auto:N`` (2, N),
    ``link`` (2, ``LINK_MAX``)."""
    text = str(value).strip()
    if text == "link":
        return 2, LINK_MAX
    if text.startswith("auto"):
        cap = text[5:] if text.startswith("auto:") else ("" if text == "auto" else None)
        if cap is None or (cap and not cap.isdigit()):
            raise ConfigError(f"--pipeline must be a whole number in [1, 64], 'link', 'auto' or 'auto:N', "
                              f"got {value!r}")
        top = int(cap) if cap else AUTO_MAX
        if not 2 <= top <= 64:
            raise ConfigError(f"--pipeline auto:N needs N in [2, 64], got {top}")
        return 2, top
    try:
        depth = int(text)
    except ValueError:
        raise ConfigError(f"--pipeline must be a whole number in [1, 64], 'link', 'auto' or 'auto:N', "
                          f"got {value!r}") from None
    if not 1 <= depth <= 64:
        raise ConfigError(f"--pipeline must be in [1, 64], got {depth}")
    return depth, depth


#: ``link``'s depth where batches go as steps (``client.steps``): a step reads no stale rows, so
#: more in flight costs no loss, and the server always has the next steps queued while the
#: worker parses and sends.  The batches ready together go as one step of several
#: (``train_loop.ENVELOPES``: up to a quarter of the depth, 16 here), so a deeper pipeline
#: also means fewer requests.  10^6 heavy rows on one machine, 2026-12-02 (steps of several
#: batches), five runs of each depth taking turns: 16 in flight 406-504 k examples/s (median
#: 479 k), 32 485-546 k (499 k), 64 476-544 k (532 k), the whole command 3.27, 3.24 and 3.04 s
#: (medians); the same model at each.  Before steps went several to a request, 16 was the
#: best on one machine (4 in flight 675 k mean, 16 704 k, 20-24 no better), and more covered
#: a link: 1 Gbit/s at 1 ms 0.81-0.91x loopback's examples/s at 16, 0.91-0.92x at 28-64;
#: 10 ms round trips 0.54x at 16, 0.63x at 32, 0.69x at 64 (docs/benchmarks.md, "Links
#: through a relay in C").  So steps keep the most in flight on any link.
STEP_DEPTH = 64


def link_depth(floor_ms: float, stale: bool) -> int:
    """``--pipeline link``'s batches in flight for a linear model over a link whose round trip
    is ``floor_ms``: batches pulled and pushed (``stale``) 2 and one more for each whole
    ``LINK_MS``, at least ``LINK_BASE`` and at most ``LINK_MAX``; steps ``STEP_DEPTH`` whatever
    the link."""
    if stale:
        return min(LINK_MAX, max(LINK_BASE, 2 + int(floor_ms / LINK_MS)))
    return STEP_DEPTH

#: mini-batches a worker trains one at a time at the end of its job when its pipeline may run
#: deeper than 2 (``Depth.settles``)
SETTLE_BATCHES = 32


class Depth:
    """One worker's batches in flight (``now``), moved by ``waited`` under ``auto`` and set
    once by ``measured`` under ``link``, from ``LINK_BASE`` (``deepens``: False keeps it at 2;
    ``stale``: False where batches go as steps, which read no stale rows: ``link`` starts
    at ``STEP_DEPTH`` and the job's end needs no settling)."""

    def __init__(self, pipeline: object, deepens: bool = True, stale: bool = True) -> None:
        self.now, self.cap = parse_pipeline(pipeline)
        self.link = str(pipeline).strip() == "link"
        self.deepens = deepens
        self.stale = stale  # a batch in flight reads rows older than the ones before it trained (not steps)
        if self.link and not stale:  # steps: deeper, and more for each ms of a long link
            self.now, self.cap = STEP_DEPTH, STEP_DEPTH
        elif self.link and deepens:  # a linear model pulled and pushed: never fewer, whatever the link
            self.now = LINK_BASE
        self.frozen = self.now >= self.cap or self.link  # a fixed depth never moves; link's is set once
        self.floor_ms: float | None = None  # link: the link's round trip, once measured
        self.blocked = self.spent = 0.0  # this window's waiting on pulls, and its time
        self.iterations = 0
        self.before: float | None = None  # an iteration's time in the window before a step

    def time_link(self, floor: Callable[[], float | None]) -> None:
        """``link``: the link's round trip from ``floor()`` (``client.stats.round_trip_floor``),
        asked a second time ``RECHECK_S`` later where the first would deepen the pipeline."""
        if not self.link:
            return
        first = floor()
        if first is not None and self.deepens and link_depth(1000.0 * first, self.stale) > self.now:
            time.sleep(RECHECK_S)
            again = floor()
            first = first if again is None else min(first, again)
        self.measured(first)

    def measured(self, floor_s: float | None) -> None:
        """``link``: the link's round trip is ``floor_s`` (``client.stats.round_trip_floor``;
        None: unknown, the depth stays where it starts)."""
        if not self.link or floor_s is None:
            return
        self.floor_ms = 1000.0 * floor_s
        if self.deepens:
            self.now = min(self.cap, max(self.now, link_depth(self.floor_ms, self.stale)))

    def settles(self) -> bool:
        """Whether the worker ends its job with one batch in flight: where ``--pipeline`` may
        pass 2 (``link``: once it did; the reader asks at every batch).

        A read ``d - 1`` batches late leaves the model's mean offset (the direction every frequent
        key of a row adds to) swinging, and the deeper the pipeline the wider: at 5 the test log
        loss of 10^6 heavy rows was 0.007 worse than at 2 with the same AUC (the click rate it
        predicted 0.295 against 0.248).  The last ``SETTLE_BATCHES`` batches trained one at a time
        let it settle (0.4293 -> 0.4222; docs/benchmarks.md, "Links of a given rate and round
        trip").  At 2 nothing changes, to the bit."""
        return self.stale and (self.now > 2 if self.link else self.cap > 2)

    def waited(self, blocked_s: float, iteration_s: float) -> None:
        """The worker waited ``blocked_s`` on a batch's pulls in an iteration of ``iteration_s``."""
        if self.frozen:
            return
        self.blocked += blocked_s
        self.spent += iteration_s
        self.iterations += 1
        if self.iterations < WINDOW:
            return
        share = self.blocked / self.spent if self.spent > 0 else 0.0
        each = self.spent / WINDOW
        self.blocked = self.spent = 0.0
        self.iterations = 0
        if self.before is not None and each > GAIN * self.before:
            self.now -= 1  # one more in flight did not shorten an iteration: the servers' wait, not the link's
            self.frozen = True
        elif share > WAIT_SHARE and self.now < self.cap:
            self.before = each
            self.now += 1
        else:
            self.before = None
