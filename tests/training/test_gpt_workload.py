"""experiments/gpt.py: a causal decoder that learns its synthetic tokens, sharded per block, and
the speedup study's cell running on its token batches."""

import pytest
import torch

from scalelab.config import SpeedupConfig, build, load_params, to_dict
from scalelab.study import cell
from scalelab.training import workloads
from scalelab.training.loop import Optim, build_loop

TINY = {"vocab_size": 64, "seq_len": 16, "d_model": 32, "layers": 2, "heads": 2}


def gpt(**model):
    torch.manual_seed(0)
    return workloads.load("gpt", {**TINY, **model}, input_shape=[16], num_classes=64, key="speedup")


def test_changing_a_later_token_leaves_every_earlier_logit_alone():
    wl = gpt()
    wl.model.eval()
    x, _ = wl.synthetic_batch(3, generator=torch.Generator().manual_seed(1))
    changed = x.clone()
    changed[:, 9] = (changed[:, 9] + 1) % TINY["vocab_size"]
    with torch.no_grad():
        a, b = wl.model(x), wl.model(changed)
    assert a.shape == (3, 16, 64)
    torch.testing.assert_close(a[:, :9], b[:, :9], rtol=0, atol=1e-6)
    assert (a[:, 9:] - b[:, 9:]).abs().amax(dim=(0, 2)).min() > 1e-4  # it does see the past


def test_the_loss_falls_within_a_few_steps_on_the_synthetic_tokens():
    wl = gpt()
    loop = build_loop(
        wl, torch.device("cpu"), strategy_name="single", precision="fp32", optim=Optim(name="adamw", lr=3e-3)
    )
    gen = torch.Generator().manual_seed(2)
    batches = [wl.synthetic_batch(16, generator=gen) for _ in range(4)]
    losses = [float(loop.step([batches[i % 4]])) for i in range(30)]
    assert losses[0] > 4.0  # about ln(64) = 4.16 at the start
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses  # towards ln(4) = 1.39, the chain's entropy


def test_synthetic_batches_are_seeded_markov_walks_with_shifted_targets():
    wl = gpt(successors=3)
    x, y = wl.synthetic_batch(5, generator=torch.Generator().manual_seed(3))
    again, _ = wl.synthetic_batch(5, generator=torch.Generator().manual_seed(3))
    assert x.shape == y.shape == (5, 16) and x.dtype == torch.long and torch.equal(x, again)
    assert torch.equal(x[:, 1:], y[:, :-1])
    from experiments.gpt import transitions

    table = transitions(wl.config)
    assert all(int(y[r, i]) in table[int(x[r, i])].tolist() for r in range(5) for i in range(16))


def test_shard_units_are_the_transformer_blocks():
    wl = gpt(layers=3)
    units = wl.shard_units(wl.model)
    assert units == list(wl.model.blocks) and len(units) == 3


def test_the_speedup_cell_times_gpt_on_its_token_batches():
    cfg = build(
        SpeedupConfig,
        {"workload": "gpt", "model": TINY, "warmup_steps": 1, "timed_steps": 1, "repeats": 1, "device": "cpu"},
        "speedup",
    )
    spec = {"device": "cpu", "threads_per_process": 1, "config": to_dict(cfg), "strategy": "single"}
    got = cell.measure("steps", {**spec, "world_size": 1, "precision": "fp32", "compile": False, "batch_size": 4})
    assert got["global_batch"] == 4 and got["num_params"] == sum(p.numel() for p in gpt().model.parameters())


def test_speedup_workload_gpt_is_valid_params(tmp_path):
    from helpers import tiny_params, write_params

    params = tiny_params(speedup={"workload": "gpt", "model": TINY})
    assert load_params(write_params(tmp_path / "params.yaml", params)).speedup.workload == "gpt"


@pytest.mark.parametrize("seq", [17, 40])
def test_a_sequence_longer_than_seq_len_is_refused(seq):
    with pytest.raises(ValueError, match="longer than seq_len = 16"):
        gpt().model(torch.zeros(1, seq, dtype=torch.long))
