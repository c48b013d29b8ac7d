"""What `scalelab reproduce` checks before it runs anything the store says.

- The recorded `git.commit` is a 40-hex id of a commit that exists in the local repository
  (`check_commit`); it reaches git after `--end-of-options`, so it can never be an option. A commit
  that no trusted ref holds (`trusted_refs`: origin's default branch and tags, or this repository's
  own branches and tags when it has no origin; `git config --add scalelab.trustedRef REF` sets
  others) is shown (`git log --stat`) and needs the same consent as code: a dangling commit, a
  stash or a fetched fork's branch never runs unasked.
- Every recorded diff has the sha256 that training recorded in `provenance.<name>.sha256`
  (`verify_diff`): a changed, missing or unhashed diff is refused.
- A diff is read header by header (`parse_diff`): one that creates a symlink or a gitlink, changes
  a file's mode, modifies an existing symlink, or names a path outside the worktree (absolute,
  `..`, `.git`) is refused, naming the file. Anything the reader does not understand is refused
  too, and git's own reading of the files (`git apply --numstat`) must name the same paths.
- `summary` is what gets printed before anything is applied (non-printable characters escaped);
  `confirm` needs `--yes` (or a "y" on a terminal) when a diff changes code: every file but a
  short allowlist of data and documentation (`NOT_CODE`), and any file Python could import (.py,
  .so, .pth, ...) anywhere in the worktree, which is on PYTHONPATH. Cluster profiles are code (their
  `setup:` lines run in the job script).
- `write_file` writes params.yaml without following a symlink in the worktree.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

HEX40 = re.compile(r"[0-9a-f]{40}")
REGULAR_MODES = ("100644", "100755")
CODE_SUFFIXES = (".py", ".pyc", ".pyd", ".so", ".pth")
# what a changed file may be without counting as code: params (reproduce writes its own params.yaml),
# DVC's record, documentation and raw data; everything else can change what runs
NOT_CODE = ("params.yaml", "dvc.lock", "*.md", "*.rst", "*.txt", "docs/*", "data/raw/*", "results/*")
HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
QUOTED = {"a": "\a", "b": "\b", "t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}
BASE85_LINE = re.compile(r"(literal|delta) \d+|[A-Za-z][0-9A-Za-z!#$%&()*+;<=>?@^_`{|}~-]*")
HEADER_OK = ("similarity index ", "dissimilarity index ", "deleted file mode ")


class CannotReproduce(RuntimeError):
    """The run lacks what reproducing needs, a check refused it, or a step (git, training) failed."""

    exit_status = 2  # the CLI's "cannot be reproduced"


@dataclass(frozen=True)
class FileChange:
    """One file a diff touches: its path (the new one for a rename), line counts and kind."""

    path: str
    added: int
    removed: int
    kind: str  # "new", "deleted", "modified", "renamed", "copied"
    binary: bool = False
    old_path: str | None = None


def check_commit(root: Path, commit: str) -> str:
    """The recorded commit, when it is a 40-hex id of a commit in `root`'s repository."""
    if not HEX40.fullmatch(commit):
        raise CannotReproduce(f"git.commit = {commit!r} is not allowed: must be a 40-hex commit id")
    proc = subprocess.run(
        ["git", "cat-file", "-e", "--end-of-options", f"{commit}^{{commit}}"], cwd=root, capture_output=True
    )
    if proc.returncode != 0:
        raise CannotReproduce(
            f"git.commit = {commit} is not a commit in the repository at {root}: "
            "update the branch that holds it (git pull) and rerun"
        )
    return commit


def _git_out(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, errors="replace")
    return proc.stdout if proc.returncode == 0 else ""


def trusted_refs(root: Path) -> list[str]:
    """The refs whose commits run without asking: `scalelab.trustedRef` (git config) when set, else
    origin's default branch and the tags, or this repository's own branches and tags without origin."""
    configured = _git_out(root, "config", "--get-all", "scalelab.trustedRef").split()
    if configured:
        return configured
    if "origin" not in _git_out(root, "remote").split():
        return ["refs/heads", "refs/tags"]
    head = _git_out(root, "symbolic-ref", "-q", "refs/remotes/origin/HEAD").strip()
    return [head or "refs/remotes/origin/main", *([] if head else ["refs/remotes/origin/master"]), "refs/tags"]


def untrusted_commit(root: Path, commit: str, max_lines: int = 200) -> str | None:
    """None when a trusted ref holds `commit`; else what it adds to HEAD (`git log --stat`, escaped)."""
    holders = _git_out(root, "for-each-ref", "--format=%(refname)", f"--contains={commit}", *trusted_refs(root))
    if holders.strip():
        return None
    log = _git_out(root, "log", "--stat", "--no-color", "--end-of-options", f"HEAD..{commit}").splitlines()
    shown = [printable(line) for line in log[:max_lines]]
    if len(log) > max_lines:
        shown.append(f"... {len(log) - max_lines} more lines")
    return "\n".join(shown) or f"(commit {commit} adds nothing to HEAD)"


def printable(text: str) -> str:
    """`text` with every non-printable character escaped (a file name cannot move the cursor)."""
    return "".join(ch if ch.isprintable() or ch == "\t" else ch.encode("unicode_escape").decode() for ch in text)


def verify_diff(tags: dict[str, str], name: str, path: Path | None) -> bytes | None:
    """The diff's bytes when they have the sha256 recorded at training time; None for no diff."""
    tag, omitted = f"provenance.{name}.sha256", tags.get(f"provenance.{name}.omitted_bytes")
    if withheld := tags.get(f"provenance.{name}.withheld"):
        raise CannotReproduce(f"provenance/{name} was not stored ({withheld}): its code cannot be rebuilt")
    if omitted is not None:
        raise CannotReproduce(
            f"provenance/{name} was left out of the store ({omitted} bytes): its code cannot be rebuilt"
        )
    if path is None:
        if tag in tags:
            raise CannotReproduce(f"provenance/{name} is missing from the run, but {tag} records one")
        return None
    if tag not in tags:
        raise CannotReproduce(f"provenance/{name} has no recorded sha256 ({tag}): it cannot be verified")
    blob = path.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != tags[tag]:
        raise CannotReproduce(
            f"provenance/{name} has sha256 {digest}, but {tag} = {tags[tag]}: the stored diff was changed"
        )
    return blob


def _unquote(text: str, name: str) -> str:
    """A path as git writes it: plain, or C-quoted ("a/x\\ty", octal escapes for bytes)."""
    if not text.startswith('"'):
        return text
    if len(text) < 2 or not text.endswith('"'):
        raise CannotReproduce(f"{name}: bad quoted path {text!r}: refused")
    out, raw, i = bytearray(), text[1:-1], 0
    while i < len(raw):
        ch = raw[i]
        if ch != "\\":
            out += ch.encode("utf-8", "surrogateescape")
            i += 1
        elif raw[i + 1 : i + 2] in QUOTED:
            out += QUOTED[raw[i + 1]].encode()
            i += 2
        elif re.fullmatch(r"[0-7]{3}", raw[i + 1 : i + 4]):
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            raise CannotReproduce(f"{name}: bad escape in quoted path {text!r}: refused")
    return out.decode("utf-8", "surrogateescape")


def _side(token: str, prefix: str, name: str) -> str | None:
    """`a/<path>` or `b/<path>` (or /dev/null: None) as a checked worktree-relative path."""
    path = _unquote(token.split("\t")[0] if not token.startswith('"') else token.removesuffix("\t"), name)
    if path == "/dev/null":
        return None
    if not path.startswith(prefix):
        raise CannotReproduce(f"{name}: {path!r} is not allowed: a path must start with {prefix}")
    return safe_relative(path[len(prefix) :], name)


def safe_relative(path: str, name: str) -> str:
    """`path` when it stays inside the worktree: relative, no `..`, `.` or `.git` part, no NUL."""
    parts = re.split(r"[/\\]", path)
    if not path or path.startswith(("/", "\\")) or "\0" in path:
        raise CannotReproduce(f"{name}: {path!r} is outside the worktree: paths must be relative")
    if any(p in ("", ".", "..") or p.lower() == ".git" for p in parts):
        raise CannotReproduce(f"{name}: {path!r} is outside the worktree: no '..', '.' or '.git' parts are allowed")
    return path


def _git_line_paths(rest: str, name: str) -> tuple[str, str] | None:
    """Both paths of a `diff --git a/P b/Q` line when they can be read unambiguously."""
    if rest.startswith('"'):
        m = re.fullmatch(r'("(?:[^"\\]|\\.)*") ("(?:[^"\\]|\\.)*"|b/.*)', rest)
        return (_side(m[1], "a/", name), _side(m[2], "b/", name)) if m else None
    n = (len(rest) - 5) // 2
    if rest == f"a/{rest[2 : 2 + n]} b/{rest[2 : 2 + n]}":
        return _side(rest[: 2 + n], "a/", name), _side(rest[3 + n :], "b/", name)
    return None


def parse_diff(blob: bytes, name: str) -> list[FileChange]:
    """Every file in a `git diff` patch, refusing anything that could reach outside the worktree."""
    lines = blob.decode("utf-8", "surrogateescape").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    changes: list[FileChange] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("diff --git "):
            raise CannotReproduce(f"{name}: line {i + 1} is not allowed here: {line[:80]!r} (expected 'diff --git')")
        i, change = _parse_file(lines, i, name)
        changes.append(change)
    return changes


def _parse_file(lines: list[str], i: int, name: str) -> tuple[int, FileChange]:
    """One `diff --git` block from line i: its header, then hunks or a binary patch."""
    paths = _git_line_paths(lines[i][len("diff --git ") :], name)
    old, new = paths if paths else (None, None)
    kind, binary, added, removed, moved = "modified", False, 0, 0, None
    i += 1
    shown = new or old or lines[i - 1][len("diff --git ") :]
    while i < len(lines) and not lines[i].startswith(("diff --git ", "@@ ", "GIT binary patch")):
        line = lines[i]
        if line.startswith(("old mode ", "new mode ")):
            raise CannotReproduce(f"{name}: {shown} changes its file mode ({line}): mode changes are refused")
        elif line.startswith("new file mode "):
            mode = line.split()[-1]
            if mode == "120000":
                raise CannotReproduce(f"{name}: {shown} would be created as a symlink (mode 120000): refused")
            if mode not in REGULAR_MODES:
                raise CannotReproduce(f"{name}: {shown} would be created with mode {mode}: only 100644 or 100755")
            kind = "new"
        elif line.startswith("index "):
            mode = line.split()[-1] if len(line.split()) == 3 else None
            if mode is not None and mode not in REGULAR_MODES:
                what = "a symlink" if mode == "120000" else f"mode {mode}"
                raise CannotReproduce(f"{name}: {shown} is {what}: a diff may change regular files only")
        elif line.startswith(("--- ", "+++ ")):
            side = _side(line[4:], "a/" if line[0] == "-" else "b/", name)
            old, new = (side, new) if line[0] == "-" else (old, side)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            verb, direction, token = line.split(" ", 2)
            side = safe_relative(_unquote(token, name), name)
            old, new = (side, new) if direction == "from" else (old, side)
            moved = "renamed" if verb == "rename" else "copied"
        elif line.startswith("deleted file mode "):
            kind = "deleted"
        elif line.startswith("Binary files "):
            binary = True
        elif not line.startswith(HEADER_OK):
            raise CannotReproduce(f"{name}: line {i + 1} of {shown} is not allowed: {line[:80]!r}")
        i += 1
    if old is None and new is None:
        raise CannotReproduce(f"{name}: cannot read the file names of {shown!r}: refused")
    while i < len(lines) and lines[i].startswith("@@ "):
        i, plus, minus = _hunk(lines, i, name, new or old)
        added, removed = added + plus, removed + minus
    if i < len(lines) and lines[i].startswith("GIT binary patch"):
        binary, i = True, i + 1
        while i < len(lines) and not lines[i].startswith("diff --git "):
            if lines[i] and not BASE85_LINE.fullmatch(lines[i]):
                raise CannotReproduce(f"{name}: line {i + 1} of {new or old}'s binary patch is not allowed")
            i += 1
    elif i < len(lines) and not lines[i].startswith("diff --git "):
        raise CannotReproduce(f"{name}: line {i + 1} of {new or old} is not allowed: {lines[i][:80]!r}")
    path = new or old
    kind = moved if moved and old and new else kind
    return i, FileChange(path, added, removed, kind, binary, old if old != path else None)


def _hunk(lines: list[str], i: int, name: str, path: str) -> tuple[int, int, int]:
    """One `@@ -a,b +c,d @@` hunk from line i: (next line, lines added, lines removed)."""
    m = HUNK.match(lines[i])
    if not m:
        raise CannotReproduce(f"{name}: line {i + 1} of {path} is not a hunk header: {lines[i][:80]!r}")
    old_left, new_left = int(m[1] or 1), int(m[2] or 1)
    added = removed = 0
    i += 1
    while (old_left > 0 or new_left > 0) and i < len(lines):
        head = lines[i][:1]
        if head in (" ", ""):
            old_left, new_left = old_left - 1, new_left - 1
        elif head == "-":
            old_left, removed = old_left - 1, removed + 1
        elif head == "+":
            new_left, added = new_left - 1, added + 1
        elif head != "\\":
            raise CannotReproduce(f"{name}: line {i + 1} of {path}'s hunk is not allowed: {lines[i][:80]!r}")
        i += 1
    while i < len(lines) and lines[i].startswith("\\"):  # "\ No newline at end of file"
        i += 1
    if old_left or new_left:
        raise CannotReproduce(f"{name}: a hunk of {path} ends early: the diff is truncated")
    return i, added, removed


def git_paths(root: Path, patch: Path) -> set[str]:
    """The paths git itself reads from `patch` (`git apply --numstat -z`, which applies nothing)."""
    proc = subprocess.run(
        ["git", "apply", "--numstat", "-z", "--end-of-options", str(patch)], cwd=root, capture_output=True
    )
    if proc.returncode != 0:
        raise CannotReproduce(f"git apply cannot read {patch.name}: {proc.stderr.decode(errors='replace').strip()}")
    fields = proc.stdout.decode("utf-8", "surrogateescape").split("\0")
    paths, i = set(), 0
    while i < len(fields) and fields[i]:
        counts = fields[i].split("\t")
        if len(counts) == 3 and counts[2]:  # "added\tremoved\tpath"
            paths.add(counts[2])
            i += 1
        else:  # a rename or copy: "added\tremoved\t", then the old and the new path
            paths |= {fields[i + 1], fields[i + 2]}
            i += 3
    return paths


def check_patch(root: Path, patch: Path, changes: list[FileChange], worktree: Path | None = None) -> None:
    """git reads the same files as `parse_diff`, and none of them lies beyond a symlink in `worktree`."""
    ours, theirs = {c.path for c in changes}, git_paths(root, patch)  # git names a rename by its new path
    if ours != theirs:
        raise CannotReproduce(f"{patch.name}: git reads other files ({sorted(theirs ^ ours)}) than the check: refused")
    touched = ours | {c.old_path for c in changes if c.old_path}
    for path in sorted(touched) if worktree is not None else ():
        _no_symlink(worktree, path, patch.name)


def _no_symlink(worktree: Path, rel: str, name: str) -> None:
    """Refuses `rel` when it or a folder above it inside `worktree` is a symlink."""
    here = worktree
    for part in PurePosixPath(rel).parts:
        here = here / part
        if here.is_symlink():
            link = here.relative_to(worktree)
            raise CannotReproduce(f"{name}: {rel} is or goes through a symlink in the worktree ({link}): refused")


def is_code(path: str) -> bool:
    """Whether a changed file can change what runs: anything importable, and every file that is not
    on the NOT_CODE allowlist of data and documentation (cluster profiles and dvc.yaml included)."""
    return path.endswith(CODE_SUFFIXES) or not any(fnmatch.fnmatchcase(path, pattern) for pattern in NOT_CODE)


def summary(name: str, changes: list[FileChange]) -> str:
    """What applying one diff will do, one line per file with its +/- line counts."""
    added, removed = sum(c.added for c in changes), sum(c.removed for c in changes)
    lines = [f"{name}: {len(changes)} file(s), +{added} -{removed} lines (sha256 verified)"]
    for c in changes:
        counts = "binary" if c.binary else f"+{c.added} -{c.removed}"
        moved = f" (from {printable(c.old_path)})" if c.old_path else ""
        code = "  (code)" if is_code(c.path) or (c.old_path and is_code(c.old_path)) else ""
        lines.append(f"  {c.kind:<8} {printable(c.path)}{moved}  {counts}{code}")
    return "\n".join(lines)


def confirm(
    changes: list[FileChange],
    yes: bool,
    interactive: bool,
    ask: Callable[[str], str] = input,
    *,
    commit: str | None = None,
    kept: Path | None = None,
) -> None:
    """Needs `--yes`, or "y" on a terminal, before code changed by a recorded diff runs, or the code
    of a `commit` that no trusted ref holds; `kept` names the folder where the diffs stay to read."""
    code = sorted({printable(p) for c in changes for p in (c.path, c.old_path) if p and is_code(p)})
    why = []
    if code:
        more = f" and {len(code) - 5} more" if len(code) > 5 else ""
        why.append(f"the recorded diffs change code ({', '.join(code[:5])}{more})")
    if commit:
        why.append(f"the commit {commit[:12]} is on no trusted branch or tag (its log is above)")
    if not why or yes:
        return
    reason = " and ".join(why)
    if interactive and ask(f"{reason}; apply and run it? [y/N] ").strip().lower() in ("y", "yes"):
        return
    where = f" (the diffs are in {kept})" if kept is not None else ""
    raise CannotReproduce(f"{reason}: read them, then pass --yes to run them{where}")


def write_file(worktree: Path, rel: str, text: str) -> None:
    """Writes `worktree/rel`, refusing when it or a folder above it is a symlink (never follows one)."""
    _no_symlink(worktree, rel, rel)
    fd = os.open(worktree / rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(text)
