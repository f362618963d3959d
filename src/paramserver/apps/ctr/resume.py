"""The checkpoints of a training job (``paramserver train --checkpoint-dir``) and the point
it goes on from (``--resume``): the scheduler's checkpoint option, checked, and the step
to restore with the job's progress, checked against this job's shards, model and tables
(each difference said with the flags to pass).  The rounds of ``lasso``, ``mf`` and
``lda`` have their own (``paramserver.apps.rounds.program.round_resume_point``).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.spec_flags import differences, fix, said
from paramserver.apps.ctr.step_size import is_auto
from paramserver.apps.ctr.stream_files import check_pending
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.checkpoint import store as checkpoint
from paramserver.data.reader import Shard
from paramserver.errors import CheckpointError, ConfigError
from paramserver.tables.spec import TableSpec


def checkpoint_option(url: str | None, every: int | None, n_shards: int, seconds: float | None = None,
                      stream: bool = False) -> dict[str, Any] | None:
    """The scheduler's checkpoint option: every ``every`` shards (a file job's default: once
    an epoch) and/or ``seconds`` (a stream's default: 30 s)."""
    if url is None:
        for flag, value in (("--checkpoint-every", every), ("--checkpoint-seconds", seconds)):
            if value is not None:
                raise ConfigError(f"{flag} {value} needs --checkpoint-dir URL (where to write them)")
        return None
    if not url:
        raise ConfigError("--checkpoint-dir must be a folder or URL, got an empty string")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not seconds > 0):
        raise ConfigError(f"--checkpoint-seconds must be a number of seconds > 0, got {seconds!r}")
    if every is None and seconds is None:
        every, seconds = (None, STREAM_CHECKPOINT_S) if stream else (n_shards, None)  # once an epoch
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ConfigError(f"--checkpoint-every must be an int >= 1 (data shards done between two "
                          f"checkpoints), got {every!r}")
    return {"url": url, "every": every, **({"seconds": float(seconds)} if seconds is not None else {})}


STREAM_CHECKPOINT_S = 30.0  # a stream job checkpoints this often unless told otherwise


def stream_resume_point(url: str, source: Any, spec: TableSpec, cfg: TrainConfig,
                        allow_unverified: bool = False) -> tuple[str, dict[str, Any], TableSpec]:
    """The step to restore, the stream job's progress there (its source's position and the
    shards cut before it and not done) and its model table's spec, checked against this job."""
    step, manifest, job = _manifest(url, allow_unverified)
    stream = job.get("stream")
    if not isinstance(stream, dict):
        raise ConfigError(f"--resume {step}: this checkpoint is of a job on files (--data), not on a stream; "
                          "resume it with its --data")
    if stream.get("source") != source.url:
        raise ConfigError(f"--resume {step}: the checkpointed job read the stream {stream.get('source')!r}, not "
                          f"{source.url!r}; pass its --stream")
    if not source.resumable:
        source.start(stream.get("position"))  # says why it cannot
    spec = _check_tables(step, manifest, spec, cfg)
    progress: dict[str, Any] = {k: job[k] for k in ("epoch", "done", "totals", "epoch_examples", "stream",
                                                    "skipped_files") if k in job}
    # a folder's file its pending shards name, changed since it was taken: refused now, or skipped and counted
    return step, check_pending(step, progress, source, cfg.data.changed_files == "skip"), spec


def _manifest(url: str, allow_unverified: bool) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The step ``url`` resolves to, its manifest and the job's progress in it."""
    step = checkpoint.resolve_step(checkpoint.local_url(url, "--resume"))
    manifest = checkpoint.read_manifest(step, allow_unverified)
    job = manifest.get("job")
    if not isinstance(job, dict) or not (isinstance(job.get("shards"), list) or isinstance(job.get("stream"), dict)):
        raise CheckpointError(f"--resume {step}: this checkpoint has no job progress (it was written by "
                              "Client.checkpoint, not by train --checkpoint-dir); restore it with "
                              "Client.restore, or resume from a training checkpoint")
    return step, manifest, job


def train_resume_point(url: str, shards: list[Shard], spec: TableSpec, cfg: TrainConfig, data: list[str],
                       shard_bytes: int, allow_unverified: bool = False) -> tuple[str, dict[str, Any], TableSpec]:
    """The step to restore, the job progress to start from and the model table's spec (a
    layout ``auto`` chose stays), checked against this job."""
    step, manifest, job = _manifest(url, allow_unverified)
    if not isinstance(job.get("shards"), list):
        raise ConfigError(f"--resume {step}: this checkpoint is of a job on the stream "
                          f"{job.get('stream', {}).get('source')!r}; resume it with that --stream")
    ours, theirs = [s.to_wire() for s in shards], job["shards"]
    if ours != theirs:
        diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        there = theirs[diff] if diff < len(theirs) else "none"
        here = ours[diff] if diff < len(ours) else "none"
        raise ConfigError(f"--resume {step}: the checkpointed job has {len(theirs)} shard(s), but --data "
                          f"{' '.join(data)} with --shard-mb {shard_bytes / (1 << 20):g} gives {len(ours)} "
                          f"(shard {diff}: {there} there, {here} here); pass the --data and --shard-mb of "
                          "the checkpointed job")
    spec = _check_tables(step, manifest, spec, cfg)
    epoch = job.get("epoch")
    if isinstance(epoch, int) and epoch >= cfg.epochs:
        raise ConfigError(f"--resume {step}: the checkpoint is in epoch {epoch + 1} of the job, but --epochs "
                          f"is {cfg.epochs}; pass --epochs {job.get('epochs')} (or more)")
    return step, {k: job[k] for k in ("epoch", "done", "totals", "epoch_examples") if k in job}, spec


def _check_tables(step: str, manifest: dict[str, Any], spec: TableSpec, cfg: TrainConfig) -> TableSpec:
    """The checkpoint's tables are the ones these flags train (each difference said with its
    flags); the model table's spec to go on with (``auto``: the layout and the α the job began with)."""
    _check_features(step, manifest, cfg)
    dense_spec = cfg.dense_spec()
    theirs_model = (manifest.get("train") or {}).get("model")
    if dense_spec is not None and (theirs_model is None or Model(**theirs_model) != cfg.model
                                   or (theirs := manifest["tables"].get(dense_spec.name)) is None
                                   or TableSpec.from_wire(theirs).to_wire() != dense_spec.to_wire()):
        raise ConfigError(f"--resume {step}: the checkpoint's MLP table {dense_spec.name!r} is not the one of "
                          f"{cfg.model} (it has {theirs_model}); pass the --model, --embedding-dim, --hidden, "
                          "--fm-l2 and --seed of the checkpointed job")
    theirs_spec = manifest["tables"].get(spec.name)
    if theirs_spec is None:
        raise ConfigError(f"--resume {step}: the checkpoint has table(s) {sorted(manifest['tables'])}, not "
                          f"{spec.name!r} that these flags train; pass the --model of the checkpointed job")
    # where rows live, and in how many bytes their keys, is this run's choice
    theirs = replace(TableSpec.from_wire(theirs_spec), memory=spec.memory, key_bytes=8)
    mine = replace(spec, key_bytes=8, key_bits=theirs.key_bits if cfg.layout == "auto" else spec.key_bits)
    wire = cfg.optimizer_wire()
    if is_auto(wire) and hasattr(theirs.optimizer, "alpha"):  # α, β auto: the ones the job began with
        chosen = {k: getattr(theirs.optimizer, k) for k in ("alpha", "beta") if wire.get(k) == "auto"}
        mine = replace(mine, optimizer=replace(mine.optimizer, **chosen))  # type: ignore[type-var]
    if theirs.to_wire() != mine.to_wire():
        diffs = differences(theirs, mine, theirs_model)
        raise ConfigError(f"--resume {step}: the checkpoint's table {spec.name!r} was made with other settings "
                          f"than this command's: {said(diffs)}; {fix(diffs)}")
    return replace(mine, key_bytes=4) if cfg.narrow_keys(mine) else mine


#: the data flags a feature's key depends on: a resume with another value would train other keys
FEATURE_FLAGS = (("name", "--format"), ("hash_bits", "--hash-bits"), ("label_column", "--label"),
                 ("ignore_columns", "--ignore-columns"), ("numeric_columns", "--numeric-columns"))


def _check_features(step: str, manifest: dict[str, Any], cfg: TrainConfig) -> None:
    """The checkpointed job read its rows into the keys this command's flags make (a resume
    with --hash-bits 20 over a 24-bit job trained other keys into the same table, without a
    word)."""
    theirs = {f: _listed(v) for f, v in ((manifest.get("train") or {}).get("data") or {}).items()}
    ours = {f: _listed(v) for f, v in asdict(cfg.data).items()}
    differ = [(flag, theirs[f], ours[f]) for f, flag in FEATURE_FLAGS if f in theirs and theirs[f] != ours.get(f)]
    if differ:
        raise ConfigError(f"--resume {step}: the checkpointed job read its rows with "
                          f"{', '.join(f'{flag} {t}' for flag, t, _ in differ)}, this command with "
                          f"{', '.join(f'{flag} {o}' for flag, _, o in differ)}: a feature's key depends on "
                          "them; pass the checkpointed job's")


def _listed(value: Any) -> Any:
    """A data flag's value as a manifest's JSON holds it (a tuple as a list)."""
    return list(value) if isinstance(value, (list, tuple)) else value
