"""``TrainConfig``: what a training job (``paramserver train``) is, for its driver and
every worker alike: the model and data format, the optimiser, the batches and how many
are in flight, the consistency of the tables, their copies and layout.  It is checked as
it is made (each bad value is said with its flag), and gives the specs of the job's
tables: the model's (hashed, or dense arrays when the folded key space fits) and, for a
deep model, its MLP's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from paramserver.apps.ctr.deep import DENSE_BLOCK
from paramserver.apps.ctr.depth import parse_pipeline
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.step_size import AUTO, BETA_FALLBACK, FALLBACK, is_auto, stand_in
from paramserver.client.row_cache import RowCacheSpec
from paramserver.config import parse_bytes
from paramserver.data.reader import DataFormat
from paramserver.errors import ConfigError
from paramserver.filters.chain import FilterSpec
from paramserver.lifecycle.spec import Lifecycle
from paramserver.routing.hashing import MAX_KEY_BITS
from paramserver.tables.optim import Optimizer
from paramserver.tables.spec import TableSpec

LAYOUTS = ("auto", "hash", "dense")
#: the models and rules whose α may be ``auto``: FTRL on weights that a logistic regression's replay stands for
AUTO_RULES = (("lr", "ftrl"), ("fm", "ftrl_adagrad"), ("deepfm", "ftrl_adagrad"), ("wdl", "ftrl_adagrad"))
STEPS = ("auto", "off")  # --steps
DENSE_AUTO_BYTES = 1 << 30  # --table-layout auto: dense when every copy together fits in this
# ... and when the input is large enough to fill it: this many bytes of text a dense row (2**24 rows:
# 1 GiB of input).  A hash table's memory follows the keys (~26 B a key of dim-1 FTRL) and a dense one's
# is all paid up front (16 B a row): on Criteo-like rows (~40 features in ~260 B) the hash table reaches
# the dense one's size after about 1 GiB of input; below that, the hash table is the smaller by far (10^6
# heavy rows, 1.5 M keys: 40 MB against 256 MB), for ~15 % of the examples/s
DENSE_AUTO_INPUT_A_ROW = 64


#: the largest mini-batch: its parsed rows, keys and gradients held at once (2^24 Criteo rows are
#: about 10 GB); 99999999999 asked numpy for 745 GiB, a bare MemoryError
MAX_BATCH = 1 << 24


@dataclass(frozen=True)
class TrainConfig:
    model: Model = field(default_factory=Model)
    data: DataFormat = field(default_factory=DataFormat)
    optimizer: Any = None  # None: the model's default (``optimizer_wire``: what is given of its rule, over it)
    epochs: int = 1
    batch_size: int = 4000  # the largest mini-batch (see batch_ramp)
    batch_ramp: float = 1.0  # a batch is at most ramp * sqrt(examples this worker trained on) (0: off)
    seed: int = 0
    pipeline: Any = "link"  # batches in flight (pulls ahead, pushes unacknowledged): link, N, auto[:N] (ctr/depth.py)
    consistency: Any = "asp"  # bsp | ssp:S | asp; a worker's clock ticks once a batch
    replicas: int = 1  # copies of every vnode (2 or 3: the job survives a server's death)
    layout: str = "auto"  # the model table's: hash | dense (keys < 2**hash_bits) | auto (see key_bits)
    filters: Any = None  # what the model's pushes, pulls and replies go through on the wire (paramserver.filters)
    lifecycle: Any = None  # admission, eviction, change tracking of the model's table (paramserver.lifecycle)
    storage: str = "float32"  # how servers store the model table's rows: float32, fp16 or bf16
    table_memory: int | str = 0  # memory the model table's rows may take on each server, the rest on disk (0: all)
    hot_keys: str = "full"  # what the hot tier keeps of a key: the key, or a fingerprint (``TableSpec.hot_keys``)
    prefetch: bool = True  # name each batch's keys a batch ahead (Client.prefetch): tiered tables read them then
    steps: str = "auto"  # auto: an LR or FM on one server trains each batch as a step (client.steps); off: pull, push
    row_cache: Any = "off"  # each worker's cache of the model table's rows (client/row_cache.py): off, hot, s=N,rows=N
    slow_rank: int = -1  # benchmarks: this worker sleeps ...
    slow_factor: float = 1.0  # ... (factor - 1) x its compute time each batch

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"--epochs must be >= 1, got {self.epochs}")
        if not 1 <= self.batch_size <= MAX_BATCH:
            raise ConfigError(f"--batch-size must be a whole number in [1, {MAX_BATCH:,}] (examples a mini-batch), got "
                              f"{self.batch_size:,}")
        if not (self.batch_ramp >= 0 and math.isfinite(self.batch_ramp)):
            raise ConfigError(f"--batch-ramp must be a number >= 0 (0: no ramp), got {self.batch_ramp}")
        parse_pipeline(self.pipeline)
        if self.steps not in STEPS:
            raise ConfigError(f"--steps must be one of {', '.join(STEPS)}, got {self.steps!r}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"--table-layout must be one of {LAYOUTS}, got {self.layout!r}")
        try:
            RowCacheSpec.parse(self.row_cache)
        except ConfigError as exc:
            raise ConfigError(f"--row-cache {self.row_cache!r}: {exc}") from None
        try:  # said with the flag's name, before any node starts
            FilterSpec.parse(self.filters)
        except ConfigError as exc:
            raise ConfigError(f"--filters {self.filters!r}: {exc}") from None
        try:
            lifecycle = Lifecycle.parse(self.lifecycle)
        except ConfigError as exc:
            raise ConfigError(f"--lifecycle {self.lifecycle!r}: {exc}") from None
        if parse_bytes("--table-memory", self.table_memory) and self.layout == "dense":
            raise ConfigError(f"--table-memory {self.table_memory} moves rows over the budget to disk, which needs "
                              "a hash table: use --table-layout hash or auto (the default)")
        if self.hot_keys != "full" and not parse_bytes("--table-memory", self.table_memory):
            raise ConfigError(f"--hot-keys {self.hot_keys} is what a memory budget's hot tier keeps of a key: give "
                              "--table-memory too (like --table-memory 512M), or drop --hot-keys")
        if lifecycle and self.layout == "dense":
            raise ConfigError(f"--lifecycle {self.lifecycle!r} needs a hash table, whose memory follows its keys: "
                              "use --table-layout hash or auto (the default)")

    def table_spec(self, input_bytes: int | None = None) -> TableSpec:
        """The model's table; ``input_bytes``, the training data's size (None: a stream, or
        not known), is what ``auto`` weighs the dense layout against (``key_bits``)."""
        optimizer = self.optimizer_wire()
        if is_auto(optimizer):  # not chosen yet (step_size.py): the fixed defaults stand in
            optimizer = stand_in(optimizer)
        spec = TableSpec(self.model.table, self.model.dim, optimizer=optimizer,
                         initializer=self.model.initializer(), seed=self.seed,
                         consistency=self.consistency, replicas=self.replicas, filters=self.filters,
                         lifecycle=self.lifecycle, storage=self.storage, memory=self.table_memory,
                         hot_keys=self.hot_keys)
        spec = replace(spec, key_bits=self.key_bits(spec, input_bytes))
        return replace(spec, key_bytes=4) if self.narrow_keys(spec) else spec

    def optimizer_wire(self) -> dict[str, Any]:
        """The model table's rule as a wire dict: the model's default; ``--optimizer`` of the
        default's rule over it, the parameters it does not give kept (``ftrl:alpha=0.2`` for
        LR keeps β 0.5 and no L1, where the rule's own defaults would have brought L1 = 1); any
        other rule as given.  Its α may be ``auto`` (LR's default: ``step_size.py`` chooses it)."""
        default = self.model.default_optimizer()
        given = self.optimizer
        if given is None:
            return default
        if isinstance(given, str):
            given = given_rule(given)
        elif not isinstance(given, dict):  # a rule object: every value its own
            given = Optimizer.parse(given).to_wire()
        if str(given.get("name", "")).lower() == default["name"]:
            wire = {**default, **given, "name": default["name"]}
        else:
            wire = dict(given)
        if is_auto(wire) and (self.model.name, wire["name"]) not in AUTO_RULES:
            raise ConfigError(f"--optimizer {wire['name']}: alpha=auto and beta=auto are chosen by replaying logistic "
                              "regression's FTRL, so they are for the linear weights of --model lr with ftrl and "
                              "--model fm, deepfm or wdl with ftrl_adagrad (their defaults); give this one numbers, "
                              f"e.g. alpha={FALLBACK},beta={BETA_FALLBACK}")
        return wire

    def with_step(self, alpha: float, beta: float) -> TrainConfig:
        """This job with its rule's α and β set (``auto`` ones, once chosen)."""
        return replace(self, optimizer={**self.optimizer_wire(), "alpha": alpha, "beta": beta})

    def narrow_keys(self, spec: TableSpec) -> bool:
        """Whether the table keeps its keys in 4 bytes (``TableSpec.key_bytes``): features folded
        to 32 bits or fewer (``--hash-bits``) in a hash table of float32 rows in memory (a dim-1
        FTRL slot of 16 bytes, not 20: 20 % less memory a key, and a probe's line holds 4 slots)."""
        return 1 <= self.data.hash_bits <= 32 and not spec.narrow_refusal()

    def dense_spec(self) -> TableSpec | None:
        """A deep model's MLP table (``None`` for lr and fm): the consistency and copies of
        the model's table, its own rule."""
        if self.model.deep is None:
            return None
        return TableSpec(self.model.dense_table, DENSE_BLOCK, optimizer=self.model.dense_optimizer(),
                         initializer={"name": "zeros"}, seed=self.seed, consistency=self.consistency,
                         replicas=self.replicas, key_bits=max(int(self.model.dense_rows - 1).bit_length(), 1),
                         filters=self.filters)

    def key_bits(self, spec: TableSpec, input_bytes: int | None = None) -> int:
        """The table's ``key_bits``: folded features (``--hash-bits B``) make a key space of
        2**B, which ``dense`` stores as arrays; ``auto`` does so when all its copies take at
        most ``DENSE_AUTO_BYTES`` (2**24 dim-1 FTRL rows take 256 MiB) and the input is big
        enough to fill them (``DENSE_AUTO_INPUT_A_ROW`` bytes a row, or a stream)."""
        bits = self.data.hash_bits if self.data.hash_bits < 64 else 0
        if self.layout == "hash" or spec.lifecycle or spec.memory:  # both need a hash table's memory
            return 0
        if self.layout == "dense":
            if not 1 <= bits <= MAX_KEY_BITS:
                raise ConfigError(f"--table-layout dense needs --hash-bits in [1, {MAX_KEY_BITS}] (the key "
                                  f"space), got {self.data.hash_bits}; fold the features or use --table-layout "
                                  "hash")
            return bits
        if not 1 <= bits <= MAX_KEY_BITS or (1 << bits) * 4 * (spec.width + 1) * self.replicas > DENSE_AUTO_BYTES:
            return 0
        if input_bytes is not None and input_bytes < (1 << bits) * DENSE_AUTO_INPUT_A_ROW:
            return 0  # too little data to fill the arrays: a hash table holds its keys in a fraction of them
        return bits


def given_rule(text: str) -> dict[str, Any]:
    """A rule as ``--optimizer`` gives it (``NAME[:key=value,...]`` or ``MODULE:FUNCTION[:...]``),
    checked whole (a rule that does not import is refused now): a built-in rule as what is given
    of it, which the model's default rule fills where it is the same rule
    (``TrainConfig.optimizer_wire``), ``alpha=auto`` and ``beta=auto`` kept; a user's rule as it parsed."""
    from paramserver.tables.optim import parse_text

    name = text.partition(":")[0].strip().lower()
    if name not in Optimizer.registry:  # a user's rule: its parameters are numbers
        wire: dict[str, Any] = Optimizer.parse(text).to_wire()
        return wire
    given = parse_text(text, words=(AUTO,))
    auto = [key for key, value in given.items() if value == AUTO and key != "name"]
    if set(auto) - {"alpha", "beta"}:
        raise ConfigError(f"--optimizer {text}: only alpha and beta may be auto (chosen by replaying FTRL); "
                          f"give {', '.join(sorted(set(auto) - {'alpha', 'beta'}))} a number")
    Optimizer.parse(stand_in(given))  # the rule checked whole, each auto at the value standing in for it
    return {**given, "name": name}
