"""What a user sets for a round app (``MFConfig``, ``LDAConfig``): frozen dataclasses with
no numba behind them, light to import, so that the command line (``cli/rounds.py``)
declares each app's flags from these fields and their defaults, written once here.
``mf`` and ``lda_sampler`` (and ``lda``) export them under their old names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MFConfig:
    rank: int = 64
    epochs: int = 40
    lr: float = 0.007
    reg: float = 0.06
    reg_bias: float = 0.01
    init_std: float = 0.05
    seed: int = 0



@dataclass(frozen=True)
class LDAConfig:
    topics: int = 50
    iterations: int = 200
    alpha: float = 0.1
    beta: float = 0.01
    seed: int = 0
    schedule: str = "rotate"  # or "none": every worker samples every word each round (AD-LDA), to compare
    staleness: int = 0  # rounds a worker may run ahead of the slowest (SSP); 0: BSP rounds
    sampler: str = "sparse"  # or "mh": Metropolis–Hastings, O(1) a token (lda_mh)
    mh_steps: int = 2  # with "mh": cycles of a word then a document proposal a token

    @property
    def regions(self) -> int:
        """Slots of ``lda/topic_delta`` a worker has: 2s + 2 for the rounds, one for the
        start, one for a recount after a death or a resume.  Round q's slot is written
        again by round q + 2s + 2: a worker takes round q's pull before it arrives at
        round q + s + 1, and nobody starts round q + 2s + 2 before all have arrived there."""
        return 2 * self.staleness + 4

    @property
    def round_regions(self) -> int:
        return 2 * self.staleness + 2
