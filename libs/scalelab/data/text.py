"""A text corpus (a UTF-8 file, or the files of a folder that match a glob) as byte tokens.

Documents are files (`data.text.separator: ''`), or the pieces of each file that end after each
occurrence of the separator (the last piece ends the file). Train, val and test are split by
document (data.split.Splitter over the documents in path order, from `data.seed`), so no document
is cut across two splits. The tokenizer is the bytes themselves: a vocabulary of 256, one token per
byte, nothing downloaded or trained.

Two streamed passes, each holding one CHUNK_BYTES block of one file: `scan` checks that every file
is UTF-8 and counts its documents (a file that is not UTF-8, or is empty, is skipped and listed in
the manifest); `write_split_streams` appends each document's bytes to its split's token file and
its start offset to the split's document index. Both take a `Pieces` function, a file's documents
as byte pieces: `reader` gives this source's; another token source (data/jsonl.py) gives its own
and shares the rest.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.config import ConfigError
from scalelab.data.arrays import NpyWriter
from scalelab.data.split import Splitter

CHUNK_BYTES = 8 << 20
VOCAB_SIZES = {"bytes": 256}
SKIPPED_EXAMPLES = 5
# a file's bytes in order, in non-empty pieces; a piece flagged True ends a document
Pieces = Callable[[Path], Iterator[tuple[bytes, bool]]]


@dataclass(frozen=True)
class Corpus:
    files: list[Path]  # the readable files, in path order
    documents: list[int]  # documents per file
    skipped: dict[str, Any]  # {"not_utf8": n, "empty": n, "examples": [...]}

    @property
    def num_documents(self) -> int:
        return sum(self.documents)


def reader(section: Any) -> tuple[list[Path], Pieces]:
    """The files of `data.text` and how each splits into documents (at `separator`, or whole)."""
    files = list_files(section.path, section.pattern)
    return files, functools.partial(_pieces, separator=section.separator.encode())


def list_files(path: str, pattern: str, key: str = "data.text") -> list[Path]:
    """The file at `path`, or the files under folder `path` that match `pattern`, hidden ones
    (any part starting with '.') left out, sorted by relative path; `key` is their params section."""
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ConfigError(f"{key}.path = {path!r}: no such file or folder")
    files = sorted(
        p for p in root.glob(pattern) if p.is_file() and not any(s.startswith(".") for s in p.relative_to(root).parts)
    )
    if not files:
        raise ConfigError(f"{key}.pattern = {pattern!r} matches no file under {path}")
    return files


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        yield from iter(lambda: fh.read(CHUNK_BYTES), b"")


def _pieces(path: Path, separator: bytes) -> Iterator[tuple[bytes, bool]]:
    """The file's bytes in order, in non-empty pieces; a piece flagged True ends a document."""
    if not separator:
        yield from ((chunk, False) for chunk in _chunks(path))
        return
    tail = b""
    for chunk in _chunks(path):
        block, start = tail + chunk, 0
        while (i := block.find(separator, start)) >= 0:
            yield block[start : i + len(separator)], True
            start = i + len(separator)
        cut = max(start, len(block) - (len(separator) - 1))  # a separator may straddle two blocks
        if cut > start:
            yield block[start:cut], False
        tail = block[cut:]
    if tail:
        yield tail, False


def _count_documents(path: Path, pieces: Pieces) -> int | None:
    """Documents in one file (0 when empty), or None when it is not UTF-8; one streamed read."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    count, open_document = 0, False
    try:
        for piece, ends in pieces(path):
            decoder.decode(piece)
            count += ends
            open_document = not ends
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return None
    return count + open_document


def scan(files: list[Path], pieces: Pieces) -> Corpus:
    """Pass 1: which files are UTF-8 and not empty, and how many documents each holds."""
    kept, counts, not_utf8, empty = [], [], [], []
    for path in files:
        n = _count_documents(path, pieces)
        if n is None:
            not_utf8.append(path)
        elif n == 0:
            empty.append(path)
        else:
            kept.append(path)
            counts.append(n)
    skipped = {
        "not_utf8": len(not_utf8),
        "empty": len(empty),
        "examples": [str(p) for p in (not_utf8 + empty)[:SKIPPED_EXAMPLES]],
    }
    return Corpus(kept, counts, skipped)


class SplitStreams:
    """Per split: the token file (uint8 bytes) and the document index (int64 start offsets)."""

    def __init__(self, folder: Path, names: tuple[str, ...]) -> None:
        self.tokens = {n: NpyWriter(folder / f"{n}.tokens.npy", np.uint8) for n in names}
        self.starts = {n: NpyWriter(folder / f"{n}.doc_starts.npy", np.int64) for n in names}

    def writers(self) -> list[NpyWriter]:
        return [*self.tokens.values(), *self.starts.values()]


def write_split_streams(corpus: Corpus, pieces: Pieces, splitter: Splitter, streams: SplitStreams) -> None:
    """Pass 2: every document's bytes to the token file of its split, in path order."""
    names = list(streams.tokens)
    for path, count in zip(corpus.files, corpus.documents):
        labels, done, tokens = splitter.take(count), 0, None
        for piece, ends in pieces(path):
            if tokens is None:  # a document starts: its split, and its offset in that split
                name = names[labels[done]]
                tokens = streams.tokens[name]
                streams.starts[name].append(np.array([tokens.rows], dtype=np.int64))
            tokens.append(np.frombuffer(piece, dtype=np.uint8))
            if ends:
                done, tokens = done + 1, None
        done += tokens is not None
        if done != count:
            raise RuntimeError(f"{path} changed while it was read: {done} documents, {count} before")
