"""A failing wait says why: `helpers.wait_for` needs the log of what it waits on, and its failure
ends with that log's tail (issue 30: a CI failure that held none of the job's output)."""

import subprocess
import sys

import pytest

from helpers import log_of, newest_logs, once_more_if_heap_crash, output_tail, says_why, wait_for


def test_a_wait_without_a_log_is_refused():
    with pytest.raises(TypeError, match="log"):
        wait_for(lambda: True, 1, "something")  # no log= at all
    with pytest.raises(TypeError, match="needs a log"):
        wait_for(lambda: True, 1, "something", log=[])


def test_a_process_that_ends_first_fails_the_wait_with_the_end_of_its_output(tmp_path):
    log = tmp_path / "job.err"
    script = "import sys; print('x' * 10_000, file=sys.stderr); sys.exit('the real reason')"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", script], stderr=err)
    proc.wait()
    with pytest.raises(AssertionError) as failed:
        wait_for(lambda: False, 60, "a checkpoint", proc, log=log)
    message = str(failed.value)
    assert message.startswith(f"{proc.args[:3]} exited 1 before a checkpoint\n--- {log} (last 4000 characters) ---")
    assert message.endswith("the real reason\n") and len(message) < 4300, message[-300:]


def test_a_timed_out_wait_shows_every_source_and_says_which_it_could_not_read(tmp_path):
    (tmp_path / "a_log.err").write_text("rank 0: a traceback\n")
    lines = log_of("the lines so far", lambda: "step 10\n")
    sources = [lines, tmp_path / "missing.log", newest_logs(tmp_path, "*.err")]
    with pytest.raises(AssertionError) as failed:
        wait_for(lambda: None, 0.05, "the queue", log=sources)
    message = str(failed.value)
    assert message.startswith("timed out after 0.05 s waiting for the queue")
    assert "--- the lines so far (last 8 characters) ---\nstep 10" in message
    assert f"--- {tmp_path / 'missing.log'}: no such file ---" in message
    assert "rank 0: a traceback" in message


def test_a_log_that_cannot_be_read_does_not_hide_the_failure():
    def broken() -> str:
        raise OSError("gone")

    assert "(could not be read: OSError: gone)" in output_tail(broken)


def test_says_why_adds_the_tail_to_any_error(tmp_path):
    (tmp_path / "ui.log").write_text("Traceback: the server died\n")
    with pytest.raises(TimeoutError) as failed, says_why(tmp_path / "ui.log"):
        raise TimeoutError("Timeout 90000ms exceeded")  # as Playwright raises it
    assert "Traceback: the server died" in failed.value.__notes__[0]


def test_only_a_heap_corruption_abort_is_run_once_more():
    """A rank aborted by glibc's heap check (torch's profiler, tests/helpers.py) is rerun after
    `tidy`; any other failure is raised as it is, with nothing tidied or rerun."""
    calls, tidied = [], []

    def aborts_first():
        calls.append(1)
        if len(calls) == 1:
            raise AssertionError("rank 1 was killed by SIGABRT: malloc(): unsorted double linked list corrupted")
        return "trained"

    with pytest.warns(UserWarning, match="heap corruption"):
        assert once_more_if_heap_crash(aborts_first, lambda: tidied.append(1)) == "trained"
    assert len(calls) == 2 and tidied == [1]

    calls.clear()
    tidied.clear()

    def fails():
        calls.append(1)
        raise AssertionError("scalelab train exited 1: train.lr: -1 is not > 0")

    with pytest.raises(AssertionError, match="train.lr"):
        once_more_if_heap_crash(fails, lambda: tidied.append(1))
    assert len(calls) == 1 and tidied == []
