"""``data.whole.read_whole``, what every whole-file reader (LIBSVM matrices, ratings, corpora)
starts from: compressed bytes read whatever the file's name, binary refused by name."""

from __future__ import annotations

import bz2
import gzip
import lzma

import pytest

from paramserver.apps.rounds.corpus import read_corpus
from paramserver.data.reader import DataError
from paramserver.data.whole import read_whole

TEXT = b"2 0:1 3:2\n1 1:4\n"


@pytest.mark.parametrize("pack", [gzip.compress, bz2.compress, lzma.compress])
def test_compressed_bytes_are_read_whatever_the_name_says(tmp_path, pack):
    path = tmp_path / "corpus.txt"  # no .gz: the first bytes say what it is
    path.write_bytes(pack(TEXT))
    raw, buf = read_whole(str(path))
    assert raw == TEXT and buf.tobytes() == TEXT
    assert read_corpus(str(path)).tokens == 7


def test_a_truncated_archive_and_a_binary_file_are_refused_by_what_they_are(tmp_path):
    cut = tmp_path / "cut.txt"
    cut.write_bytes(gzip.compress(TEXT * 100)[:40])
    with pytest.raises(DataError, match="starts as gzip data but does not decompress"):
        read_whole(str(cut))
    binary = tmp_path / "model.npz.txt"
    binary.write_bytes(b"PK\x03\x04" + bytes(range(256)))
    with pytest.raises(DataError, match=r"holds NUL bytes \(the first at byte 4\): it is binary"):
        read_corpus(str(binary))  # not taken for a text corpus of odd words


@pytest.mark.parametrize(("name", "data", "says"), [
    ("plain.txt.gz", TEXT, r"plain.txt.gz: its name ends in .gz but it starts as b'2 0:1 3:2\\n1 1:4\\n', "
                           r"not gzip data"),
    ("plain.txt.bz2", TEXT, r"its name ends in .bz2 but it starts as b'2 0:1 3:2.*', not bz2 data"),
    ("packed.txt.xz", gzip.compress(TEXT, mtime=0), r"its name ends in .xz but it starts as gzip data"),
])
def test_a_file_named_as_compressed_data_that_is_not_is_refused_by_name(tmp_path, name, data, says):
    """Not the decompressor's bare words at the first read ('Invalid data stream', an LZMAError
    traceback): the file, what its bytes are, and the fix."""
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError, match=says + r".*rename it to what it holds"):
        read_whole(str(path))
    with pytest.raises(DataError, match=says):  # a Path too, as the corpus readers pass one
        read_whole(path)
    good = tmp_path / "good.txt.xz"
    good.write_bytes(lzma.compress(TEXT))
    assert read_whole(str(good))[0] == TEXT


@pytest.mark.parametrize(("text", "says"), [
    (b"1 0:1\n1 99999999999:2\n", r"c.txt:2: word id 99,999,999,999, and every word up to it gets a row of counts: "
                                  r"that takes about [\d,.]+ GiB, and this machine has [\d,.]+ GiB free; number "
                                  r"the words from 0 without gaps"),
    (b"2\n99999999999\n1\n1 1 2\n", r"c.txt: the header's V=99,999,999,999, .* give the vocabulary's true size"),
    # a count, not a word id: numpy was asked for 373 GiB of tokens
    (b"2\n5\n2\n1 1 2\n2 5 99999999999\n", r"c.txt: entry 2 after the header: a count of 99,999,999,999, and the "
                                             r"corpus's 100,000,000,001 tokens .* check the counts"),
    (b"1 0:1\n2 1:2 3:99999999999\n", r"c.txt:2: a count of 99,999,999,999, .* GiB free; check the counts"),
])
def test_a_word_id_past_this_machines_memory_is_refused_before_any_array(tmp_path, text, says):
    path = tmp_path / "c.txt"
    path.write_bytes(text)
    with pytest.raises(DataError, match=says):
        read_corpus(str(path))
