"""What a training job does, worked out and checked before any node starts (``plan_job``):
its arguments, its outputs writable, its inputs there, its shards (or its stream), its
tables, its checkpoints and the point it resumes from, and whether the test rows are read
while it runs.  ``paramserver train`` says every such fault at once, before a process is
forked; ``train.run_training`` then runs the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from paramserver.apps.ctr.modelfile import model_meta
from paramserver.apps.ctr.resume import checkpoint_option, stream_resume_point, train_resume_point
from paramserver.apps.ctr.streaming import StreamJob, stream_limits
from paramserver.apps.ctr.test_set import check_head as check_test_head
from paramserver.apps.ctr.test_set import core_to_spare
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.client.cached_calls import check_caches_fit
from paramserver.data.csv import check_same_columns
from paramserver.data.files import check_output
from paramserver.data.reader import STDIN, Shard, expand, input_bytes, make_shards
from paramserver.data.streams import StreamSource, open_source
from paramserver.errors import ConfigError
from paramserver.tables.spec import TableSpec


@dataclass(frozen=True)
class JobPlan:
    """What a training job does, worked out (and checked) before any node starts."""

    shards: list[Shard]
    spec: TableSpec  # the model's table
    dense_spec: TableSpec | None  # a deep model's MLP table
    checkpoints: dict[str, Any] | None  # the scheduler's checkpoint option (checkpoint_option)
    step: str | None  # the checkpoint step the job resumes from ...
    progress: dict[str, Any] | None  # ... and the job's progress there
    overlap: bool  # the test rows are read while the job runs (else after it)
    source: StreamSource | None = None  # the stream the job reads (--stream), or None: its shards

    @property
    def stream_position(self) -> Any:
        """Where the stream job resumes: the position in its checkpoint (None: not resumed)."""
        return (self.progress or {}).get("stream", {}).get("position") if self.step else None


def plan_job(cfg: TrainConfig, data: list[str], test: list[str], *, servers: int, workers: int, save: str | None,
              shard_bytes: int, checkpoint_dir: str | None, checkpoint_every: int | None, resume: str | None,
              keep_checkpoints: int, allow_unverified: bool, publish: str | None = None,
              publish_every: float = 10.0, stream: StreamJob | None = None,
              checkpoint_seconds: float | None = None, cluster: str = "local") -> JobPlan:
    """The job's arguments checked, its outputs writable, its inputs there, all said before
    anything starts; its shards, tables, checkpoints and resume point.  ``cluster``: where
    the nodes run (``--cluster``; a local cluster's workers share this machine's memory)."""
    from paramserver.cluster.launch import parse_cluster

    check_job(servers, workers, shard_bytes)
    if isinstance(keep_checkpoints, bool) or not isinstance(keep_checkpoints, int) or keep_checkpoints < 0:
        raise ConfigError(f"--keep-checkpoints must be a whole number >= 0 (0: keep all), got {keep_checkpoints!r}")
    check_output(save, "--save", folder=True)  # every output now, not after the job
    check_output(checkpoint_dir, "--checkpoint-dir", folder=True)
    check_output(publish, "--publish", folder=True)
    if not (isinstance(publish_every, (int, float)) and math.isfinite(publish_every) and publish_every > 0):
        raise ConfigError(f"--publish-every must be a number of seconds > 0, got {publish_every!r}")
    if stream is not None and data:
        raise ConfigError(f"--stream {stream.source} and --data {' '.join(data)}: give one (the files of a folder "
                          "that fills: --stream FOLDER)")
    if stream is not None and cfg.epochs != 1:
        raise ConfigError(f"--epochs {cfg.epochs} with --stream: a stream is read once; drop --epochs")
    if stream is not None:
        stream_limits(stream.max_examples, stream.until)  # checked now, before anything starts
    source = open_source(stream.source, shard_bytes, cfg.data.name) if stream is not None else None
    shards = make_shards(data, shard_bytes) if source is None else []
    spec, dense_spec = cfg.table_spec(input_bytes(data) if source is None else None), cfg.dense_spec()
    if parse_cluster(cluster)[0] == "local":  # each worker's own check sees the memory before the others fill it
        check_caches_fit(spec, cfg.row_cache, workers)
    job_checkpoints = checkpoint_option(checkpoint_dir, checkpoint_every, len(shards), checkpoint_seconds,
                                        stream=source is not None)
    if job_checkpoints is not None:  # eval and predict read a checkpoint with these
        job_checkpoints["meta"] = model_meta(cfg.model, cfg.data)
    step, progress, spec = (None, None, spec) if not resume else \
        stream_resume_point(resume, source, spec, cfg, allow_unverified) if source is not None else \
        train_resume_point(resume, shards, spec, cfg, data, shard_bytes, allow_unverified)
    overlap = core_to_spare(servers, workers)  # else the test rows are read after the job
    if test:
        make_shards(test, shard_bytes)  # the test files exist: said now, not after training
        if cfg.data.name in ("csv", "avazu") and data and STDIN not in (data[0], *test):
            check_same_columns(expand(data)[0], expand(test), cfg.data.name)
        if not overlap:
            check_test_head(test, cfg.data)
    return JobPlan(shards, spec, dense_spec, job_checkpoints, step, progress, overlap, source)


def check_job(servers: Any, workers: Any, shard_bytes: Any) -> None:
    """The cluster and shard arguments of a job, checked before anything starts."""
    for flag, value in (("--servers", servers), ("--workers", workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag} must be a whole number >= 1, got {value!r}")
    if not (isinstance(shard_bytes, (int, float)) and shard_bytes >= 1):
        raise ConfigError(f"--shard-mb must be > 0 (megabytes of input per shard), got {shard_bytes / (1 << 20):g}; "
                          "try 16")
