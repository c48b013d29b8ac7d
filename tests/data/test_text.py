"""data.source text: byte tokens, split by document (never a document cut across splits), seeded;
files that are not UTF-8, empty or hidden are left out and counted; a separator cuts documents."""

import numpy as np
import pytest

from scalelab.config import ConfigError, DataConfig, build
from scalelab.data import text
from scalelab.data.prepare import prepare
from scalelab.data.split import split_sizes

SPLITS = ("train", "val", "test")


def corpus(folder, n=40):
    """n UTF-8 files of different lengths (each unique), plus a Latin-1 file, an empty and a hidden one."""
    rng = np.random.default_rng(0)
    docs = {}
    for i in range(n):
        body = f"# document {i}: caf\u00e9 \u2713\n" + "x = 1\n" * int(rng.integers(1, 40))
        path = folder / f"pkg{i % 3}" / f"mod{i:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
        docs[path] = body.encode()
    (folder / "latin1.py").write_bytes("caf\u00e9 = 1\n".encode("latin-1"))
    (folder / "empty.py").write_bytes(b"")
    (folder / ".hidden").mkdir()
    (folder / ".hidden" / "secret.py").write_text("never read\n")
    return docs


def documents(out, manifest):
    """split -> the byte strings of its documents, cut at its recorded document starts."""
    got = {}
    for s in SPLITS:
        tokens = np.load(out / f"{s}.tokens.npy").tobytes()
        starts = np.load(out / f"{s}.doc_starts.npy").tolist() + [len(tokens)]
        got[s] = [tokens[a:b] for a, b in zip(starts, starts[1:])]
        assert manifest["splits"][s]["num_tokens"] == len(tokens) == manifest["splits"][s]["num_bytes"]
    return got


def text_cfg(path, **text_section):
    return build(DataConfig, {"source": "text", "text": {"path": str(path), **text_section}})


def test_the_split_is_by_whole_document_exact_and_seeded(tmp_path):
    docs = corpus(tmp_path / "src")
    manifest = prepare(text_cfg(tmp_path / "src"), tmp_path / "a", seq_len=4)
    got = documents(tmp_path / "a", manifest)
    assert sorted(d for s in SPLITS for d in got[s]) == sorted(docs.values())  # each file once, whole
    assert {s: len(got[s]) for s in SPLITS} == split_sizes(40, 0.1, 0.2)  # 28 / 4 / 8
    assert manifest["skipped"]["not_utf8"] == 1 and manifest["skipped"]["empty"] == 1
    assert manifest["vocab_size"] == 256 and manifest["kind"] == "tokens"
    assert np.load(tmp_path / "a/train.tokens.npy", mmap_mode="r").dtype == np.uint8

    again = prepare(text_cfg(tmp_path / "src"), tmp_path / "b", seq_len=4)
    assert again["splits"] == manifest["splits"]  # same seed: byte for byte
    reseeded = build(DataConfig, {"source": "text", "seed": 1, "text": {"path": str(tmp_path / "src")}})
    other = documents(tmp_path / "c", prepare(reseeded, tmp_path / "c", seq_len=4))
    assert set(other["test"]) != set(got["test"])


def test_a_pattern_picks_the_files_of_a_folder(tmp_path):
    docs = corpus(tmp_path / "src")
    manifest = prepare(text_cfg(tmp_path / "src", pattern="pkg1/*.py"), tmp_path / "out", seq_len=2)
    got = documents(tmp_path / "out", manifest)
    want = sorted(body for path, body in docs.items() if path.parent.name == "pkg1")
    assert sorted(d for s in SPLITS for d in got[s]) == want
    assert manifest["skipped"] == {"not_utf8": 0, "empty": 0, "examples": []}


@pytest.mark.parametrize("chunk_bytes", [3, 7, 1 << 20])
def test_a_separator_cuts_documents_also_across_read_blocks(tmp_path, monkeypatch, chunk_bytes):
    monkeypatch.setattr(text, "CHUNK_BYTES", chunk_bytes)
    pieces = ["\n".join([f"paragraph {i}"] * (i % 4 + 1)) for i in range(30)]
    (tmp_path / "book.txt").write_text("\n\n".join(pieces) + "\n\n\n")
    manifest = prepare(text_cfg(tmp_path / "book.txt", separator="\n\n"), tmp_path / "out", seq_len=2)
    got = documents(tmp_path / "out", manifest)
    want = [p.encode() + b"\n\n" for p in pieces] + [b"\n"]  # the last piece ends the file
    assert sorted(d for s in SPLITS for d in got[s]) == sorted(want)


def test_one_file_without_a_separator_is_refused_naming_the_fix(tmp_path):
    (tmp_path / "one.txt").write_text("a single document\n")
    with pytest.raises(ConfigError, match=r"gives 1 document.*at least 3.*data.text.separator"):
        prepare(text_cfg(tmp_path / "one.txt"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_glob_in_path_is_refused_with_where_it_goes():
    with pytest.raises(ConfigError, match=r"data.text.path = '/usr/lib/\*.py'.*data.text.pattern"):
        build(DataConfig, {"source": "text", "text": {"path": "/usr/lib/*.py"}}, "data")


def test_a_split_too_short_for_one_sequence_is_refused(tmp_path):
    corpus(tmp_path / "src", n=10)
    tokens = {s: v["num_tokens"] for s, v in prepare(text_cfg(tmp_path / "src"), tmp_path / "a")["splits"].items()}
    short = min(tokens, key=tokens.get)
    assert short != "train"
    with pytest.raises(ConfigError, match=rf"the {short} split holds {tokens[short]} tokens, fewer than one sequence"):
        prepare(text_cfg(tmp_path / "src"), tmp_path / "b", seq_len=tokens[short])
