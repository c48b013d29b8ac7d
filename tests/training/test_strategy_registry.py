"""The strategy registry: the schema allows exactly the registered names, training's objects carry the
registered facts with their behaviour, and each registered strategy behaves as its facts say:
wrapped, its `no_sync` accumulates gradients without reducing them, its state goes out under the
plain model's names, a sharded one's state makes the round trip through its shards (DCP), and a
whole one's (with the strategy's own parts: a communication hook's state) resumes training bitwise.
The tests run every strategy in the registry; none of them lists the strategies."""

import copy
import os
import subprocess
import sys
import typing

import pytest
import torch
from torch import nn

from helpers import free_port
from scalelab.config import ConfigError, TrainConfig, build, strategies
from scalelab.config.schema import StrategyName
from scalelab.training import strategy

ONE_PROCESS = sorted(n for n, s in strategies.STRATEGIES.items() if not s.distributed)
DISTRIBUTED = sorted(n for n, s in strategies.STRATEGIES.items() if s.distributed)
NOT_SHARDED = sorted(n for n, s in strategies.STRATEGIES.items() if not s.sharded)


def test_the_schema_allows_exactly_the_registered_strategies():
    allowed = set(typing.get_args(StrategyName))
    assert allowed == set(strategies.STRATEGIES) == set(strategy.STRATEGIES)
    assert TrainConfig.__dataclass_fields__["strategy"].default in allowed
    assert ONE_PROCESS and DISTRIBUTED  # both kinds are run below


@pytest.mark.parametrize("name", sorted(strategies.STRATEGIES))
def test_each_strategy_states_its_processes_and_the_world_size_follows(name):
    s = strategies.get(name)
    assert s.name == name and s.label and s.wrapper
    assert s.processes(6) == (6 if s.distributed else 1)  # one process per device, or one for all
    assert TrainConfig(strategy=name, nproc_per_node=2, num_nodes=3).world_size == s.processes(6)
    assert not s.sharded or s.distributed  # shards live on ranks
    assert not s.distributed or s.parallel


@pytest.mark.parametrize("name", sorted(strategies.STRATEGIES))
def test_training_objects_extend_the_registered_facts_with_their_behaviour(name):
    obj = strategy.get(name)
    assert isinstance(obj, strategies.Strategy)
    facts = strategies.get(name)
    assert all(getattr(obj, f) == getattr(facts, f) for f in facts.__dataclass_fields__)


@pytest.mark.parametrize("name", NOT_SHARDED)
def test_only_a_sharded_strategy_takes_a_model_on_the_meta_device(name):
    with torch.device("meta"):
        on_meta = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=f"on the meta device needs strategy .*, not '{name}'"):
        strategy.get(name).wrap(on_meta, torch.device("cpu"))


def tiny() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def batch(rank: int, k: int) -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(100 * rank + k))


def plain_grads(model: nn.Module, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The gradients of a copy of the plain `model`, summed over `batches` (one backward each)."""
    ref = copy.deepcopy(model)
    for x in batches:
        ref(x).pow(2).sum().backward()
    return {n: p.grad for n, p in ref.named_parameters()}


@pytest.mark.parametrize("name", ONE_PROCESS)
def test_a_one_process_strategy_accumulates_under_no_sync_and_gives_the_plain_state(name):
    plain = tiny()
    s = strategy.get(name)
    model = s.wrap(copy.deepcopy(plain), torch.device("cpu"))  # no process group
    state = s.model_state(model)
    assert list(state) == list(plain.state_dict())  # the plain model's names, no wrapper prefix
    assert all(torch.equal(state[k], v) for k, v in plain.state_dict().items())
    with s.no_sync(model, sync=False):
        model(batch(0, 0)).pow(2).sum().backward()
    grads = {n: p.grad for n, p in s.unwrap(model).named_parameters()}
    assert all(torch.allclose(grads[n], g) for n, g in plain_grads(plain, [batch(0, 0)]).items())
    with s.no_sync(model, sync=True):
        model(batch(0, 1)).pow(2).sum().backward()
    grads = {n: p.grad for n, p in s.unwrap(model).named_parameters()}  # accumulated over both
    assert all(torch.allclose(grads[n], g) for n, g in plain_grads(plain, [batch(0, 0), batch(0, 1)]).items())


# One rank of a 2-process gloo group (argv: strategy, checkpoint folder); an AssertionError fails it
RANK = """
import copy, sys
import torch, torch.distributed as dist
from torch import nn
from scalelab.training import strategy
from scalelab.training.checkpoint import read_shards

name, folder = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
plain = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
s = strategy.get(name)
model = s.wrap(copy.deepcopy(plain), torch.device("cpu"), shard_units=lambda m: [m[0], m[2]])


def batch(r, k):
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(100 * r + k))


def plain_grads(batches):
    ref = copy.deepcopy(plain)
    for x in batches:
        ref(x).pow(2).sum().backward()
    return {n: p.grad for n, p in ref.named_parameters()}


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # a collective for a shard


def grads():
    return {n: full(p.grad) for n, p in s.unwrap(model).named_parameters()}


def close(a, b):
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def local(tree):  # a copy of this rank's part of a state
    if isinstance(tree, dict):
        return {k: local(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [local(v) for v in tree]
    if isinstance(tree, torch.Tensor):
        return (tree.to_local() if hasattr(tree, "to_local") else tree).detach().clone()
    return tree


def same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


# sharded: each rank holds a part of the parameters; else each holds them all
whole = sum(p.numel() * p.element_size() for p in plain.parameters())
held = strategy.local_bytes(model.parameters())
assert (held < whole) if s.sharded else (held == whole), (held, whole)
# the state goes out whole under the plain model's names (under fsdp gathered to rank 0 only)
state = s.model_state(model)
if rank == 0 or not s.sharded:
    assert list(state) == list(plain.state_dict()) and same(state, plain.state_dict())
else:
    assert state == {}

# a micro-step under no_sync: nothing is reduced; each rank's gradients are its own batch's
with s.no_sync(model, sync=False):
    model(batch(rank, 0)).pow(2).sum().backward()
mine = plain_grads([batch(rank, 0)])
averaged = {n: sum(plain_grads([batch(r, 0)])[n] for r in range(world)) / world for n in mine}
assert not close(mine, averaged)  # the ranks' batches differ: a reduction would show
if s.sharded:  # the unsharded gradients are kept for the last micro-step; no shard has one yet
    assert all(p.grad is None for p in model.parameters())
else:
    assert close(grads(), mine)
# the last micro-step syncs: the ranks' mean of the gradients accumulated over both micro-steps
with s.no_sync(model, sync=True):
    model(batch(rank, 1)).pow(2).sum().backward()
sums = [plain_grads([batch(r, 0), batch(r, 1)]) for r in range(world)]
assert close(grads(), {n: sum(g[n] for g in sums) / world for n in sums[0]})

if s.sharded:  # the sharded state's round trip: saved from the shards, changed, read back
    import torch.distributed.checkpoint as dcp

    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    opt.step()
    shards = s.sharded_state(model, opt)
    saved = local(shards)
    assert saved["optimizer"]["state"] and list(saved["model"]) == list(plain.state_dict())
    dcp.save(shards, checkpoint_id=folder)
    if rank == 0:  # what Checkpointer records at save: read_shards unpickles only a .metadata it matches
        import hashlib, pathlib
        meta = pathlib.Path(folder, ".metadata").read_bytes()
        pathlib.Path(folder, "metadata.sha256").write_text(hashlib.sha256(meta).hexdigest())
    dist.barrier()
    before = s.model_state(model)
    model(batch(rank, 2)).pow(2).sum().backward()
    opt.step()
    changed = s.model_state(model)
    assert rank != 0 or not same(changed, before)
    assert not same(local(s.sharded_state(model, opt)), saved)
    s.load_sharded_state(model, opt, lambda target: read_shards(folder, target))
    assert same(local(s.sharded_state(model, opt)), saved)  # this rank's shards, optimizer's too
    after = s.model_state(model)
    assert rank != 0 or (list(after) == list(before) and same(after, before))
else:  # the whole state's round trip, the strategy's own parts with it: a resumed run goes on bitwise
    import io

    def steps(model, opt, ks):
        for k in ks:
            opt.zero_grad()
            with s.no_sync(model, sync=True):
                model(batch(rank, k)).pow(2).sum().backward()
            opt.step()

    def fresh():
        model = s.wrap(copy.deepcopy(plain), torch.device("cpu"))
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    through, opt = fresh()
    steps(through, opt, range(8))  # uninterrupted
    first, opt = fresh()
    steps(first, opt, range(4))
    buf = io.BytesIO()  # what a checkpoint holds, read back as a resume reads it
    torch.save({**s.full_state(first, opt), "parts": {k: p.state_dict() for k, p in s.stateful(first).items()}}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed, opt = fresh()
    s.load_full_state(resumed, opt, saved)
    for k, part in s.stateful(resumed).items():
        part.load_state_dict(saved["parts"][k])
    steps(resumed, opt, range(4, 8))
    assert same(s.model_state(resumed), s.model_state(through))
    assert not same(s.model_state(resumed), s.model_state(first))
    if s.stateful(first):  # the strategy's own parts matter: a resume without them goes elsewhere
        forgot, opt = fresh()
        s.load_full_state(forgot, opt, saved)
        steps(forgot, opt, range(4, 8))
        assert not same(s.model_state(forgot), s.model_state(through))
dist.destroy_process_group()
print("rank", rank, "ok", flush=True)
"""


@pytest.mark.distributed
@pytest.mark.parametrize("name", DISTRIBUTED)
def test_a_distributed_strategy_reduces_only_outside_no_sync_and_keeps_its_state(tmp_path, name):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env.update(OMP_NUM_THREADS="1")
    logs = [tmp_path / f"rank{rank}.log" for rank in range(2)]
    procs = []
    for rank, log in enumerate(logs):
        with open(log, "w") as fh:
            cmd = [sys.executable, str(script), name, str(tmp_path / "shards")]
            rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=rank_env, stdout=fh, stderr=subprocess.STDOUT))
    try:
        for proc in procs:
            proc.wait(timeout=120)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    tails = "\n".join(f"{log.name}:\n{log.read_text()[-3000:]}" for log in logs)
    assert [proc.returncode for proc in procs] == [0, 0], tails
    assert [f"rank {rank} ok" in log.read_text() for rank, log in enumerate(logs)] == [True, True], tails


@pytest.mark.parametrize("get", [strategies.get, strategy.get], ids=["config", "training"])
def test_an_unknown_strategy_is_refused_naming_the_allowed_ones(get):
    with pytest.raises(ConfigError, match="^strategy = 'zero' is not allowed: expected one of ") as refused:
        get("zero")
    assert str(refused.value).endswith(" | ".join(repr(n) for n in strategies.STRATEGIES))


def test_params_refuse_an_unregistered_strategy_naming_the_registered_ones():
    with pytest.raises(ConfigError, match="^train.strategy = 'zero' is not allowed: expected one of ") as refused:
        build(TrainConfig, {"strategy": "zero"}, "train")
    assert all(repr(n) in str(refused.value) for n in strategies.STRATEGIES)
