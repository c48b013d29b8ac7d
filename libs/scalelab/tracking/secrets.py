"""Keeping secrets out of the store: files never uploaded, and credential-shaped text redacted.

Everything provenance records (diffs, command lines, tags) passes through `redact()` first, and
untracked files whose names look like secrets (`is_secret_file`) are never read at all. Every URI
that reaches a message or a tag goes through `mask_uri()`.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import PurePosixPath

SECRET_FILES = (
    ".env*",
    "*.pem",
    "*.key",
    "id_*",
    "*credentials*",
    "*.netrc",
    ".netrc",
    "*token*",
    "*secret*",
    "*.p12",
    "*.pfx",
    ".pgpass",
    ".htpasswd",
)
MASK = "***"
_ASSIGN = (
    r"(?i)(?P<head>\b[\w.-]*(?:{names})[\w.-]*[\"']?\s*[=:]\s*[\"']?)(?![=:]){guard}"
    r"(?P<secret>[^\s\"',;()\[\]{{}}]{{3,}})(?=[\s\"',;]|$)"
)
_NOT_A_NUMBER = r"(?![-+]?[\d.]+(?:[\s\"',;]|$)|(?i:true|false|none|null)\b)"
# credential-shaped strings: (pattern, replacement); each match counts as one redaction
PATTERNS = [
    # scheme://user:password@host -> scheme://user:***@host (greedy: a password may hold an '@')
    (re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)(?P<secret>[^/\s]*)@"), rf"\g<head>{MASK}@"),
    # key=value and key: value for password- and secret-like names; for token- and key-like names
    # only when the value is not a number or a bool (`max_tokens=100` is a setting). The value must
    # be a literal: `token = tokenizer(x)` is code. A tokenizer is no token: `tokenizer: bytes` is a setting.
    (re.compile(_ASSIGN.format(names="password|passwd|pwd|secret", guard=""), re.M), rf"\g<head>{MASK}"),
    (
        re.compile(_ASSIGN.format(names="token(?!i[sz])|api[_-]?key|access[_-]?key", guard=_NOT_A_NUMBER), re.M),
        rf"\g<head>{MASK}",
    ),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),  # AWS access key id
    (re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"), MASK),  # GCP API key
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})\b"), MASK),  # GitHub tokens
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S), MASK),
]


def is_secret_file(path: str) -> bool:
    """True when any part of `path` matches a secret file pattern (case-insensitive)."""
    parts = PurePosixPath(path).parts
    return any(fnmatch.fnmatch(part.lower(), pattern) for part in parts for pattern in SECRET_FILES)


def redact(text: str) -> tuple[str, int]:
    """`text` with every credential-shaped string masked, and the number of redactions."""
    count = 0
    for pattern, replacement in PATTERNS:
        text, n = pattern.subn(replacement, text)
        count += n
    return text, count


def mask_uri(uri: str) -> str:
    """A URI with the password part of its credentials masked (for messages and tags)."""
    return PATTERNS[0][0].sub(PATTERNS[0][1], uri)
