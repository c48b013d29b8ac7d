"""`make ui` (`scalelab ui`) prints the address of the runs table, and that address opens it: the
training run is in the table at once, with no click (MLflow's home page is its GenAI view)."""

import re

import pytest

from helpers import BIN, run_cli, says_why, tiny_params, write_params
from services import free_port, serve

pytestmark = [pytest.mark.integration, pytest.mark.browser]

WAIT_MS = 90_000  # the first page load compiles a large bundle; slow on a busy 2-core machine


def test_the_printed_address_opens_the_training_runs_table(workdir, prepared_digits, browser, tmp_path):
    write_params(workdir / "params.yaml", tiny_params(train={"strategy": "single", "nproc_per_node": 1, "epochs": 1}))
    run_cli("train", "--data", str(prepared_digits), "--out", "results/train", cwd=workdir)
    port = free_port()
    cmd = [str(BIN / "scalelab"), "ui", "--params", str(workdir / "params.yaml"), "--port", str(port)]
    # a failure (a Playwright timeout too) ends with the `scalelab ui` server's log
    with serve(cmd, port, tmp_path / "ui.log") as ui, says_why(tmp_path / "ui.log"):
        printed = re.search(r"MLflow UI, experiment 'scalelab': (\S+)", (tmp_path / "ui.log").read_text())
        assert printed, (tmp_path / "ui.log").read_text()
        address = printed.group(1)
        import psutil  # the store's URI (a database password, for some) reaches MLflow by the environment

        argv = " ".join(psutil.Process(ui.proc.pid).cmdline())
        assert "mlflow.db" not in argv and "sqlite:" not in argv, argv
        assert address.startswith(f"{ui.url}/#/experiments/")
        assert address.endswith("/runs?workflowType=machine_learning")
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(WAIT_MS)
        try:
            page.goto(address)
            cell = page.locator("[role=gridcell][col-id='attributes.`Run Name`']", has_text="single-w1-fp32-seed0")
            cell.wait_for()  # the runs table, with the training run in it, and nothing clicked
            assert page.get_by_role("link", name="single-w1-fp32-seed0", exact=True).is_visible()
            page.screenshot(path=tmp_path / "runs-table.png")
        except Exception:
            page.screenshot(path=tmp_path / "failure.png")
            raise
        finally:
            page.close()
