"""What a user sets for a round app (``MFConfig``, ``LDAConfig``): frozen dataclasses with
no numba behind them, light to import, so that the command line (``cli/rounds.py``)
declares each app's flags from these fields: a field made by ``flag`` is one, with the
field's type and default and the help (and argparse options) written beside them, once.
``mf`` and ``lda_sampler`` (and ``lda``) export them under their old names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: topics from which ``--sampler auto`` is ``hybrid``: there SparseLDA's early sweeps, where a document's and a
#: word's counts still spread over many topics, cost more than MH's (docs/benchmarks.md, "LDA: MH sweeps
#: first": at 500 and 1 000 topics the whole command in 0.82-0.85x sparse's time; at 200, ~10 % for 1.6 % of
#: perplexity)
MH_TOPICS = 500
#: ``--optimize-alpha auto`` learns α on corpora whose documents hold fewer tokens than this on average
SHORT_DOCUMENT = 20


def flag(default: Any, text: str, **options: Any) -> Any:
    """A field that is also a flag of its app's command: ``text`` its help, ``options`` the
    argparse options beyond the type and the default, which are the field's."""
    return field(default=default, metadata={"help": text, "options": options})


@dataclass(frozen=True)
class MFConfig:
    rank: int = flag(64, "factors a user and an item (default %(default)s)")
    epochs: int = flag(40, "passes over the training ratings (default %(default)s)")
    lr: float = flag(0.007, "SGD step (default %(default)s)")
    reg: float = flag(0.06, "L2 weight on the factors (default %(default)s; 0.01 on the biases)")
    reg_bias: float = 0.01
    init_std: float = 0.05
    seed: int = flag(0, "seed of the initial factors and the rating order")
    user_sync: int = flag(5, "epochs between the pushes of a worker's user rows to the servers, from which a "
                          "worker that dies is taken over (default %(default)s; a checkpoint and the last epoch "
                          "push them too; 1: every epoch, a fifth of the rounds' time on 4 M ratings)",
                          metavar="EPOCHS")


@dataclass(frozen=True)
class LDAConfig:
    topics: int = flag(50, "topics (default %(default)s)", metavar="K")
    iterations: int = flag(200, "Gibbs sweeps over every token (default %(default)s)")
    alpha: float = flag(0.1, "document-topic prior (default %(default)s), where it starts with --optimize-alpha")
    beta: float = flag(0.01, "topic-word prior (default %(default)s)")
    seed: int = flag(0, "seed of the initial topics and the sampler")
    optimize_alpha: str = flag("auto", "how often α (the same for every topic) is learnt: every N sweeps one step "
                               "of Minka's fixed point moves it to the likeliest for the documents' topic counts, as "
                               "tomotopy and Mallet learn it; 0: α stays --alpha; auto (default): every sweep on a "
                               "corpus of short documents (under 20 tokens on average: titles, posts, abstracts' "
                               "keywords), where the prior is most of a document's evidence, else 0 (the report's "
                               "optimize_alpha and alpha_learned)", metavar="auto|N")
    schedule: str = flag("rotate", "rotate (default): word blocks go round the workers, no word sampled by two at "
                         "once; none: every worker samples every word from counts a round stale (AD-LDA; for "
                         "comparison)", choices=("rotate", "none"))
    staleness: int = flag(0, "SSP between rounds: a worker may run up to S rounds ahead of the slowest, reading "
                          "counts up to S rounds stale (default %(default)s: BSP rounds; with rotate, S > 0 gives up "
                          "that no word is sampled by two workers at once)", metavar="S")
    sampler: str = flag("auto", f"auto (default): hybrid from {MH_TOPICS} --topics, else sparse; "
                        "sparse: SparseLDA's exact Gibbs draw, O(topics in the document) a token; "
                        "mh: Metropolis–Hastings with LightLDA's word and document proposals, O(1) a token, "
                        "faster at many --topics, mixing less a sweep; "
                        "hybrid: mh for the first --mh-share of the sweeps, where SparseLDA is slowest (the counts "
                        "still spread over many topics), then sparse to the end",
                        choices=("auto", "sparse", "mh", "hybrid"))
    mh_steps: int | None = flag(None, "cycles of a word then a document proposal a token in an MH sweep (default: 2 "
                                "with --sampler mh, 1 in hybrid's, whose exact sweeps do the rest)", type=int,
                                metavar="N")
    mh_share: float = flag(0.5, "with --sampler hybrid (or auto's): the share of the sweeps MH samples before the "
                           "exact sweeps (default %(default)s)", metavar="F")
    pieces: str = flag("auto", "pieces a word block is sampled in a round: 2 hides the exchange between rounds "
                       "behind the sampling (the first piece's changes go, and the next round's first piece is "
                       "asked for, half way; the first piece samples on the other workers' topic totals a round "
                       "staler); 1: the whole block; auto (default): 2 where a worker's round holds 100,000 tokens "
                       "or more, else 1 "
                       "(BSP rounds over two workers or more; the report's blocks_in_pieces)",
                       choices=("auto", "1", "2"))

    def alpha_every(self, mean_tokens: float) -> int:
        """Sweeps between α's steps on a corpus whose documents hold ``mean_tokens`` tokens on
        average: ``optimize_alpha``, ``auto`` resolved (``SHORT_DOCUMENT``).  Short documents
        are mostly prior, and a misspecified α costs there at every K (held-out perplexity ÷
        tomotopy's, α fixed → learnt: OCTIS M10, 5.9 tokens a document, K = 50 1.062 → 1.004,
        200 1.047 → 0.988, 1 000 0.821 → 0.778; DBLP, 5.4, K = 50 1.012 → 0.989).  Long ones
        carry their own evidence, and one α for every topic learnt from them fits the many
        topics a document does not use and goes low (20 Newsgroups, 82 tokens, K = 1 000: α
        0.0047, perplexity 0.947 → 1.010; NYT, 145, K = 50, three seeds: 0.998 → 1.004), where
        tomotopy learns one α a topic (docs/benchmarks.md, "α learnt")."""
        if self.optimize_alpha != "auto":
            return int(self.optimize_alpha)
        return 1 if mean_tokens < SHORT_DOCUMENT else 0

    @property
    def alpha_sweeps(self) -> int:
        """Sweeps between α's steps as resolved (``run_lda`` resolves ``auto`` from the corpus
        with ``alpha_every``; one still ``auto`` learns nothing)."""
        return int(self.optimize_alpha) if str(self.optimize_alpha).isdigit() else 0

    @property
    def runs(self) -> str:
        """The sampler a job runs: ``auto`` is ``hybrid`` from ``MH_TOPICS`` topics, else ``sparse``."""
        if self.sampler != "auto":
            return self.sampler
        return "hybrid" if self.topics >= MH_TOPICS else "sparse"

    @property
    def steps(self) -> int:
        """MH steps a token in an MH sweep: ``mh_steps``, else 2 with ``mh`` and 1 in ``hybrid``'s
        sweeps, which the exact sweeps after them finish (1 and 2 ended at the same perplexity
        there, 1 in less time)."""
        return self.mh_steps if self.mh_steps is not None else 2 if self.runs == "mh" else 1

    @property
    def mh_sweeps(self) -> int:
        """The sweeps sampled by MH, the first ones: all with ``mh``, ``mh_share`` of them
        (rounded) with ``hybrid``, none with ``sparse``."""
        runs = self.runs
        if runs == "mh":
            return self.iterations
        return round(self.mh_share * self.iterations) if runs == "hybrid" else 0

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
