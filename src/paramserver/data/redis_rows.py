"""The rows of a Redis stream's entries: what a row is, how the driver counts them without
reading them, how a shard names its entries (``Span``), and where a row is (an entry id).

An entry holds rows in its field ``line`` (or its first field): the value's lines, a
blank line (empty, or only ``\\r``) not a row, as the parsers skip it.  ``train
--max-examples N`` means N rows, exactly, so the driver must know the rows of each entry
it cuts: ``COUNT_ROWS`` counts them in Redis (a Lua script that returns an entry's id
and its row count, not its rows), and the last entry may be cut at a row: a shard then
ends at ``ID:T`` (its rows before T), and the next one starts at ``ID:T`` (its rows from
T).  The driver's position says the same (``{"id": ID, "row": T}``), so a job resumed
from a checkpoint, or a new job starting where the group committed, reads the rest of
that entry and none of what was read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAX_SEQ = (1 << 64) - 1
FIELD = "line"  # the field rows are read from by default (else the entry's first field)

# each entry's id and its rows, for the entries of XRANGE KEYS[1] ARGV[1] ARGV[2] COUNT ARGV[3]
# (the rows of its field ARGV[4], else of its first field)
COUNT_ROWS = """local r = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[2], 'COUNT', ARGV[3])
local out = {}
for k = 1, #r do
  local f = r[k][2]
  local v = f[2] or ''
  for i = 1, #f, 2 do if f[i] == ARGV[4] then v = f[i + 1] end end
  local n, i, len = 0, 1, #v
  while i <= len do
    local j = string.find(v, '\\n', i, true)
    local e = j and j - 1 or len
    if e > i or (e == i and string.byte(v, i) ~= 13) then n = n + 1 end
    if not j then break end
    i = j + 1
  end
  out[#out + 1] = r[k][1]
  out[#out + 1] = n
end
return out"""

Id = tuple[int, int]


def parse_id(text: Any) -> Id:
    ms, _, seq = (text.decode() if isinstance(text, bytes) else str(text)).partition("-")
    return int(ms), int(seq or 0)


def id_text(ident: Id) -> str:
    return f"{ident[0]}-{ident[1]}"


def before(ident: Id) -> Id:
    """The id just before ``ident`` (an entry or not): a group set there has not read it."""
    return (ident[0], ident[1] - 1) if ident[1] else (ident[0] - 1, MAX_SEQ)


def split_ids(first: Id, last: Id, pieces: int) -> list[Id]:
    """``pieces`` ends of ranges that cut ``(first, last]``, by interpolating the ids' time
    (or their sequence, within one millisecond); the last end is ``last``."""
    if pieces <= 1 or first >= last:
        return [last]
    if first[0] == last[0]:
        ends = [(first[0], first[1] + (last[1] - first[1]) * i // pieces) for i in range(1, pieces)]
    else:
        ends = [(first[0] + (last[0] - first[0]) * i // pieces, MAX_SEQ) for i in range(1, pieces)]
    ends = [e for e in ends if first < e < last]
    return sorted(set(ends)) + [last]


def value_of(fields: dict[Any, Any], field: str = FIELD) -> bytes:
    """An entry's ``field``, or its first field's value (redis-py's dict of fields)."""
    for key in (field, field.encode()):
        if key in fields:
            return bytes(fields[key])
    return bytes(next(iter(fields.values()), b""))


def rows_of(value: bytes) -> list[bytes]:
    """A value's rows: its lines but blank ones (as ``COUNT_ROWS`` counts them)."""
    return [line for line in value.split(b"\n") if line not in (b"", b"\r")]


def joined(rows: list[bytes]) -> bytes:
    return b"".join(r + b"\n" for r in rows)


@dataclass(frozen=True)
class Span:
    """The entries of a shard: after ``start`` (or, ``skip`` > 0, from row ``skip`` of the
    entry ``start``) through ``end`` (``take`` > 0: only its rows before ``take``).

    Its text is the shard's ``span``: ``after A to B``, ``from A:K to B``, ``... to B:T``
    (a checkpoint's shards of the first format, ``(A B``, read as ``after A to B``)."""

    start: Id
    end: Id
    skip: int = 0
    take: int = 0

    def text(self) -> str:
        head = f"from {id_text(self.start)}:{self.skip}" if self.skip else f"after {id_text(self.start)}"
        return f"{head} to {id_text(self.end)}" + (f":{self.take}" if self.take else "")

    @classmethod
    def parse(cls, text: str) -> Span:
        words = text.split()
        if len(words) == 2 and words[0].startswith("("):  # the first format
            return cls(parse_id(words[0][1:]), parse_id(words[1]))
        if len(words) != 4 or words[0] not in ("after", "from") or words[2] != "to":
            raise ValueError(f"not a Redis shard's entries: {text!r}")
        start, _, skip = words[1].partition(":")
        end, _, take = words[3].partition(":")
        return cls(parse_id(start), parse_id(end), int(skip or 0) if words[0] == "from" else 0, int(take or 0))


def entry_rows(client: Any, stream: str, ident: Id, field: str = FIELD) -> list[bytes]:
    """The rows of one entry ([] if it was deleted)."""
    got = client.xrange(stream, id_text(ident), id_text(ident), count=1)
    return rows_of(value_of(got[0][1], field)) if got else []


def entries(client: Any, stream: str, span: Span, page: int, field: str = FIELD) -> Iterator[tuple[bytes, bytes]]:
    """``(id, the bytes a worker reads of it)`` for each entry of ``span``, by redis-py (slow:
    to locate a row, not to train)."""
    start = id_text(span.start)
    if span.skip:
        rows = entry_rows(client, stream, span.start, field)
        yield start.encode(), joined(rows[span.skip:span.take or None] if span.start == span.end else
                                     rows[span.skip:])
        if span.start == span.end:
            return
    start = "(" + start
    while True:
        got = client.xrange(stream, start, id_text(span.end), count=page)
        for ident, fields in got:
            if span.take and parse_id(ident) == span.end:
                yield bytes(ident), joined(rows_of(value_of(fields, field))[:span.take])
            else:
                yield bytes(ident), value_of(fields, field) + b"\n"
        if len(got) < page:
            return
        start = "(" + bytes(got[-1][0]).decode()


def locate(client: Any, stream: str, span: Span, offset: int, page: int, field: str = FIELD
           ) -> tuple[str, int] | None:
    """The entry id and the row (from 1) at byte ``offset`` of what a worker read of ``span``."""
    at = 0
    for ident, data in entries(client, stream, span, page, field):
        if offset < at + len(data):
            head = data[:offset - at]
            first = span.skip if span.skip and parse_id(ident) == span.start else 0
            return ident.decode(), first + len(rows_of(head)) + 1  # the bad line starts at offset
        at += len(data)
    return None
