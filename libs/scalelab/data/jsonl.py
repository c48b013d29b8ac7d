"""A JSON Lines corpus (`data.source: jsonl`): each line an object whose string field
`data.jsonl.field` is one document, tokenized as its UTF-8 bytes like `data.source: text`.

Only the reading differs from a text corpus: `reader` gives the files and, per file, its documents
as byte pieces; data/text.py scans, splits by document and writes the token streams. Blank lines
and empty strings are no document. A file that is not UTF-8 is skipped and listed in the manifest,
as text does; a line that is not a JSON object with that string field is bad input, named by file
and line.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scalelab.config import ConfigError
from scalelab.data import text


def reader(section: Any) -> tuple[list[Path], text.Pieces]:
    """The files of `data.jsonl` and, per file, its documents (the field of each line)."""
    files = text.list_files(section.path, section.pattern, key="data.jsonl")
    return files, functools.partial(_documents, field=section.field)


def _documents(path: Path, field: str) -> Iterator[tuple[bytes, bool]]:
    """The field of each line of `path`, encoded, each piece a whole document.

    Raises:
        UnicodeDecodeError: the file is not UTF-8 (text.scan skips it).
        ConfigError: a line is not a JSON object holding a string `field`.
    """
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            line.decode("utf-8")  # UnicodeDecodeError, not json's guess at another encoding
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
            value = record.get(field) if isinstance(record, dict) else None
            if not isinstance(value, str):
                raise ConfigError(
                    f"{path}:{number}: data.jsonl.field = {field!r} is not a string field of this line's object"
                )
            if value:
                yield value.encode(), True
