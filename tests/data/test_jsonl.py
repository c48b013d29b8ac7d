"""data.source jsonl: each line's `data.jsonl.field` is one document, as byte tokens split by whole
document like data.source text; a file that is not UTF-8 is skipped and counted, a bad line is
named by file and line; and a jsonl corpus trains gpt through `dvc repro`."""

import json

import numpy as np
import pytest

from helpers import run_cli, tiny_params, training_pipeline
from scalelab.config import ConfigError, DataConfig, build, parse_params
from scalelab.data.prepare import prepare
from scalelab.data.split import split_sizes

SPLITS = ("train", "val", "test")


def write_corpus(folder, n=40, field="body"):
    """n records over two .jsonl files (with a blank line, an empty document and a decoy field), a
    Latin-1 .jsonl file and a .txt file the pattern leaves out; returns the documents' bytes."""
    folder.mkdir(parents=True)
    docs, lines = [], {"a.jsonl": [], "b.jsonl": []}
    for i in range(n):
        body = f"record {i}: caf\u00e9 \u2713 " + "word " * (i % 7 + 1)
        lines["a.jsonl" if i % 2 else "b.jsonl"].append(json.dumps({"id": i, field: body, "title": "decoy"}))
        docs.append(body.encode())
    lines["a.jsonl"] += ["", json.dumps({field: ""})]  # no documents
    for name, rows in lines.items():
        (folder / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    (folder / "latin1.jsonl").write_bytes('{"body": "caf\u00e9"}\n'.encode("latin-1"))
    (folder / "notes.txt").write_text('{"body": "never read"}\n')
    return docs


def jsonl_cfg(path, **section):
    return build(DataConfig, {"source": "jsonl", "jsonl": {"path": str(path), "field": "body", **section}})


def documents(out, manifest):
    got = {}
    for s in SPLITS:
        tokens = np.load(out / f"{s}.tokens.npy").tobytes()
        starts = np.load(out / f"{s}.doc_starts.npy").tolist() + [len(tokens)]
        got[s] = [tokens[a:b] for a, b in zip(starts, starts[1:])]
        assert manifest["splits"][s]["num_tokens"] == len(tokens)
    return got


def test_each_lines_field_is_one_whole_document_split_by_document(tmp_path):
    docs = write_corpus(tmp_path / "src")
    manifest = prepare(jsonl_cfg(tmp_path / "src"), tmp_path / "out", seq_len=4)
    got = documents(tmp_path / "out", manifest)
    assert sorted(d for s in SPLITS for d in got[s]) == sorted(docs)  # the field only, each record once, whole
    assert {s: len(got[s]) for s in SPLITS} == split_sizes(40, 0.1, 0.2)
    assert manifest["source"] == "jsonl" and manifest["kind"] == "tokens" and manifest["vocab_size"] == 256
    assert manifest["skipped"]["not_utf8"] == 1 and manifest["skipped"]["examples"][0].endswith("latin1.jsonl")


def test_a_bad_line_or_a_missing_field_is_named_by_file_and_line(tmp_path):
    write_corpus(tmp_path / "src")
    with pytest.raises(ConfigError, match=r"a.jsonl:1: data.jsonl.field = 'text' is not a string field"):
        prepare(jsonl_cfg(tmp_path / "src", field="text"), tmp_path / "out", seq_len=4)
    (tmp_path / "src/c.jsonl").write_text('{"body": "fine"}\n{"body": \n')
    with pytest.raises(ConfigError, match=r"c.jsonl:2: not a JSON line"):
        prepare(jsonl_cfg(tmp_path / "src"), tmp_path / "out", seq_len=4)
    assert not (tmp_path / "out").exists()  # bad input leaves no prepared data
    with pytest.raises(ConfigError, match=r"data.jsonl.field = '' is not allowed: name the string field"):
        parse_params(tiny_params(data={"source": "jsonl", "jsonl": {"field": ""}}), "params.yaml")


@pytest.mark.slow
@pytest.mark.integration  # dvc repro of validate, prepare, train (gpt) and evaluate in a copy of the repo
def test_a_jsonl_corpus_trains_gpt_through_dvc_repro(repo_copy):
    write_corpus(repo_copy / "data/raw/records", n=60)
    gpt = {"vocab_size": 256, "seq_len": 16, "d_model": 16, "layers": 1, "heads": 2}
    params = tiny_params(
        data={"source": "jsonl", "jsonl": {"path": "data/raw/records", "field": "body"}},
        train={"workload": "gpt", "model": gpt, "strategy": "single", "nproc_per_node": 1, "batch_size": 8},
        tracking={"system_metrics_interval_s": 0},
    )
    training_pipeline(repo_copy, params, commit=True)
    run_cli("dvc", "repro", cwd=repo_copy, timeout=900)
    manifest = json.loads((repo_copy / "data/prepared/manifest.json").read_text())
    assert manifest["source"] == "jsonl" and manifest["params"]["jsonl"]["field"] == "body"
    assert sum(manifest["splits"][s]["num_documents"] for s in SPLITS) == 60
    metrics = json.loads((repo_copy / "results/eval/metrics.json").read_text())
    assert {"test_loss", "perplexity", "bits_per_byte"} <= set(metrics)
    assert metrics["bits_per_byte"] < 8.0  # better than a uniform guess over 256 bytes
