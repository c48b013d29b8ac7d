"""The memory-mapped format: streamed `.npy` files that NumPy maps, and the start-up check that reads
a fixed ~1 MiB of a file whatever its size, while the full check reads every byte."""

import io

import numpy as np
import pytest

from scalelab.data import arrays, store


def read_bytes_so_far() -> int:
    """Bytes this process has read through read(2) and friends (/proc/self/io rchar)."""
    fields = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    return int(fields["rchar"])


def test_a_streamed_npy_file_is_what_numpy_writes_and_maps(tmp_path):
    rng = np.random.default_rng(0)
    chunks = [rng.standard_normal((n, 3, 2)).astype(np.float32) for n in (5, 0, 1000, 17)]
    writer = arrays.NpyWriter(tmp_path / "a.npy", np.float32, (3, 2))
    for chunk in chunks:
        writer.append(chunk)
    writer.close()
    whole = np.concatenate(chunks)
    reference = io.BytesIO()
    np.save(reference, whole)
    got = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert isinstance(got, np.memmap) and got.shape == (1022, 3, 2) and np.array_equal(got, whole)
    # the same values and layout as np.save, with a header padded for growth (NumPy's own padding)
    dtype, shape, offset = arrays.read_header(tmp_path / "a.npy")
    assert (dtype, shape) == (np.float32, (1022, 3, 2))
    assert (tmp_path / "a.npy").read_bytes()[offset:] == reference.getvalue()[-whole.nbytes :]
    with pytest.raises(ValueError, match="rows of shape"):
        arrays.NpyWriter(tmp_path / "b.npy", np.float32, (3, 2)).append(np.zeros((1, 2)))


def test_a_writer_killed_before_close_leaves_a_file_that_reads_empty(tmp_path):
    writer = arrays.NpyWriter(tmp_path / "a.npy", np.int64)
    writer.append(np.arange(10))
    writer._fh.flush()  # what a killed process leaves: data written, header never updated
    assert np.load(tmp_path / "a.npy").shape == (0,)


def test_the_start_up_check_of_a_10_gb_split_reads_about_1_mib(tmp_path):
    """A 10 GB token file (sparse: it takes no disk) is checked by size, header and 16 probes of
    64 KiB: about 1 MiB read, so milliseconds; the full sha256 would read all 10 GB."""
    path = tmp_path / "train.tokens.npy"
    writer = arrays.NpyWriter(path, np.uint8)
    writer.rows = 10 * 10**9
    writer.close()
    with open(path, "r+b") as fh:
        fh.truncate(writer._data_offset + writer.rows)
    entry = {
        "file": path.name,
        "dtype": "|u1",
        "shape": [writer.rows],
        "bytes": path.stat().st_size,
        "sha256": "not computed here: 10 GB",
        "probe_sha256": arrays.probe_digest(path),
    }
    before = read_bytes_so_far()
    assert arrays.check_file(tmp_path, entry) is None
    read = read_bytes_so_far() - before
    assert read < 2 * 2**20, f"the start-up check read {read / 2**20:.1f} MiB of a 10 GB file"
    with open(path, "r+b") as fh:  # a change inside a probed block
        fh.seek(path.stat().st_size - 10)
        fh.write(b"\x01")
    assert "sampled blocks do not match" in arrays.check_file(tmp_path, entry)


def test_a_large_file_changed_between_probes_passes_start_up_and_fails_the_full_check(tmp_path, monkeypatch):
    """The contract in one picture: start-up trusts a large file's unprobed bytes; the full check
    (`scalelab verify-data`, `reproduce`) does not."""
    monkeypatch.setattr(arrays, "FULL_CHECK_BELOW_BYTES", 1 << 20)
    writer = arrays.NpyWriter(tmp_path / "t.npy", np.uint8)
    writer.append(np.random.default_rng(0).integers(0, 256, 4 << 20, dtype=np.uint8))
    writer.close()
    entry = arrays.file_entry(tmp_path / "t.npy")
    with open(tmp_path / "t.npy", "r+b") as fh:
        fh.seek(entry["bytes"] // 2 + 32 * 1024)  # between two probes (64 KiB every ~270 KiB)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    assert arrays.check_file(tmp_path, entry) is None
    assert "sha256 does not match" in arrays.check_file(tmp_path, entry, full=True)


def test_a_header_that_disagrees_with_the_manifest_is_refused(tmp_path):
    writer = arrays.NpyWriter(tmp_path / "t.npy", np.int64)
    writer.append(np.arange(8))
    writer.close()
    entry = arrays.file_entry(tmp_path / "t.npy")
    assert "header says <i8 [8]" in arrays.check_file(tmp_path, {**entry, "shape": [9]})


def test_a_split_maps_its_files_and_reopens_them_after_pickling(tmp_path):
    import pickle

    from scalelab.config import DataConfig, build
    from scalelab.data.prepare import prepare

    manifest = prepare(build(DataConfig, {"source": "synthetic", "synthetic": {"num_samples": 300}}), tmp_path)
    split = store.open_split(tmp_path, "val", manifest)
    assert all(isinstance(a, np.memmap) for a in split.arrays.values())
    copy = pickle.loads(pickle.dumps(split))
    assert len(pickle.dumps(split)) < 4096  # paths and the entry, not the data
    idx = np.array([4, 0, 2])
    assert all((a == b).all() for a, b in zip(copy.fetch(idx), split.fetch(idx)))
    memory = store.FeatureSplit.from_arrays(np.asarray(split.arrays["x"]), np.asarray(split.arrays["y"]))
    assert all((a == b).all() for a, b in zip(memory.fetch(idx), split.fetch(idx)))
