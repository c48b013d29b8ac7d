"""The MLflow UI in a real browser: headless Debian Chromium, driven by Playwright.

    .venv/bin/pytest -q tests/tracking/test_ui_browser.py

Screenshots land in the test's tmp folder; the last one is also copied to mlflow-ui.png in
helpers.shown_artifacts_dir() for people to look at (`make test`: results/test-artifacts/; a bare
pytest run: its temporary folder).
"""

import re
import shutil

import pytest
from mlflow import MlflowClient

from helpers import run_cli, says_why, shown_artifacts_dir, tiny_params, write_params
from services import mlflow_ui

pytestmark = [pytest.mark.integration, pytest.mark.browser]

# single-process training and a two-cell study (plus a skipped row): enough runs to look at, quickly
STUDY = {
    "model": {"hidden": [64], "dropout": 0.0},
    "num_features": 32,
    "batch_sizes": [64],
    "device": "cpu",
    "warmup_steps": 1,
    "timed_steps": 1,
    "repeats": 1,
    "world_sizes": [2],
    "strategies": ["single", "dp"],
}
TRAIN = {"strategy": "single", "nproc_per_node": 1}
WAIT_MS = 90_000  # the first page load compiles a large bundle; slow on a busy 2-core machine


def build_store(workdir, data_dir):
    """A training run and a study (parent + children) in workdir/mlflow.db; returns what to look for."""
    write_params(workdir / "params.yaml", tiny_params(train=TRAIN, speedup=STUDY))
    run_cli("train", "--params", "params.yaml", "--data", str(data_dir), "--out", "results/train", cwd=workdir)
    run_cli("speedup", "--params", "params.yaml", "--out", "results/speedup", cwd=workdir)
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("scalelab")
    [train] = client.search_runs([exp.experiment_id], "tags.`scalelab.kind` = 'train'")
    [study] = client.search_runs([exp.experiment_id], "tags.`scalelab.kind` = 'study'")
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{study.info.run_id}'")
    names = sorted(c.info.run_name for c in children)  # single-t<cores> too, where cores > 1
    assert train.info.run_name == "single-w1-fp32-seed0", train.info.run_name
    assert {"single-t1-seed0", "dp-w2-seed0 (skipped)"} <= set(names), names  # dp needs 2 GPUs
    return exp, train, study, names


def row(page, name):
    """The table row whose first cell reads exactly `name`."""
    return page.get_by_role("row").filter(has=page.get_by_text(name, exact=True)).first


def number_in(text):
    return float(re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text)[-1])


def close_assistant(page):
    """The assistant side panel hides a third of the page; close it when it is there."""
    close = page.get_by_role("button", name="Close")
    if close.count():
        close.first.click()


def test_ui_shows_experiment_training_run_and_study(workdir, prepared_digits, browser, tmp_path):
    exp, train, study, children = build_store(workdir, prepared_digits)
    shots = tmp_path / "screenshots"
    # a failure (a Playwright timeout too) ends with the UI server's log
    with mlflow_ui(f"sqlite:///{workdir / 'mlflow.db'}", tmp_path / "ui.log") as ui, says_why(tmp_path / "ui.log"):
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(WAIT_MS)
        try:
            page.goto(f"{ui.url}/#/experiments")
            page.get_by_role("link", name="scalelab", exact=True).first.wait_for()
            page.screenshot(path=shots / "1-experiments.png")

            # the training run's page: readable name, params and metrics with their stored values
            page.goto(
                f"{ui.url}/#/experiments/{exp.experiment_id}/runs/{train.info.run_id}?workflowType=machine_learning"
            )
            page.get_by_text(train.info.run_name, exact=True).first.wait_for()
            close_assistant(page)
            for key in ("train.lr", "train.strategy", "seed.rank.0"):
                assert row(page, key).inner_text().split() == [key, train.data.params[key]]
            for key in ("samples_per_s", "val_accuracy", "train_loss"):
                assert number_in(row(page, key).inner_text()) == pytest.approx(train.data.metrics[key], rel=1e-6)
            page.screenshot(path=shots / "2-training-run.png")

            # the runs table: the study's parent run, expanded to show its children
            page.goto(f"{ui.url}/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning")
            parent = page.locator("[role=gridcell][col-id='attributes.`Run Name`']", has_text=study.info.run_name)
            parent.wait_for()
            close_assistant(page)
            assert page.get_by_role("link", name=train.info.run_name, exact=True).is_visible()
            for name in children:  # nested runs stay hidden until their parent is expanded
                assert not page.get_by_role("link", name=name, exact=True).is_visible()
            parent.get_by_role("button").first.click()
            for name in children:
                page.get_by_role("link", name=name, exact=True).wait_for()
            page.screenshot(path=shots / "3-runs-with-study.png")

            # the study's artifacts open from the UI: the same endpoint its artifact viewer reads
            get = f"{ui.url}/get-artifact?run_uuid={study.info.run_id}&path="
            md = page.request.get(get + "speedup.md")
            assert md.ok and "| setup | training time (s) | speedup |" in md.text()
            assert page.request.get(get + "speedup.png").body()[:4] == b"\x89PNG"
        except Exception:
            page.screenshot(path=shots / "failure.png")
            raise
        finally:
            shown = shown_artifacts_dir()
            shown.mkdir(parents=True, exist_ok=True)
            last = max(shots.glob("*.png"), key=lambda p: p.stat().st_mtime, default=None)
            if last is not None:
                shutil.copy(last, shown / "mlflow-ui.png")
            page.close()
    assert (shown / "mlflow-ui.png").read_bytes()[:4] == b"\x89PNG"
