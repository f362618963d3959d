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

Vectorised: the lines are split in C (``bytes.split``), the words sorted as fixed-width
byte strings (``np.unique``) or found in the sorted vocabulary (``np.searchsorted``); no
Python runs a word.
"""

from __future__ import annotations

import itertools

import numpy as np

from paramserver.data.reader import DataError

#: the bytes a numeric corpus (UCI docword, LDA-C) is made of: a first line with any other is text
_NUMERIC = b"0123456789:+-. \t\r"


def is_text(raw: bytes) -> bool:
    """Whether a corpus is words rather than numbers: most of its first 64 non-blank lines
    hold a byte that no UCI docword or LDA-C line does (a letter, say).  So a docword file
    whose header was mangled is still read as one, and told what is wrong with its header;
    a corpus whose words are all numbers is read as numbers, and told what it is not."""
    lines = [line for line in raw[:1 << 20].split(b"\n") if line.strip()][:64]
    return 2 * sum(1 for line in lines if line.translate(None, _NUMERIC)) > len(lines)


def read_text(path: str, raw: bytes, vocabulary: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``raw``'s documents: (doc_ptr, words, the vocabulary's words if the corpus made it,
    else None), words numbered by ``vocabulary`` (a file) if given (module's doc).

    Raises:
        DataError: no word at all; a word the vocabulary lacks (its line named); a
            vocabulary that lists a word twice."""
    lines = [line.split(b"\t", 1)[0] for line in raw.split(b"\n")]
    per_line = [line.split() for line in lines]
    lengths = np.fromiter((len(p) for p in per_line), np.int64, len(per_line))
    if not lengths.any():
        raise DataError(f"{path} has no words; expected a line a document, its words separated by blanks")
    tokens = np.array(list(itertools.chain.from_iterable(per_line)))  # fixed-width bytes: sorted in C
    kept = lengths[lengths > 0]
    doc_ptr = np.zeros(kept.size + 1, np.int64)
    np.cumsum(kept, out=doc_ptr[1:])
    if vocabulary is None:
        names, words = np.unique(tokens, return_inverse=True)
        return doc_ptr, words.astype(np.int32), names
    return doc_ptr, _numbered(path, tokens, lengths, vocabulary), None


def _numbered(path: str, tokens: np.ndarray, lengths: np.ndarray, vocabulary: str) -> np.ndarray:
    """Each token's line in the ``vocabulary`` file (from 0)."""
    listed = read_vocabulary(vocabulary)
    order = np.argsort(listed, kind="stable")
    ranked = listed[order]
    twice = np.flatnonzero(ranked[1:] == ranked[:-1])
    if twice.size:
        word = ranked[twice[0]].decode("utf-8", "replace")
        raise DataError(f"{vocabulary} lists the word {word!r} twice (lines "
                        f"{', '.join(str(int(i) + 1) for i in np.flatnonzero(listed == ranked[twice[0]])[:2])}); a "
                        "vocabulary names each word once, on the line of its number: remove the repeats")
    at = np.minimum(np.searchsorted(ranked, tokens), ranked.size - 1)
    missing = np.flatnonzero(ranked[at] != tokens)
    if missing.size:
        first = int(missing[0])
        line = int(np.searchsorted(np.cumsum(lengths), first, side="right")) + 1
        raise DataError(f"{path}:{line}: the word {tokens[first].decode('utf-8', 'replace')!r} is not in the "
                        f"vocabulary {vocabulary} ({missing.size:,} of the corpus's words are not); give the corpus's "
                        "own vocabulary (--vocabulary FILE), or none at all (no --vocabulary and no vocabulary file "
                        "beside the corpus) to number the corpus's words from the corpus")
    return order[at].astype(np.int32)


def read_vocabulary(path: str) -> np.ndarray:
    """A vocabulary file's words, one a non-blank line, as fixed-width bytes (a UTF-8 byte
    order mark and the blanks around a word dropped)."""
    with open(path, "rb") as f:
        raw = f.read()
    words = [w.strip() for w in raw.removeprefix(b"\xef\xbb\xbf").split(b"\n") if w.strip()]
    if not words:
        raise DataError(f"the vocabulary {path} is empty; expected one word a line")
    return np.array(words)
