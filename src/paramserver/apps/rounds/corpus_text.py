"""Corpora as text for ``paramserver lda``: a line a document, its words separated by blanks.

What a tokeniser leaves (gensim's and tomotopy's input, OCTIS's ``corpus.tsv``): the words
of a line end at its first tab, so OCTIS's ``words<TAB>partition<TAB>label`` lines read as
their words, and every line is a document (its partition is not read: hold documents out
by splitting the file).  A line with no word is no document.

Words are numbered by a vocabulary, one word a line (``--vocabulary FILE``, or the file
beside the corpus, ``corpus.vocabulary_file``): word i is line i, and a word of the corpus
it lacks is an error naming the word, its line and the fix.  Without one, the corpus's own
words in byte order are the vocabulary, and ``paramserver lda --save DIR`` writes them to
``DIR/vocabulary.txt``, so that column j of ``topic_word.npy`` is named.

Numbered in one numba pass (``words.number_words``): no Python runs a word, and only the
vocabulary's words are sorted.
"""

from __future__ import annotations

import numpy as np

from paramserver.apps.rounds.words import TWICE, UNKNOWN, number_words
from paramserver.data.reader import DataError
from paramserver.data.whole import bad_line

#: the bytes a numeric corpus (UCI docword, LDA-C) is made of: a first line with any other is text
_NUMERIC = b"0123456789:+-. \t\r"


def is_text(raw: bytes) -> bool:
    """Whether a corpus is words rather than numbers: most of its first 64 non-blank lines
    hold a byte that no UCI docword or LDA-C line does (a letter, say).  So a docword file
    whose header was mangled is still read as one, and told what is wrong with its header;
    a corpus whose words are all numbers is read as numbers, and told what it is not."""
    lines = [line for line in raw[:1 << 20].split(b"\n") if line.strip()][:64]
    return 2 * sum(1 for line in lines if line.translate(None, _NUMERIC)) > len(lines)


def read_text(path: str, raw: bytes,
              vocabulary: str | None) -> tuple[np.ndarray, np.ndarray, int, np.ndarray | None]:
    """``raw``'s documents: (doc_ptr, words, V, the vocabulary's words if the corpus made
    it, else None), words numbered by ``vocabulary`` (a file) if given (module's doc).

    Raises:
        DataError: no word at all; a word the vocabulary lacks (its line named); a
            vocabulary that lists a word twice."""
    listed = b""
    if vocabulary is not None:
        with open(vocabulary, "rb") as f:
            listed = f.read().removeprefix(b"\xef\xbb\xbf")
        if not listed.strip():
            raise DataError(f"the vocabulary {vocabulary} is empty; expected one word a line")
        if not listed.endswith(b"\n"):
            listed += b"\n"
    buf = np.frombuffer(listed + raw, np.uint8)
    status, at, ids, line_words, spans, n = number_words(buf, len(listed))
    if status == TWICE:
        raise bad_line(str(vocabulary), listed, buf[:len(listed)], at, "this word is listed twice", "a vocabulary "
                       "names each word once, on the line of its number: remove the repeats")
    if status == UNKNOWN:
        a = at - len(listed)
        word = raw[a:a + 200].split(None, 1)[0].split(b"\t", 1)[0].decode("utf-8", "replace")
        raise bad_line(path, raw, buf[len(listed):], raw.rfind(b"\n", 0, a) + 1, f"the word {word!r} is not in "
                       f"the vocabulary {vocabulary} ({n:,} of the corpus's words are not)", "give the corpus's own "
                       "vocabulary "
                       "(--vocabulary FILE), or none at all (no --vocabulary and no vocabulary file beside the "
                       "corpus) to number the corpus's words from the corpus")
    kept = line_words[line_words > 0]
    if not kept.size:
        raise DataError(f"{path} has no words; expected a line a document, its words separated by blanks")
    doc_ptr = np.zeros(kept.size + 1, np.int64)
    np.cumsum(kept, out=doc_ptr[1:])
    if vocabulary is not None:
        return doc_ptr, ids, n, None  # n: the vocabulary's words, every one entered
    names = np.array([raw[a:b] for a, b in spans.tolist()])  # first seen → byte order
    order = np.argsort(names, kind="stable")
    rank = np.empty(n, np.int32)
    rank[order] = np.arange(n, dtype=np.int32)
    return doc_ptr, rank[ids], n, names[order]

