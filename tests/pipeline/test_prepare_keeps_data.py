"""A `prepare` that refuses its input keeps the last good `data/prepared`, under `dvc repro` and
`dvc exp run` alike: DVC leaves the folder in place (`persist: true`), and prepare swaps in new data
only once its input was read to the end."""

import subprocess

import pytest

from helpers import copy_repo, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MISSING = "data/raw/missing.csv"


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_refused_input_leaves_the_last_good_prepared_data(tmp_path):
    # one good prepare, then each way of running a refused one: `dvc exp run -S`, then `dvc repro`
    # after an edit of params.yaml
    repo = copy_repo(tmp_path / "repo")
    run_cli("dvc", "repro", "prepare", cwd=repo, timeout=600)
    prepared = repo / "data/prepared"
    before = snapshot(prepared)
    assert "manifest.json" in before

    overrides = {"data.source": "file", "data.file.path": MISSING}
    for how in ("dvc exp run", "dvc repro"):
        if how == "dvc repro":
            subprocess.run(["git", "checkout", "--", "params.yaml"], cwd=repo, check=True)  # exp run's -S edit
            params = repo / "params.yaml"
            text = params.read_text().replace("  source: digits", "  source: file")
            params.write_text(text.replace('    path: ""', f"    path: {MISSING}"))
            proc = run_cli("dvc", "repro", "prepare", cwd=repo, check=False, timeout=600)
        else:
            args = [a for key, value in overrides.items() for a in ("-S", f"{key}={value}")]
            proc = run_cli("dvc", "exp", "run", *args, "prepare", cwd=repo, check=False, timeout=600)
        said = proc.stdout[-2000:] + proc.stderr[-2000:]
        assert proc.returncode != 0, f"{how}: {said}"
        assert f"data.file.path = '{MISSING}'" in proc.stdout + proc.stderr, f"{how}: {said}"
        assert snapshot(prepared) == before, how  # every file, byte for byte
        status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
        assert "params.yaml" in status, how  # the refused params are still there to fix; nothing else was lost
