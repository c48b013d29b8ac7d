"""Keeping secrets out of the store, recognised by their form, never by a word alone.

Two uses, two rules:
- `find(text)` lists every secret-shaped string (its rule, line and span). A stored diff is never
  edited, since reproduce applies it: when `diff_findings` sees a secret in the uncommitted changes,
  provenance stores no diff at all and tags the run not reproducible (`tracking.provenance`).
- `redact(text)` masks what `find` sees, in texts that are only read: tags and command lines.
Untracked files whose names mark secrets (`is_secret_file`) are never read; every URI that reaches a
message or a tag goes through `mask_uri()`.

What counts as a secret (rules in the manner of gitleaks'):
- known token formats: AWS key ids, GCP API keys, GitHub classic and fine-grained tokens, GitLab,
  Hugging Face, Slack, npm and PyPI tokens, `sk-`/`sk_live_` keys, JWTs, Bearer tokens, Azure
  `AccountKey=`; PEM and PGP private key blocks, with or without their END line;
- credentials in a URL (`scheme://user:password@host`, any characters in the password, up to the
  last `@`; `https://<token>@host`);
- a literal value under a key that names a secret (`DB_PASSWORD=...`, `api_key: "..."`,
  `--token ...`): any literal for password-like keys, a high-entropy one for token- and key-like
  keys (a 40-hex value under `github_token` is one; a commit hash under `rev` is not).
Left alone: settings and code (`max_tokens=100`, `tokens: data.source text`, `token = tokenizer(x)`,
`secret: bool = False`, `password = os.environ["PW"]`), placeholders (`${PW}`, `***`, `<token>`),
and hashes under neutral keys (dvc.lock's md5s).
"""

from __future__ import annotations

import bisect
import fnmatch
import math
import re
import string
from collections import Counter
from dataclasses import dataclass
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
    "kaggle.json",
    ".pypirc",
    ".npmrc",
    "service-account*.json",
    "*.tfvars",
    "my.cnf",
    ".my.cnf",
    "creds.*",
    "*.keystore",
    "*.jks",
)
MASK = "***"

# known token formats: (rule, pattern); the whole match is the secret
_TOKENS = [
    ("aws-access-key-id", r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[A-Z0-9]{16}\b"),
    ("gcp-api-key", r"\bAIza[0-9A-Za-z_\-]{35}\b"),
    ("github-token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
    ("gitlab-token", r"\bglpat-[A-Za-z0-9_\-]{20,}\b"),
    ("huggingface-token", r"\bhf_[A-Za-z0-9]{30,}\b"),
    ("slack-token", r"\bxox[abposre]-[A-Za-z0-9-]{10,}"),
    ("slack-webhook", r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]{20,}"),
    ("npm-token", r"\bnpm_[A-Za-z0-9]{36}\b"),
    ("pypi-token", r"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{20,}"),
    ("sk-key", r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,}"),
    ("stripe-key", r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{20,}"),
    ("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ("bearer-token", r"\b[Bb]earer\s+[A-Za-z0-9\-._~+/]{20,}=*"),
    ("azure-account-key", r"(?i)\bAccountKey=[A-Za-z0-9+/]{40,}={0,2}"),
]
TOKEN_RULES = [(rule, re.compile(pattern)) for rule, pattern in _TOKENS]
# a private key block up to its END line, or to the end of the text when that line is missing
PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|.*\Z)", re.S
)
# a line holds a secret only if it holds one of these (lower case): the other lines are not read
SCREEN = (
    *("akia", "asia", "a3t", "agpa", "aida", "aroa", "aipa", "anpa", "anva", "aiza", "github_pat_", "glpat-"),
    *("gho_", "ghp_", "ghu_", "ghs_", "ghr_", "hf_", "xox", "npm_", "pypi-", "sk-", "sk_", "rk_", "eyj"),
    *("bearer", "://", "pass", "pwd", "secret", "token", "credential", "key"),
)
ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# scheme://user:password@host: the password is everything up to the last '@' of the word
URL_PASSWORD = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@'\"`]*:(?P<secret>[^\s'\"`]+)@(?=[^\s@/'\"`])")
URL_TOKEN = re.compile(r"\bhttps?://(?P<secret>[A-Za-z0-9_\-]{20,})@(?=[^\s@/'\"`])")
# a key that names a secret: the name ends the key (`tokens`, `token_name`, `tokenizer` are other keys)
_PASSWORD_NAMES = r"password|passwd|passphrase|pwd|secret"
_KEY_NAMES = (
    r"token|api[_-]?key|apikey|access[_-]?key|secret[_-]?key|private[_-]?key|account[_-]?key|"
    r"client[_-]?secret|credentials?|auth[_-]?token"
)
_NAMES = f"{_PASSWORD_NAMES}|{_KEY_NAMES}"
_VALUE = r"(?:\"(?P<dq>[^\"\n]*)\"|'(?P<sq>[^'\n]*)'|(?P<bare>[^\s\"'`,;#]+))"
ASSIGN = re.compile(
    rf"(?<![\w.-])(?P<key>[\w.-]*?(?P<name>{_NAMES}))(?![\w-])[\"']?(?P<sep>[ \t]*[=:][ \t]*){_VALUE}", re.I
)
FLAG = re.compile(rf"(?<![\w-])--(?P<key>[\w-]*?(?P<name>{_NAMES}))(?P<sep>[ \t]+|=){_VALUE}", re.I)
# what stands for a value in docs and templates: masks, variables, numbers, the words themselves
PLACEHOLDER = re.compile(
    r"^(?:\*+|\$.*|%\(.*|\{.*|\[.*|<.*|\.\.\.|x{3,}|none|null|nil|true|false|[-+]?[\d.]+|"
    r"password|passwd|pass|secret|token|redacted|example)$",
    re.I,
)
# code, not a literal: a name, a dotted name, a call or an index (`self_tok`, `os.environ["PW"]`),
# or the end of an expression (`{"PW": ADMIN_PASSWORD}`)
CODE = re.compile(r"[A-Za-z_][\w.]*(?:[(\[].*)?|.*[)}\]]")


@dataclass(frozen=True)
class Finding:
    """One secret-shaped string: the rule that saw it, its 1-based line and its span in the text."""

    rule: str
    line: int
    start: int
    end: int


def is_secret_file(path: str) -> bool:
    """True when any part of `path` matches a secret file pattern (case-insensitive)."""
    parts = PurePosixPath(path).parts
    return any(fnmatch.fnmatch(part.lower(), pattern) for part in parts for pattern in SECRET_FILES)


def entropy_bits(text: str) -> float:
    """Shannon entropy per character of `text`, in bits."""
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values()) if text else 0.0


def _is_secret_value(match: re.Match, flag: bool) -> bool:
    """Whether an assignment's value is a literal secret (see the module docstring)."""
    quoted = match["dq"] if match["dq"] is not None else match["sq"]
    value = quoted if quoted is not None else match["bare"]
    if len(value) < 4 or PLACEHOLDER.match(value) or value.startswith(("/", "~/", "./", "../")):
        return False
    if quoted is None and not flag:
        # code reads a name, calls or indexes (`token = self_tok`, `os.environ["PW"]`); only an
        # .env-style upper-case KEY=value takes a bare word as a literal
        env_style = match["key"].isupper() and "=" in match["sep"] and re.fullmatch(r"\w+", value)
        if CODE.fullmatch(value) and not env_style:
            return False
    if re.fullmatch(_PASSWORD_NAMES, match["name"], re.I):
        return True
    # token- and key-like names: only a value that looks random
    return len(value) >= 16 and entropy_bits(value) >= 3.0 and bool(re.search(r"\d", value))


def _screened_lines(text: str) -> list[tuple[int, int]]:
    """(start, end) of each line that holds a SCREEN word, in order (str.find: fast on megabytes)."""
    lower, starts = text.translate(ASCII_LOWER), set()  # same length as text, whatever it holds
    for word in SCREEN:
        at = lower.find(word)
        while at >= 0:
            starts.add(lower.rfind("\n", 0, at) + 1)
            eol = lower.find("\n", at)
            at = lower.find(word, eol + 1) if eol >= 0 else -1
    ends = [lower.find("\n", start) for start in sorted(starts)]
    return [(start, end if end >= 0 else len(text)) for start, end in zip(sorted(starts), ends)]


def _spans(text: str) -> list[tuple[str, int, int]]:
    found = [("private-key", m.start(), m.end()) for m in PRIVATE_KEY.finditer(text)] if "PRIVATE KEY" in text else []
    for start, end in _screened_lines(text):
        found += [(rule, start + a, start + b) for rule, a, b in _line_spans(text[start:end])]
    return found


def _line_spans(text: str) -> list[tuple[str, int, int]]:
    found = [(rule, m.start(), m.end()) for rule, pattern in TOKEN_RULES for m in pattern.finditer(text)]
    for m in URL_PASSWORD.finditer(text):
        secret = m["secret"]
        if not PLACEHOLDER.match(secret) and not re.fullmatch(r"\d+(?:/.*)?", secret):  # host:8080/x@y is a port
            found.append(("url-password", m.start("secret"), m.end("secret")))
    for m in URL_TOKEN.finditer(text):
        if entropy_bits(m["secret"]) >= 3.0 and re.search(r"\d", m["secret"]):
            found.append(("url-token", m.start("secret"), m.end("secret")))
    for pattern, flag in ((ASSIGN, False), (FLAG, True)):
        for m in pattern.finditer(text):
            if _is_secret_value(m, flag):
                group = next(g for g in ("dq", "sq", "bare") if m[g] is not None)
                found.append((f"{'flag' if flag else 'assignment'}:{m['key']}", m.start(group), m.end(group)))
    return found


def find(text: str) -> list[Finding]:
    """Every secret in `text`, in order, overlapping ones merged into the first."""
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    merged: list[Finding] = []
    for rule, start, end in sorted(_spans(text), key=lambda s: (s[1], -s[2])):
        if merged and start < merged[-1].end:
            last = merged[-1]
            merged[-1] = Finding(last.rule, last.line, last.start, max(last.end, end))
            continue
        merged.append(Finding(rule, bisect.bisect_right(starts, start), start, end))
    return merged


def redact(text: str) -> tuple[str, int]:
    """`text` with every secret masked, and the number of secrets (for texts that are only read)."""
    found = find(text)
    for f in reversed(found):
        text = text[: f.start] + MASK + text[f.end :]
    return text, len(found)


SECRET_KEY = re.compile(rf"(?:^|[._-])(?:{_NAMES})$", re.I)


def mask_params(tree: object) -> object:
    """Params (a nested dict, or a flat one with dotted keys) as the store may hold them: the value
    of every key whose name says secret, password, token or key is masked whole, and credentials
    inside any other string value are masked (`sweep.storage: postgresql://u:***@db/optuna`)."""
    if isinstance(tree, dict):
        secret = {k for k, v in tree.items() if SECRET_KEY.search(str(k)) and v not in ("", None)}
        return {k: MASK if k in secret else mask_params(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [mask_params(v) for v in tree]
    return redact(tree)[0] if isinstance(tree, str) else tree


def mask_uri(uri: str) -> str:
    """A URI with the password part of its credentials masked (for messages and tags)."""
    return redact(uri)[0]


@dataclass(frozen=True)
class DiffFinding:
    """A secret in a diff: the file and its line (in the new file; the old one for a removed line)."""

    path: str
    line: int
    rule: str

    def __str__(self) -> str:
        path = self.path.encode("unicode_escape").decode()  # a crafted name prints no terminal escapes
        return f"{path} line {self.line} ({self.rule})" if self.line else f"{path} ({self.rule})"


HUNK = re.compile(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def diff_findings(diff: str) -> list[DiffFinding]:
    """The secrets that a `git diff`'s text adds, each with its file and line; a file whose name
    marks a secret counts as one whatever it holds. Context and removed lines are in the commit
    already: only added lines are read."""
    added: list[str] = []
    where: list[tuple[str, int]] = []  # per added line: (file, line in the new file)
    path, line, paths = "?", 0, []
    for text in diff.split("\n"):
        if text.startswith("diff --git "):
            named = re.search(r' "?b/(.*?)"?$', text)
            path, line = (named[1] if named else text), 0
            paths.append(path)
        elif hunk := HUNK.match(text):
            line = int(hunk[1])
        elif line and text.startswith("+"):
            added.append(text[1:])
            where.append((path, line))
            line += 1
        elif line and text.startswith(" "):
            line += 1
    out = [DiffFinding(p, 0, "secret file name") for p in dict.fromkeys(paths) if is_secret_file(p)]
    out += [DiffFinding(*where[f.line - 1], f.rule) for f in find("\n".join(added))]
    return out
