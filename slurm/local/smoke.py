"""Smoke test for the local SLURM cluster (slurm/local/start.sh must be running).

Usage: SLURM_CONF=/tmp/scalelab-slurm/slurm.conf python slurm/local/smoke.py [FOLDER]
Checks: a 2-node gloo DDP job, a job array with one failing element, and a
USR2 preemption -> submitit checkpoint/requeue -> restart -> completion.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import submitit


def sacct_states(job_id: str) -> dict:
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", job_id], check=True, capture_output=True, text=True
    ).stdout
    return dict(line.split("|", 1) for line in out.split())


def wait_sacct(job_id: str, want: dict, timeout: float = 30) -> dict:
    """sacct lags slurmctld by a second or so: poll until it shows `want`."""
    end = time.time() + timeout
    while True:
        got = sacct_states(job_id)
        if all(got.get(k, "").startswith(v) for k, v in want.items()) or time.time() > end:
            return got
        time.sleep(0.5)


def ddp_allreduce():
    import torch
    import torch.distributed as dist

    env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    dist.init_process_group("gloo")
    t = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return env.rank, env.world_size, t.item(), os.environ["SLURMD_NODENAME"]


def maybe_fail(x):
    if x == 2:
        raise ValueError("element 2 fails on purpose")
    return x * x


class Preemptible:
    """Waits for a USR2 on its first run; submitit checkpoints and requeues it."""

    def __init__(self, folder):
        self.folder = Path(folder)

    def __call__(self):
        import torch.distributed as dist

        env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        dist.init_process_group("gloo")
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        (self.folder / f"running_{restarts}_{env.rank}").touch()
        if restarts == 0:
            time.sleep(240)  # interrupted by USR2 -> checkpoint() -> scontrol requeue
            raise RuntimeError("was not preempted")
        dist.barrier()
        dist.destroy_process_group()
        return env.rank, env.world_size, restarts

    def checkpoint(self, *args, **kwargs):
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def main():
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="slurm-smoke-"))
    ex = submitit.AutoExecutor(folder=folder / "%j")
    ex.update_parameters(nodes=2, tasks_per_node=1, cpus_per_task=1, slurm_partition="debug", timeout_min=5)

    # (b) 2-node DDP all_reduce
    t = time.time()
    job = ex.submit(ddp_allreduce)
    res = job.results()
    assert sorted(r[:3] for r in res) == [(0, 2, 3.0), (1, 2, 3.0)], res
    assert {r[3] for r in res} == {"n1", "n2"}, res
    states = wait_sacct(job.job_id, {job.job_id: "COMPLETED"})
    assert states[job.job_id] == "COMPLETED", states
    print(f"ddp ok in {time.time() - t:.1f}s: job {job.job_id} {res} sacct={states}")

    # (c) array of 4, at most 2 at a time, element 2 raises
    t = time.time()
    ex_arr = submitit.AutoExecutor(folder=folder / "%j")
    ex_arr.update_parameters(
        nodes=1, tasks_per_node=1, cpus_per_task=1, slurm_partition="debug", timeout_min=5, slurm_array_parallelism=2
    )
    jobs = ex_arr.map_array(maybe_fail, range(4))
    for i, j in enumerate(jobs):
        if i == 2:
            try:
                j.result()
                raise AssertionError("element 2 should have failed")
            except submitit.core.utils.FailedJobError as e:
                assert "element 2 fails on purpose" in str(e)
        else:
            assert j.result() == i * i
    array_id = jobs[0].job_id.split("_")[0]
    want = {f"{array_id}_{i}": ("FAILED" if i == 2 else "COMPLETED") for i in range(4)}
    states = wait_sacct(array_id, want)
    assert states == want, states
    print(f"array ok in {time.time() - t:.1f}s: sacct={states}")

    # (d) preemption: USR2 -> checkpoint -> requeue -> restart (SLURM_RESTART_COUNT=1)
    t = time.time()
    marks = folder / "preempt"
    marks.mkdir(exist_ok=True)
    # timeout_min >= 13: with shorter limits submitit treats *every* USR2 as a
    # timeout (guaranteed walltime = min(0.8*T, T-10min) < 0) and spends one of
    # its max_num_timeout requeues instead of counting a preemption.
    ex.update_parameters(timeout_min=30)
    job = ex.submit(Preemptible(marks))
    while not all((marks / f"running_0_{r}").exists() for r in (0, 1)):
        assert not job.done(), job.stderr()
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True)
    res = job.results()
    assert sorted(res) == [(0, 2, 1), (1, 2, 1)], res  # (rank, world, SLURM_RESTART_COUNT)
    assert "this job is preempted" in job.stderr(), job.stderr()
    states = wait_sacct(job.job_id, {job.job_id: "COMPLETED"})
    assert states[job.job_id] == "COMPLETED", states
    print(f"preemption ok in {time.time() - t:.1f}s: job {job.job_id} {res} sacct={states}")
    print("smoke: 3 passed, 0 failed")


if __name__ == "__main__":
    main()
