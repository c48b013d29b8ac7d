"""Fuzzed params.yaml files and -S strings: every case exits 2 with one line, and starts nothing.

Each generated params tree is the tiny valid one with at least one mutation that no field accepts
(an unknown key, a value of a type or sign no field takes), plus optional noise (deleted keys,
aliases, deep nesting, non-UTF-8 bytes). The CLI runs in this process, so 300+ cases take seconds.
"""

import copy
import io
import os
import tempfile
from contextlib import contextmanager, redirect_stderr
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import record_reliability, tiny_params
from scalelab.cli import main

BAD_VALUES = [{"zz": [1]}, [{"zz": 1}], -(10**30), -1e308, float("-inf"), [[[[[]]]]]]
CASES = {"params": [0, 0], "overrides": [0, 0], "search": [0, 0]}  # [clean one-line exits, cases]


def paths(tree, prefix=()):
    """Every (path) to a mapping value in the params tree."""
    for key, value in tree.items():
        yield (*prefix, key)
        if isinstance(value, dict) and key != "model":
            yield from paths(value, (*prefix, key))


@st.composite
def bad_params(draw):
    tree = tiny_params()
    # Noise first: sections left out take their defaults. Deleting a section after the mutations
    # could delete the only mutation (a bad `sweep` key, then no `sweep`): a valid file that trains.
    for section in draw(st.lists(st.sampled_from(["evaluate", "sweep"]), max_size=2)):
        tree.pop(section, None)
    all_paths = list(paths(tree))
    for _ in range(draw(st.integers(1, 3))):  # the mutations that make it invalid; none undoes another
        where = draw(st.sampled_from(all_paths))
        node = tree
        for part in where[:-1]:
            if not isinstance(node.get(part), dict):  # an earlier mutation put a list or scalar here
                node[part] = {}
            node = node[part]
        if draw(st.booleans()):
            node[where[-1]] = copy.deepcopy(draw(st.sampled_from(BAD_VALUES)))
        else:
            target = node if not isinstance(node.get(where[-1]), dict) else node[where[-1]]
            target[f"zz_{draw(st.text('abcxyz', min_size=1, max_size=6))}"] = 1
    text = yaml.safe_dump(tree, sort_keys=False)
    form = draw(st.sampled_from(["plain", "alias", "deep", "bytes", "scalar"]))
    if form == "alias":  # an anchor reused where it does not belong
        text = text.replace("tracking:", "tracking: &t", 1) + "evaluate: *t\n"
    elif form == "deep":
        text += "deep: " + "[" * draw(st.integers(50, 3000)) + "]" * 3 + "\n"
    elif form == "bytes":
        return text.encode() + draw(st.binary(min_size=1, max_size=8).map(lambda b: b"\xff\xfe" + b))
    elif form == "scalar":
        text = draw(st.sampled_from(["42\n", "- a\n- b\n", "~\n", "'just a string'\n"]))
    return text.encode()


@contextmanager
def fresh_folder():
    """A new empty folder per example (with the dvc.yaml marker that puts the MLflow store in it):
    whatever one example leaves behind, the next never sees it."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / "dvc.yaml").write_text("stages: {}\n")
        old = os.getcwd()
        os.chdir(folder)
        try:
            yield folder
        finally:
            os.chdir(old)


def run(args):
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(args)
    return code, err.getvalue()


def assert_one_clean_line(code, err, workdir, kind):
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("20")]  # minus log records
    assert code == 2 and len(lines) == 1 and lines[0].startswith("scalelab "), (code, err)
    assert "Traceback" not in err
    assert (
        not (workdir / "mlflow.db").exists() and not (workdir / "results").exists() and not (workdir / "out").exists()
    )
    CASES[kind][0] += 1


@pytest.mark.slow  # hundreds of cases: `make test`
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(blob=bad_params())
def test_fuzzed_params_exit_2_with_one_line(workdir, prepared_digits, blob):
    with fresh_folder() as folder:
        (folder / "params.yaml").write_bytes(blob)
        CASES["params"][1] += 1
        code, err = run(["train", "--params", "params.yaml", "--data", str(prepared_digits), "--out", "out"])
        assert_one_clean_line(code, err, folder, "params")


KEYS = [
    "train.lr",
    "train.epochs",
    "train.model.hidden",
    "train.strategy",
    "data.seed",
    "train.zz",
    "zz",
    "train.num_nodes",
    "tracking.enabled",
]
BAD_OVERRIDE_VALUES = ["-1", "[1,", "{a: [", "-1e308", "[64,64],[-1]", "'unclosed", "abc,def", "1e-3,{}", "", "[[", ":"]


@pytest.mark.slow  # hundreds of cases: `make test`
@settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(key=st.sampled_from(KEYS), value=st.sampled_from(BAD_OVERRIDE_VALUES), sep=st.sampled_from(["=", "", "=="]))
def test_fuzzed_overrides_exit_2_with_one_line(workdir, prepared_digits, key, value, sep):
    with fresh_folder() as folder:
        (folder / "params.yaml").write_text(yaml.safe_dump(tiny_params()))
        CASES["overrides"][1] += 1
        code, err = run(["sweep", "submit", "--name", "fz", "--data", str(prepared_digits), "-S", f"{key}{sep}{value}"])
        assert_one_clean_line(code, err, folder, "overrides")
        assert "-S" in err or key.split(".")[0] in err or "params.yaml" in err


# A search (--method tpe|random): the space syntax and the search options. Each case holds exactly
# one part that must be refused (drawn from BAD_SEARCH), the others valid (drawn from GOOD_SEARCH).
GOOD_SPECS = ["train.lr=loguniform(1e-4,1e-1)", "train.lr_warmup_steps=int(0,20)", "train.optimizer=adamw,sgd",
              "train.model.hidden=choice([16],[32,32])", "train.momentum=uniform(0,0.9)"]  # fmt: skip
BAD_SPECS = [
    "train.lr=loguniform(0,1)",  # a log scale from 0
    "train.lr=uniform(-1,1)",  # the schema refuses lr <= 0 at the low end
    "train.lr=uniform(0.1,0.01)",  # reversed bounds
    "train.epochs=int(0,3)",  # epochs >= 1
    "train.epochs=int(1.5,3)",  # not integers
    "train.batch_size=int(16,100000)",  # the high end is larger than the training split
    "train.model.hidden=choice([16],[-1])",  # one choice the model refuses
    "train.strategy=choice(single,nope)",
    "train.lr=gauss(0,1)",  # no such function
    "train.lr=loguniform(1e-4",  # not closed
    "train.lr=choice()",
    "train.num_nodes=int(1,2)",  # the job shape is fixed in a search
    "train.best_metric=val_loss,val_accuracy",  # the objective sets it
    "train.zz=uniform(0,1)",  # no such key
]
GOOD_OPTIONS = {"--method": "tpe", "--trials": "3", "--parallel": "2", "--objective": "val_loss:min",
                "--pruner": "median"}  # fmt: skip
BAD_OPTIONS = {
    "--method": ["bayes", "TPE", ""],
    "--trials": ["0", "-3"],
    "--parallel": ["0"],
    "--objective": ["val_loss", "val_loss:up", "val_nope:min", "train_loss:min", ":min"],
    "--pruner": ["asha", ""],
}


@st.composite
def bad_search(draw):
    specs = draw(st.lists(st.sampled_from(GOOD_SPECS), max_size=3, unique=True))
    options = dict(GOOD_OPTIONS)
    if draw(st.booleans()):
        specs.insert(draw(st.integers(0, len(specs))), draw(st.sampled_from(BAD_SPECS)))
    else:
        option = draw(st.sampled_from(sorted(BAD_OPTIONS)))
        options[option] = draw(st.sampled_from(BAD_OPTIONS[option]))
        specs = specs or [GOOD_SPECS[0]]
    if draw(st.booleans()):
        options["--method"] = options["--method"] if options["--method"] != "tpe" else "random"
    args = [arg for pair in options.items() for arg in pair]
    return args + [arg for spec in specs for arg in ("-S", spec)]


@pytest.mark.slow  # hundreds of cases: `make test`
@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(args=bad_search())
def test_fuzzed_searches_exit_2_with_one_line(workdir, prepared_digits, args):
    with fresh_folder() as folder:
        # a local launcher: a hole in the checks would train here (and fail the test), not hit SLURM
        (folder / "params.yaml").write_text(yaml.safe_dump(tiny_params(sweep={"launcher": "local"})))
        CASES["search"][1] += 1
        code, err = run(["sweep", "submit", "--name", "fz", "--data", str(prepared_digits), *args])
        assert_one_clean_line(code, err, folder, "search")


def test_a_valid_search_passes_the_checks_the_fuzz_relies_on(workdir, prepared_digits):
    """The fuzz's valid parts are valid: the plan of a search made only of them is accepted."""
    import argparse

    from scalelab.config import read_yaml
    from scalelab.sweeps.search import plan

    (workdir / "params.yaml").write_text(yaml.safe_dump(tiny_params(sweep={"launcher": "local"})))
    options = {"method": "tpe", "trials": 3, "parallel": 2, "objective": "val_loss:min", "pruner": "median"}
    args = argparse.Namespace(name="ok", params="params.yaml", data=str(prepared_digits), set=GOOD_SPECS, **options)
    search = plan(args, workdir / "results/sweeps/ok", read_yaml("params.yaml"), GOOD_SPECS)
    assert (search.trials, search.parallel, search.metric, search.mode) == (3, 2, "val_loss", "min")
    assert not (workdir / "results").exists() and not (workdir / "mlflow.db").exists()


def test_overrides_read_values_as_dvc_does():
    from scalelab.config.overrides import parse_overrides

    grid = parse_overrides(["train.lr=1e-3,3e-4", "train.model.hidden=[64,64],[128]", "train.seed=0"])
    assert grid == {"train.lr": [0.001, 0.0003], "train.model.hidden": [[64, 64], [128]], "train.seed": [0]}


@pytest.fixture(scope="module", autouse=True)
def write_fuzz_figures():
    yield
    # only the kinds this process ran: under pytest-xdist the two tests may run in two workers
    record_reliability(
        "fuzz",
        {f"{kind}_cases": n for kind, (_, n) in CASES.items() if n}
        | {f"{kind}_clean_one_line": ok for kind, (ok, n) in CASES.items() if n},
    )
