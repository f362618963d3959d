"""How many mini-batches a training worker keeps in flight (``--pipeline``): a fixed number,
or (``auto``) one that grows while more in flight makes the worker wait less on its pulls,
so that a link's round trip is covered by batches computing rather than by a worker
waiting (issue 47.5).

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
than 2, a worker's last batches of the job go one at a time (``settles``).
"""

from __future__ import annotations

from paramserver.errors import ConfigError

#: ``auto``'s cap when none is given
AUTO_MAX = 16
#: iterations a window, the unit ``auto`` judges by
WINDOW = 20
#: a window that waited on its pulls for more than this share of its time asks for one more in flight ...
WAIT_SHARE = 0.2
#: ... which is kept if the next window's iterations take at most this fraction of the time they took before
GAIN = 0.85


def parse_pipeline(value: object) -> tuple[int, int]:
    """``--pipeline``'s value as (start, cap): ``N`` is (N, N), ``auto`` (2, 16), ``auto:N`` (2, N)."""
    text = str(value).strip()
    if text.startswith("auto"):
        cap = text[5:] if text.startswith("auto:") else ("" if text == "auto" else None)
        if cap is None or (cap and not cap.isdigit()):
            raise ConfigError(f"--pipeline must be a whole number in [1, 64], 'auto' or 'auto:N', got {value!r}")
        top = int(cap) if cap else AUTO_MAX
        if not 2 <= top <= 64:
            raise ConfigError(f"--pipeline auto:N needs N in [2, 64], got {top}")
        return 2, top
    try:
        depth = int(text)
    except ValueError:
        raise ConfigError(f"--pipeline must be a whole number in [1, 64], 'auto' or 'auto:N', got {value!r}") from None
    if not 1 <= depth <= 64:
        raise ConfigError(f"--pipeline must be in [1, 64], got {depth}")
    return depth, depth


#: mini-batches a worker trains one at a time at the end of its job when its pipeline may run
#: deeper than the default 2 (``settles``)
SETTLE_BATCHES = 32


def settles(pipeline: object) -> bool:
    """Whether a worker ends its job with one batch in flight: when ``--pipeline`` may pass 2.

    A read ``d - 1`` batches late leaves the model's mean offset (the direction every frequent
    key of a row adds to) swinging, and the deeper the pipeline the wider: at 5 the test log
    loss of 10^6 heavy rows was 0.007 worse than at 2 with the same AUC (the click rate it
    predicted 0.295 against 0.248).  The last ``SETTLE_BATCHES`` batches trained one at a time
    let it settle (0.4293 -> 0.4222; docs/benchmarks.md, "Links of a given rate and round
    trip").  At the default 2 nothing changes, to the bit."""
    return parse_pipeline(pipeline)[1] > 2


class Depth:
    """One worker's batches in flight (``now``), moved by ``waited`` under ``auto``."""

    def __init__(self, pipeline: object) -> None:
        self.now, self.cap = parse_pipeline(pipeline)
        self.frozen = self.now >= self.cap  # a fixed depth never moves
        self.blocked = self.spent = 0.0  # this window's waiting on pulls, and its time
        self.iterations = 0
        self.before: float | None = None  # an iteration's time in the window before a step

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
