"""Synthetic dataset generator and readers: determinism, caching, atomicity, shape, signal."""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from airflow_rover.core.metrics import roc_auc
from airflow_rover.data import (
    Batch,
    NpyColumnsReader,
    SampleReader,
    Schema,
    open_dataset,
    register_format,
    synthetic,
)
from airflow_rover.data import reader as reader_module
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset, generate_main

SMALL = SyntheticConfig(num_train=2_000, num_eval=1_000, seed=3)
ARRAYS = ("dense.npy", "categorical.npy", "label.npy")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> synthetic.GeneratedDataset:
    """One default-shaped dataset shared by the read-only tests (~1 s to generate)."""
    root = tmp_path_factory.mktemp("synthetic")
    return generate_dataset(root, SyntheticConfig(num_train=5_000, num_eval=20_000, seed=7))


def _load(split_dir: Path) -> dict[str, np.ndarray]:
    return {name: np.load(split_dir / name) for name in ARRAYS}


def _file_state(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


# --- determinism, caching, atomicity ---------------------------------------------------------


def test_same_config_gives_byte_identical_files(tmp_path: Path) -> None:
    generate_dataset(tmp_path / "a", SMALL)
    generate_dataset(tmp_path / "b", SMALL)
    for split in ("train", "eval"):
        for name in (*ARRAYS, "manifest.json"):
            a = (tmp_path / "a" / split / name).read_bytes()
            assert a == (tmp_path / "b" / split / name).read_bytes(), f"{split}/{name}"


def test_different_seed_gives_different_data(tmp_path: Path) -> None:
    a = generate_dataset(tmp_path / "a", SMALL)
    b = generate_dataset(tmp_path / "b", SyntheticConfig(num_train=2_000, num_eval=1_000, seed=4))
    for name in ARRAYS:
        assert not np.array_equal(np.load(a.train_dir / name), np.load(b.train_dir / name))


def test_train_and_eval_are_different_streams(tmp_path: Path) -> None:
    ds = generate_dataset(tmp_path, SMALL)
    train, test = _load(ds.train_dir), _load(ds.eval_dir)
    assert not np.array_equal(train["dense.npy"][:1_000], test["dense.npy"])


def test_many_blocks_stream_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows depend only on (seed, split, block): a shorter split is a prefix of a longer one."""
    monkeypatch.setattr(synthetic, "_BLOCK_ROWS", 300)
    long = generate_dataset(tmp_path / "long", SMALL)
    short = generate_dataset(
        tmp_path / "short", SyntheticConfig(num_train=600, num_eval=1_000, seed=3)
    )
    reader = open_dataset(long.train_dir, verify=True)
    assert reader.num_samples == SMALL.num_train
    for name in ARRAYS:
        assert np.array_equal(np.load(short.train_dir / name), np.load(long.train_dir / name)[:600])
    dense = np.load(long.train_dir / "dense.npy")
    assert not np.array_equal(dense[:300], dense[300:600])  # each block has its own stream


def test_second_call_does_not_rewrite(tmp_path: Path) -> None:
    first = generate_dataset(tmp_path, SMALL)
    before = _file_state(tmp_path)
    second = generate_dataset(tmp_path, SMALL)
    assert _file_state(tmp_path) == before
    assert second == first


def test_changed_config_regenerates(tmp_path: Path) -> None:
    generate_dataset(tmp_path, SMALL)
    bigger = SyntheticConfig(num_train=2_500, num_eval=1_000, seed=3)
    generate_dataset(tmp_path, bigger)
    manifest = json.loads((tmp_path / "train" / "manifest.json").read_text())
    assert manifest["num_samples"] == 2_500
    assert manifest["generator"]["num_train"] == 2_500
    assert np.load(tmp_path / "train" / "label.npy").shape == (2_500,)


def test_corrupted_split_is_regenerated(tmp_path: Path) -> None:
    ds = generate_dataset(tmp_path, SMALL)
    label_path = ds.train_dir / "label.npy"
    original = label_path.read_bytes()
    corrupted = bytearray(original)
    corrupted[-1] ^= 0xFF
    label_path.write_bytes(bytes(corrupted))
    eval_state = _file_state(ds.eval_dir)
    generate_dataset(tmp_path, SMALL)
    assert label_path.read_bytes() == original
    assert _file_state(ds.eval_dir) == eval_state  # the intact split is left alone


def test_no_temporary_directories_left(tmp_path: Path) -> None:
    generate_dataset(tmp_path, SMALL)
    generate_dataset(tmp_path, SyntheticConfig(num_train=2_000, num_eval=1_000, seed=9))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval", "train"]


def test_crash_mid_write_leaves_no_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure after some rows were written must not leave anything that looks complete."""
    generate_dataset(tmp_path, SMALL)
    old_manifest = (tmp_path / "train" / "manifest.json").read_bytes()
    calls = 0
    real_append = synthetic._NpyStreamWriter.append

    def failing_append(self: synthetic._NpyStreamWriter, rows: np.ndarray) -> None:
        nonlocal calls
        calls += 1
        if calls == 4:
            raise OSError("disk full")
        real_append(self, rows)

    monkeypatch.setattr(synthetic, "_BLOCK_ROWS", 500)
    monkeypatch.setattr(synthetic._NpyStreamWriter, "append", failing_append)
    with pytest.raises(OSError, match="disk full"):
        generate_dataset(tmp_path, SyntheticConfig(num_train=2_000, num_eval=1_000, seed=11))
    # The previous, complete split is still in place and valid; no partial directory remains.
    assert (tmp_path / "train" / "manifest.json").read_bytes() == old_manifest
    open_dataset(tmp_path / "train", verify=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval", "train"]

    fresh = tmp_path / "fresh"
    calls = 0
    with pytest.raises(OSError, match="disk full"):
        generate_dataset(fresh, SMALL)
    assert list(fresh.iterdir()) == []


# --- contents ----------------------------------------------------------------------------------


def test_manifest_matches_contract(dataset: synthetic.GeneratedDataset) -> None:
    manifest = json.loads((dataset.eval_dir / "manifest.json").read_text())
    assert manifest["format"] == "npy-columns"
    assert manifest["version"] == 1
    assert manifest["num_samples"] == 20_000
    assert manifest["num_dense"] == 13
    assert manifest["split"] == "eval"
    assert manifest["seed"] == 7
    assert [c["name"] for c in manifest["categorical"]] == [f"C{j}" for j in range(1, 27)]
    assert [c["vocab_size"] for c in manifest["categorical"]] == list(synthetic.DEFAULT_VOCAB_SIZES)
    assert set(manifest["files"]) == set(ARRAYS)
    assert manifest["generator"]["seed"] == 7
    assert manifest["teacher_auc"] == dataset.teacher_auc


def test_shapes_dtypes_and_id_ranges(dataset: synthetic.GeneratedDataset) -> None:
    for split_dir, n in ((dataset.train_dir, 5_000), (dataset.eval_dir, 20_000)):
        arrays = _load(split_dir)
        dense, cat, label = arrays["dense.npy"], arrays["categorical.npy"], arrays["label.npy"]
        assert dense.dtype == np.float32 and dense.shape == (n, 13)
        assert cat.dtype == np.int64 and cat.shape == (n, 26)
        assert label.dtype == np.float32 and label.shape == (n,)
        assert np.isfinite(dense).all() and dense.min() >= 0.0 and dense.max() < 10.0
        assert 0.1 < float(dense.std()) < 2.0  # normalised, roughly unit scale
        assert set(np.unique(label)) == {0.0, 1.0}
        assert cat.min() >= 0
        assert (cat.max(axis=0) < np.array(synthetic.DEFAULT_VOCAB_SIZES)).all()


def test_ids_are_zipf_skewed_and_scattered(dataset: synthetic.GeneratedDataset) -> None:
    column = synthetic.DEFAULT_VOCAB_SIZES.index(100_000)
    ids = np.concatenate(
        [np.load(d / "categorical.npy")[:, column] for d in (dataset.train_dir, dataset.eval_dir)]
    )
    counts = np.sort(np.bincount(ids, minlength=100_000))[::-1]
    top_share = counts[:1_000].sum() / counts.sum()  # top 1% of the vocabulary
    assert top_share > 0.5
    hottest = np.argsort(np.bincount(ids, minlength=100_000))[::-1][:100]
    assert np.mean(hottest < 1_000) < 0.2  # a permutation, not simply the small integers


def test_positive_rate_is_criteo_like(dataset: synthetic.GeneratedDataset) -> None:
    for split_dir in (dataset.train_dir, dataset.eval_dir):
        rate = float(np.load(split_dir / "label.npy").mean())
        assert 0.2 < rate < 0.3


def test_teacher_auc_is_in_range_and_recomputable(dataset: synthetic.GeneratedDataset) -> None:
    assert 0.75 <= dataset.teacher_auc <= 0.85
    config = SyntheticConfig(num_train=5_000, num_eval=20_000, seed=7)
    teacher = synthetic._build_teacher(config)
    arrays = _load(dataset.eval_dir)
    logit = teacher.bias + synthetic._logit_without_bias(
        teacher, arrays["dense.npy"], arrays["categorical.npy"]
    )
    assert roc_auc(arrays["label.npy"], logit) == pytest.approx(dataset.teacher_auc, abs=1e-12)


def test_labels_carry_learnable_signal(dataset: synthetic.GeneratedDataset) -> None:
    """Shrunk per-id click rates from 5k train rows must rank eval samples above chance."""
    train, test = _load(dataset.train_dir), _load(dataset.eval_dir)
    prior = float(train["label.npy"].mean())
    score = np.zeros(20_000)
    for j, vocab in enumerate(synthetic.DEFAULT_VOCAB_SIZES):
        ids = train["categorical.npy"][:, j]
        clicks = np.bincount(ids, weights=train["label.npy"], minlength=vocab)
        seen = np.bincount(ids, minlength=vocab)
        rate = (clicks + 50 * prior) / (seen + 50)
        score += np.log(rate / (1 - rate))[test["categorical.npy"][:, j]]
    assert roc_auc(test["label.npy"], score) > 0.6


# --- readers -----------------------------------------------------------------------------------


def test_reader_range_reads_equal_slices(dataset: synthetic.GeneratedDataset) -> None:
    reader = open_dataset(dataset.train_dir)
    assert isinstance(reader, NpyColumnsReader)
    assert isinstance(reader, SampleReader)
    assert reader.num_samples == 5_000
    assert reader.schema.num_dense == 13
    assert reader.schema.vocab_sizes == synthetic.DEFAULT_VOCAB_SIZES
    full = _load(dataset.train_dir)
    for start, stop in ((0, 5_000), (0, 1), (123, 4_567), (4_999, 5_000), (2_500, 2_500)):
        batch = reader.read(start, stop)
        assert len(batch) == stop - start
        assert np.array_equal(batch.dense, full["dense.npy"][start:stop])
        assert np.array_equal(batch.categorical, full["categorical.npy"][start:stop])
        assert np.array_equal(batch.label, full["label.npy"][start:stop])
        assert not isinstance(batch.dense, np.memmap)  # a copy, safe after the reader is gone


def test_reader_batches_are_independent_copies(dataset: synthetic.GeneratedDataset) -> None:
    reader = open_dataset(dataset.train_dir)
    batch = reader.read(0, 10)
    batch.label[:] = 7.0  # a writable copy; the file is untouched
    assert set(np.unique(reader.read(0, 10).label)) <= {0.0, 1.0}


@pytest.mark.parametrize(
    ("start", "stop", "name"),
    [(-1, 10, "start"), (5_001, 5_001, "start"), (10, 5, "stop"), (0, 5_001, "stop")],
)
def test_reader_rejects_out_of_range(
    dataset: synthetic.GeneratedDataset, start: int, stop: int, name: str
) -> None:
    reader = open_dataset(dataset.train_dir)
    with pytest.raises(ValueError, match=f"^{name} must be"):
        reader.read(start, stop)


def test_reader_pickles_by_path(dataset: synthetic.GeneratedDataset) -> None:
    reader = open_dataset(dataset.train_dir)
    clone = pickle.loads(pickle.dumps(reader))
    assert len(pickle.dumps(reader)) < 1_000  # the path, not the mapped data
    assert np.array_equal(clone.read(10, 20).categorical, reader.read(10, 20).categorical)


def test_verify_accepts_intact_and_catches_corruption(tmp_path: Path) -> None:
    ds = generate_dataset(tmp_path, SMALL)
    open_dataset(ds.eval_dir, verify=True)
    path = ds.eval_dir / "categorical.npy"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    open_dataset(ds.eval_dir)  # without verify the corruption goes unnoticed
    with pytest.raises(ValueError, match=r"categorical\.npy: sha256 mismatch"):
        open_dataset(ds.eval_dir, verify=True)


def test_unknown_format_names_path_and_accepted_formats(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "parquet-v9"}))
    with pytest.raises(ValueError, match="unknown dataset format 'parquet-v9'") as info:
        open_dataset(tmp_path)
    assert str(tmp_path) in str(info.value)
    assert "npy-columns" in str(info.value)


def test_missing_manifest_names_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no manifest\.json") as info:
        open_dataset(tmp_path)
    assert str(tmp_path) in str(info.value)
    assert "npy-columns" in str(info.value)


def test_a_missing_directory_is_reported_as_missing(tmp_path: Path) -> None:
    """Not as a directory without a manifest: it does not exist, or is a file."""
    with pytest.raises(ValueError, match=r"/gone does not exist$"):
        open_dataset(tmp_path / "gone")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"/file is not a directory"):
        open_dataset(tmp_path / "file")


def test_malformed_manifest_is_a_value_error(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        open_dataset(tmp_path)


def test_shape_mismatch_with_manifest_is_detected(tmp_path: Path) -> None:
    ds = generate_dataset(tmp_path, SMALL)
    np.save(ds.train_dir / "label.npy", np.zeros(10, dtype=np.float32))
    with pytest.raises(ValueError, match=r"label\.npy: expected float32 \(2000,\)"):
        open_dataset(ds.train_dir)


def test_register_format_dispatches_on_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_module, "_FORMATS", dict(reader_module._FORMATS))

    class Constant:
        schema = Schema(num_dense=1, categorical=())
        num_samples = 3

        def read(self, start: int, stop: int) -> Batch:
            n = stop - start
            return Batch(
                dense=np.ones((n, 1), np.float32),
                categorical=np.zeros((n, 0), np.int64),
                label=np.zeros(n, np.float32),
            )

    seen: list[tuple[Path, str]] = []

    def factory(path: Path, manifest: Mapping[str, Any]) -> SampleReader:
        seen.append((path, manifest["format"]))
        return Constant()

    register_format("constant", factory)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "constant"}))
    reader = open_dataset(tmp_path)
    assert seen == [(tmp_path, "constant")]
    assert len(reader.read(0, 3)) == 3


def test_batch_rejects_inconsistent_columns() -> None:
    with pytest.raises(ValueError, match="dense must have shape"):
        Batch(
            dense=np.zeros((2, 3), np.float32),
            categorical=np.zeros((3, 1), np.int64),
            label=np.zeros(3, np.float32),
        )
    with pytest.raises(ValueError, match="categorical must be int64"):
        Batch(
            dense=np.zeros((3, 3), np.float32),
            categorical=np.zeros((3, 1), np.int32),
            label=np.zeros(3, np.float32),
        )


# --- config and CLI ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("num_train", 0, r"num_train must be an integer >= 100"),
        ("num_eval", 2.5, r"num_eval must be an integer >= 100"),
        ("seed", -1, r"seed must be an integer in \[0, "),
        ("num_dense", 0, r"num_dense must be an integer in \[1, 1024\]"),
        ("vocab_sizes", (), r"vocab_sizes must be a non-empty sequence"),
        ("vocab_sizes", (10, 1), r"vocab_sizes\[1\] must be an integer in \[2, "),
        ("zipf_exponent", -0.5, r"zipf_exponent must be a number in \[0.0, 5.0\]"),
        ("noise", float("nan"), r"noise must be a number in \[0.0, 10.0\]"),
        ("positive_rate", 1.0, r"positive_rate must be a number in \[0.01, 0.99\]"),
        ("num_train", True, r"num_train must be an integer"),
    ],
)
def test_config_validation_names_field_and_range(field: str, value: object, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        SyntheticConfig(**{field: value})  # type: ignore[arg-type]


def test_config_normalises_sequences_to_tuples() -> None:
    config = SyntheticConfig(vocab_sizes=[10, np.int64(20)])  # type: ignore[arg-type]
    assert config.vocab_sizes == (10, 20)
    assert type(config.vocab_sizes[1]) is int
    assert config.generator_params()["vocab_sizes"] == [10, 20]


def test_tiny_schema_works(tmp_path: Path) -> None:
    """One categorical column (so no interaction pairs) and one dense column still work."""
    config = SyntheticConfig(num_train=300, num_eval=300, num_dense=1, vocab_sizes=(7,))
    ds = generate_dataset(tmp_path, config)
    batch = open_dataset(ds.train_dir, verify=True).read(0, 300)
    assert batch.dense.shape == (300, 1) and batch.categorical.shape == (300, 1)
    assert batch.categorical.max() < 7


def test_generate_main_prints_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    assert generate_main(["--out", str(out), "--num-train", "500", "--num-eval", "400"]) == 0
    printed = capsys.readouterr().out
    assert str(out / "train") in printed and str(out / "eval") in printed
    assert "teacher_auc:" in printed
    assert open_dataset(out / "eval").num_samples == 400


def test_generate_main_reports_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        generate_main(["--out", str(tmp_path), "--num-train", "5"])
    assert info.value.code == 2
