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
