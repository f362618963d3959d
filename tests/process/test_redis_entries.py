"""The Redis source against a real redis-server (in this process: no job): entries of many
rows cut at exactly N rows, the rest read after, exactly once, through a commit to the
group and a new job starting there; a bad row named by its entry id."""

from __future__ import annotations

import numpy as np
import pytest
from tests.process.redis_support import redis_url  # noqa: F401  (a fixture)

from paramserver.data.batch import DataError, DataFormat
from paramserver.data.reader import read_batches

LIBSVM = DataFormat("libsvm", label_format="01", hash_bits=64)


def _fill(url: str, stream: str, sizes: list[int]) -> None:
    """Entries of ``sizes`` rows each; row i (from 0, over the stream) has the one key i + 1."""
    import redis

    client = redis.Redis.from_url(url)
    n = 0
    for size in sizes:
        client.xadd(stream, {"line": "\n".join(f"0 {n + i + 1}:1" for i in range(size)).encode()})
        n += size
    client.close()


def _source(url: str, shard_rows: int = 7):
    from paramserver.data.redis_source import ROW_BYTES, RedisSource

    source = RedisSource(url, shard_rows * ROW_BYTES, "libsvm")
    source.start(None)
    return source


def _keys(shards) -> np.ndarray:
    """The one key of each row the shards hold, as a worker reads them, in order."""
    from paramserver.data.redis_source import RedisSource

    keys = []
    for shard in shards:
        with RedisSource.open_shard(shard) as f:
            keys += [int(line.split()[1].split(b":")[0]) for line in iter(f.readline, b"") if line.strip()]
    return np.array(keys, np.int64)


def _parsed(shards) -> int:
    return sum(len(b) for s in shards for b in read_batches(s, LIBSVM, 50))


@pytest.mark.parametrize("limit", [1, 6, 10, 23, 59, 60])
def test_max_rows_cuts_entries_of_many_rows_at_exactly_that_row(redis_url, limit):  # noqa: F811
    _fill(redis_url, "s", [10, 1, 12, 30, 7])  # 60 rows in 5 entries
    source = _source(f"{redis_url}/s")
    shards, position, rows, _ = source.poll(limit)
    keys = _keys(shards)
    assert _parsed(shards) == limit
    assert rows == limit and keys.tolist() == list(range(1, limit + 1)), (limit, [s.span for s in shards])
    rest, _, more, _ = source.poll(None)  # the rest, from inside the entry cut (uncounted: no limit)
    assert not more and _keys(rest).tolist() == list(range(limit + 1, 61))
    source.close()


def test_an_entry_cut_inside_is_resumed_exactly_from_the_group_and_from_a_position(redis_url):  # noqa: F811
    import redis

    _fill(redis_url, "s", [10, 10, 10])
    url = f"{redis_url}/s"
    first = _source(url)
    shards, position, _, _ = first.poll(15)
    assert position["row"] == 5 and _keys(shards).tolist() == list(range(1, 16))
    first.commit(position, [])  # what a finished job commits
    first.close()
    group = redis.Redis.from_url(redis_url).xinfo_groups("s")[0]
    assert group["entries-read"] == 1  # the entry cut inside is not read whole
    second = _source(url)  # a new job without --resume: where the group is, inside the entry
    shards, position, rows, _ = second.poll(None)
    assert rows is None and _keys(shards).tolist() == list(range(16, 31)) and "row" not in position
    second.commit(position, [])
    second.close()
    assert not redis.Redis.from_url(redis_url).exists("paramserver:s:paramserver:row")
    from paramserver.data.redis_source import RedisSource  # a checkpoint's position, and its pending shards

    third = RedisSource(url, 7 * 256, "libsvm")
    third.start(_position_inside(url))
    shards, _, rows, _ = third.poll(None)
    assert rows is None and _keys(shards).tolist() == list(range(16, 31))
    third.close()


def _position_inside(url: str) -> dict:
    source = _source(url + "?group=other")
    _, position, _, _ = source.poll(15)
    source.close()
    return position


def test_a_pending_shard_that_starts_inside_an_entry_commits_the_group_before_it(redis_url):  # noqa: F811
    import redis

    _fill(redis_url, "s", [10, 10])
    source = _source(f"{redis_url}/s", shard_rows=100)
    cut, _, _, _ = source.poll(15)
    rest, position, _, _ = source.poll(None)
    source.commit(position, rest)  # the first 15 rows applied, the rest pending
    client = redis.Redis.from_url(redis_url)
    assert client.get("paramserver:s:paramserver:row").endswith(b" 5")
    second = _source(f"{redis_url}/s")
    assert _keys(second.poll(None)[0]).tolist() == list(range(16, 21))
    second.close()
    source.close()
    client.close()


def test_a_bad_row_is_named_by_its_entry_id_and_row(redis_url):  # noqa: F811
    import redis

    client = redis.Redis.from_url(redis_url)
    client.xadd("b", {"line": b"0 1:1\n0 2:1"})
    bad = client.xadd("b", {"other": b"x", "line": b"0 3:1\n\n0 4:1\nzero 5:1\n0 6:1"}).decode()
    source = _source(f"{redis_url}/b", shard_rows=100)
    shards, _, rows, _ = source.poll(100)
    assert rows == 6
    with pytest.raises(DataError) as err:
        _parsed(shards)
    message = str(err.value)
    assert message.startswith(f"{redis_url}/b entry {bad}, row 3: ") and f"XDEL b {bad}" in message, message
    assert "'zero 5:1'" in message and "--skip-bad-lines" in message
    assert message.count("(") == message.count(")")
    client.close()
    source.close()
