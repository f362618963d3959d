"""A folder stream's files that changed after they were taken (``train --stream FOLDER``):
checked again when a job resumes, and said in the report.

A worker reads a shard only if its file is still the one taken (``data/taken.py``);
else the job fails, or under ``--changed-files skip`` the shard is skipped and counted
by the scheduler (``skipped_files``, ``skipped_shards``, ``skipped_bytes``).  A job
resumed from a checkpoint whose pending shards name such a file (deleted while the job
was down) is refused before anything starts, or with the flag has those shards counted
as skipped here.  The folder source itself says a file that changed after it was read
(``FolderSource.changed``): its new bytes are never read.
"""

from __future__ import annotations

import logging
from typing import Any

from paramserver.data.batch import DataError, Shard
from paramserver.data.streams import FolderSource
from paramserver.data.taken import FIX, FileChangedError, stamp_of

logger = logging.getLogger(__name__)

SHOWN = 5  # files a report names one a line; the rest counted


def check_pending(step: str, progress: dict[str, Any], source: Any, skip: bool) -> dict[str, Any]:
    """``progress`` (a checkpoint's, to resume from), its pending shards whose file changed
    since it was taken removed and counted as skipped if ``skip``; else ``FileChangedError``
    (a ``DataError``) naming the first such file."""
    stream = progress.get("stream")
    if not isinstance(source, FolderSource) or not isinstance(stream, dict):
        return progress
    kept, lost, now_of = [], [], {}
    for wire in stream.get("pending", []):
        shard = Shard.from_wire(wire)
        if shard.path not in now_of:
            now_of[shard.path] = stamp_of(shard.path)
        now = now_of[shard.path]
        what = shard.stamp.changes(now) if shard.stamp is not None else \
            ("" if now is not None else "it is gone (deleted, or moved away)")
        if not what:
            kept.append(wire)
        elif not skip:
            if shard.stamp is None:  # a checkpoint of an earlier version: no stamp to say
                raise DataError(f"--resume {step}: {shard.path}, which the checkpoint has shards "
                                f"of still to read, {what}: {FIX}")
            raise FileChangedError(shard.path, shard.stamp, now, f"{what} (--resume {step} has shards of it to read)")
        else:
            lost.append((shard, what))
    if lost:
        progress = _skipped(progress, kept, lost, step)
    return progress


def _skipped(progress: dict[str, Any], kept: list[Any], lost: list[tuple[Shard, str]], step: str) -> dict[str, Any]:
    """``progress`` with the ``lost`` shards out of its pending ones, counted as skipped."""
    totals = dict(progress.get("totals") or {})
    files = {k: dict(v) for k, v in (progress.get("skipped_files") or {}).items()}
    for shard, what in lost:
        line = files.setdefault(shard.path, {"what": what, "shards": 0, "bytes": 0})
        line.update(what=what, shards=line["shards"] + 1, bytes=line["bytes"] + shard.taken_bytes())
        totals["skipped_shards"] = totals.get("skipped_shards", 0) + 1
        totals["skipped_bytes"] = totals.get("skipped_bytes", 0) + shard.taken_bytes()
    for path in dict.fromkeys(s.path for s, _ in lost):
        logger.warning("--resume %s: %s: %s; its %d shard(s) not read yet (%s bytes) are skipped "
                       "(--changed-files skip)", step, path, files[path]["what"], files[path]["shards"],
                       f"{files[path]['bytes']:,}")
    return {**progress, "totals": totals, "skipped_files": files,
            "stream": {**progress["stream"], "pending": kept}}


def stream_file_report(status: dict[str, Any], source: Any) -> dict[str, Any]:
    """The report's lines on a folder stream's files: those skipped (``--changed-files
    skip``: what changed, shards, bytes) with the rows they held, about (at the job's bytes
    a row), and those changed after they were read (bytes not trained)."""
    files = status.get("skipped_files") or {}
    if not isinstance(source, FolderSource) and not files:
        return {}
    nbytes, examples, read = int(status.get("skipped_bytes", 0)), status.get("examples", 0), status.get("bytes", 0)
    report: dict[str, Any] = {"files_skipped": files, "skipped_shards": int(status.get("skipped_shards", 0)),
                              "skipped_bytes": nbytes,
                              "skipped_rows_estimate": round(nbytes * examples / read) if read and examples else None}
    if isinstance(source, FolderSource):
        report["files_changed_after_taken"] = {source.path_of(n): dict(v) for n, v in source.changed.items()}
    return report


def stream_file_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report table's lines on them (``stream_file_report``)."""
    lines = []
    skipped = report.get("files_skipped") or {}
    if skipped:
        rows = report.get("skipped_rows_estimate")
        lines.append(("NOT TRAINED (--changed-files skip)",
                      f"{len(skipped)} file(s) changed after they were taken: {report['skipped_shards']:,} shard(s), "
                      f"{report['skipped_bytes']:,} bytes" + (f" (about {rows:,} rows)" if rows is not None else "")))
        lines += [("  skipped", f"{f}: {v['what']}; {v['shards']} shard(s), {v['bytes']:,} bytes")
                  for f, v in list(skipped.items())[:SHOWN]]
    changed = report.get("files_changed_after_taken") or {}
    if changed:
        lines.append(("changed after taken", f"{len(changed)} file(s): a folder's file is read once, so "
                                             f"{sum(v['bytes_ignored'] for v in changed.values()):,} bytes of "
                                             "them were not trained"))
        lines += [("  changed", f"{f}: {v['what']}; {v['bytes_ignored']:,} bytes not trained")
                  for f, v in list(changed.items())[:SHOWN]]
    more = max(len(skipped), len(changed)) - SHOWN
    if more > 0:
        lines.append(("", f"... and more: see --metrics-out ({more} not shown)"))
    return lines
