"""Deterministic synthetic Criteo-shaped click data with a known ("teacher") labelling model.

Why synthetic: tests, benchmarks and demos need a dataset with Criteo's shape (13 dense
counts, 26 skewed categorical columns with a wide spread of vocabulary sizes, ~25% positives)
that is reproducible bit for bit from a seed, needs no download, and comes with a known
best-possible AUC so "did training learn anything" has an objective answer.

Labels come from a hidden teacher: a logistic model with per-id weights, a linear dense part
and a few low-rank pairwise interactions, plus Gaussian logit noise. The teacher's AUC (its
noiseless logit used as the score) is recorded in the manifests; a learned model can
approach it but, with finite data and a long tail of rare ids, not reach it.

Every random draw comes from a ``SeedSequence`` keyed by (seed, purpose, split, block), so
the output depends only on the config (never on process state), and a shorter split is a
prefix of a longer one with the same seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit

from airflow_rover.core.checkpoint_files import fsync_path
from airflow_rover.core.metrics import roc_auc
from airflow_rover.data.reader import MANIFEST_NAME, NpyColumnsReader, sha256_file

FORMAT_NAME = NpyColumnsReader.FORMAT
FORMAT_VERSION = 1
SPLITS = ("train", "eval")

# Bumped whenever the sampling algorithm changes, so a cache made by older code is regenerated.
ALGORITHM_VERSION = 1

# Rows generated per block. Each block has its own RNG stream, so this constant is part of the
# algorithm (changing it changes the data); it only bounds memory, ~60 MB of temporaries.
_BLOCK_ROWS = 100_000
# Rows drawn (from a separate stream) to calibrate the dense weights' scale and the bias.
_CALIBRATION_ROWS = 100_000

# Teacher logit composition: standard deviation of each part over the sample distribution.
# Tuned (with the default noise) so that on seed 0 the teacher's eval AUC is ~0.80 and
# per-id models trained on the 200k default rows reach ~0.77 (see bench/data_quality.py).
_DENSE_LOGIT_STD = 0.9
_CATEGORICAL_LOGIT_STD = 1.1
_INTERACTION_LOGIT_STD = 0.5
# A rank-r id's weight is scaled by r**-_TAIL_DECAY before standardising: rare ids deviate less
# from their column's mean, as in real logs, so most categorical signal sits in ids that
# occur often enough to be learned (without it a model stays far below the teacher).
_TAIL_DECAY = 0.2
# Gamma shape of each column's share of the categorical variance: uneven, as in real data.
_COLUMN_SHARE_SHAPE = 2.0
# Low-rank pairwise interactions between columns drawn from the quarter with the smallest
# vocabularies: their crosses have few enough combinations to be learnable from 200k rows.
_NUM_INTERACTIONS = 6
_INTERACTION_DIM = 4
_INTERACTION_COLUMN_FRACTION = 0.25

# Stream tags for SeedSequence keys; fixed forever (changing them changes every dataset).
_TAG_TEACHER = 0x7EAC
_TAG_CALIBRATION = 0xCA1B
_TAG_SPLIT = {"train": 0x7A1, "eval": 0xE7A}
_TAG_DRIFT = 0xD21F

# Criteo-like spread: a few tiny columns (10-100), mid-sized ones (250-12k) and several large
# ones (20k-100k); ~529k ids in all, so full per-id tables stay well under 1M rows.
DEFAULT_VOCAB_SIZES: tuple[int, ...] = (
    1_000, 500, 100_000, 60_000, 250, 20, 10_000, 600, 10, 40_000, 5_000, 80_000, 3_000,
    25, 12_000, 70_000, 10, 4_000, 2_000, 10, 90_000, 15, 50, 30_000, 100, 20_000,
)  # fmt: skip

_MIN_SAMPLES = 100
_MAX_VOCAB = 50_000_000


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """Validate an integer field, naming it and the accepted range in the error."""
    accepted = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
    return int(value)


def _check_float(name: str, value: object, low: float, high: float) -> float:
    """Validate a finite float field in [low, high], naming it and the range in the error."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    number = float(value)
    if not np.isfinite(number) or not low <= number <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    return number


@dataclass(frozen=True)
class SyntheticConfig:
    """Everything that determines a generated dataset; equal configs give identical bytes."""

    num_train: int = 200_000
    num_eval: int = 50_000
    seed: int = 0
    num_dense: int = 13
    vocab_sizes: tuple[int, ...] = DEFAULT_VOCAB_SIZES
    zipf_exponent: float = 1.1
    noise: float = 0.8
    positive_rate: float = 0.25
    day: int = 0  # day d's teacher has drifted d steps from day 0's; its samples are its own
    drift: float = 0.0  # share of each id weight redrawn per day (0: the teacher never moves)

    def __post_init__(self) -> None:
        """Reject bad values early, with the field name and accepted range in the message."""
        set_ = object.__setattr__  # frozen: normalise numpy scalars / lists to plain types
        set_(self, "num_train", _check_int("num_train", self.num_train, _MIN_SAMPLES))
        set_(self, "num_eval", _check_int("num_eval", self.num_eval, _MIN_SAMPLES))
        set_(self, "seed", _check_int("seed", self.seed, 0, 2**63 - 1))
        set_(self, "num_dense", _check_int("num_dense", self.num_dense, 1, 1024))
        vocab = self.vocab_sizes
        if isinstance(vocab, str | bytes) or not isinstance(vocab, Sequence) or not vocab:
            raise ValueError(
                "vocab_sizes must be a non-empty sequence of integers in "
                f"[2, {_MAX_VOCAB}], got {vocab!r}"
            )
        if len(vocab) > 1024:
            raise ValueError(f"vocab_sizes must have between 1 and 1024 entries, got {len(vocab)}")
        checked = tuple(
            _check_int(f"vocab_sizes[{i}]", v, 2, _MAX_VOCAB) for i, v in enumerate(vocab)
        )
        set_(self, "vocab_sizes", checked)
        set_(self, "zipf_exponent", _check_float("zipf_exponent", self.zipf_exponent, 0.0, 5.0))
        set_(self, "noise", _check_float("noise", self.noise, 0.0, 10.0))
        set_(self, "positive_rate", _check_float("positive_rate", self.positive_rate, 0.01, 0.99))
        set_(self, "day", _check_int("day", self.day, 0, 10_000))
        set_(self, "drift", _check_float("drift", self.drift, 0.0, 1.0))

    def generator_params(self) -> dict[str, Any]:
        """The JSON-ready parameter record stored in each manifest (and compared for reuse)."""
        params = dataclasses.asdict(self)
        params["vocab_sizes"] = list(self.vocab_sizes)
        params["algorithm_version"] = ALGORITHM_VERSION
        if not self.day and not self.drift:  # datasets made before days existed stay current
            del params["day"], params["drift"]
        return params

    def num_samples(self, split: str) -> int:
        """Number of samples of ``split`` ("train" or "eval")."""
        if split == "train":
            return self.num_train
        if split == "eval":
            return self.num_eval
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


@dataclass(frozen=True)
class GeneratedDataset:
    """Where a generated dataset lives; ``teacher_auc`` is measured on the eval split."""

    root: Path
    train_dir: Path
    eval_dir: Path
    teacher_auc: float


@dataclass(frozen=True)
class _Teacher:
    """The hidden labelling model plus the feature distribution, all derived from the seed."""

    rank_cdfs: tuple[np.ndarray, ...]  # per column: cumulative Zipf probability by rank
    rank_to_id: tuple[np.ndarray, ...]  # per column: permutation, so hot ids are scattered
    dense_mu: np.ndarray  # log-count location per dense column
    dense_sigma: np.ndarray  # log-count scale per dense column
    dense_zero_prob: np.ndarray  # probability of a zero count per dense column
    dense_norm: np.ndarray  # divisor that brings log1p(count) to roughly unit scale
    dense_weights: np.ndarray  # (num_dense,)
    id_weights: tuple[np.ndarray, ...]  # per column: scalar weight per id
    pairs: tuple[tuple[int, int], ...]  # column pairs with a low-rank interaction
    pair_vectors: tuple[tuple[np.ndarray, np.ndarray], ...]  # per pair: (V_a, k), (V_b, k)
    bias: float


def _rng(*key: int) -> np.random.Generator:
    """An independent, reproducible stream for one purpose (teacher, split block, ...)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(key))))


def _zipf_pmf(vocab_size: int, exponent: float) -> np.ndarray:
    """Probability of each rank 1..V under a Zipf law truncated to the vocabulary."""
    weights = np.arange(1, vocab_size + 1, dtype=np.float64) ** -exponent
    return weights / weights.sum()


def _per_id_weights(
    rng: np.random.Generator, rank_to_id: np.ndarray, pmf: np.ndarray, std: float
) -> np.ndarray:
    """Scalar teacher weight per id, with mean 0 and std ``std`` over sampled occurrences.

    Moments are taken under the sampling distribution (Zipf by rank), so each column adds
    exactly its intended share of logit variance however skewed its id frequencies are.
    """
    ranks = np.arange(1, pmf.shape[0] + 1, dtype=np.float64)
    by_rank = rng.standard_normal(pmf.shape[0]) * ranks**-_TAIL_DECAY
    by_rank -= pmf @ by_rank
    by_rank *= std / np.sqrt(pmf @ by_rank**2)
    weights = np.empty_like(by_rank)
    weights[rank_to_id] = by_rank
    return weights


def _sample_features(
    teacher: _Teacher, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` feature rows: dense float32 (n, num_dense) and categorical int64 (n, C)."""
    num_dense = teacher.dense_mu.shape[0]
    log_counts = teacher.dense_mu + teacher.dense_sigma * rng.standard_normal((n, num_dense))
    counts = np.floor(np.exp(log_counts))
    counts[rng.random((n, num_dense)) < teacher.dense_zero_prob] = 0.0
    dense = (np.log1p(counts) / teacher.dense_norm).astype(np.float32)

    uniforms = rng.random((n, len(teacher.rank_cdfs)))
    categorical = np.empty((n, len(teacher.rank_cdfs)), dtype=np.int64)
    for j, (cdf, perm) in enumerate(zip(teacher.rank_cdfs, teacher.rank_to_id, strict=True)):
        ranks = np.searchsorted(cdf, uniforms[:, j], side="right")
        np.minimum(ranks, cdf.shape[0] - 1, out=ranks)  # guard against float round-off
        categorical[:, j] = perm[ranks]
    return dense, categorical


def _logit_without_bias(
    teacher: _Teacher, dense: np.ndarray, categorical: np.ndarray
) -> np.ndarray:
    """The teacher's noiseless logit minus its bias, float64 (n,)."""
    logit = dense.astype(np.float64) @ teacher.dense_weights
    for j, weights in enumerate(teacher.id_weights):
        logit += weights[categorical[:, j]]
    for (a, b), (vec_a, vec_b) in zip(teacher.pairs, teacher.pair_vectors, strict=True):
        logit += np.einsum("nk,nk->n", vec_a[categorical[:, a]], vec_b[categorical[:, b]])
    return logit


def _build_teacher(config: SyntheticConfig) -> _Teacher:
    """Draw the teacher from the seed alone (same for both splits), then calibrate it."""
    rng = _rng(config.seed, _TAG_TEACHER)
    num_cat = len(config.vocab_sizes)

    pmfs = [_zipf_pmf(v, config.zipf_exponent) for v in config.vocab_sizes]
    rank_cdfs = []
    for pmf in pmfs:
        cdf = np.cumsum(pmf)
        cdf[-1] = 1.0
        rank_cdfs.append(cdf)
    rank_to_id = [rng.permutation(v).astype(np.int64) for v in config.vocab_sizes]

    dense_mu = rng.uniform(0.5, 4.0, config.num_dense)
    dense_sigma = rng.uniform(0.5, 1.5, config.num_dense)
    dense_zero_prob = rng.uniform(0.05, 0.5, config.num_dense)
    dense_norm = np.log1p(np.exp(dense_mu + dense_sigma))
    raw_dense_weights = rng.standard_normal(config.num_dense)

    # Per-column share of the categorical logit variance: uneven, as in real data.
    shares = rng.gamma(_COLUMN_SHARE_SHAPE, size=num_cat)
    column_std = _CATEGORICAL_LOGIT_STD * np.sqrt(shares / shares.sum())
    id_weights = tuple(
        _per_id_weights(rng, perm, pmf, float(std))
        for perm, pmf, std in zip(rank_to_id, pmfs, column_std, strict=True)
    )

    for day in range(1, config.day + 1):  # each day redraws a share ``drift`` of every weight
        step = _rng(config.seed, _TAG_DRIFT, day)
        id_weights = tuple(
            np.sqrt(1 - config.drift**2) * w
            + config.drift * _per_id_weights(step, perm, pmf, float(std))
            for w, perm, pmf, std in zip(id_weights, rank_to_id, pmfs, column_std, strict=True)
        )

    pairs, pair_vectors = _interactions(rng, config, rank_to_id, pmfs)

    teacher = _Teacher(
        rank_cdfs=tuple(rank_cdfs),
        rank_to_id=tuple(rank_to_id),
        dense_mu=dense_mu,
        dense_sigma=dense_sigma,
        dense_zero_prob=dense_zero_prob,
        dense_norm=dense_norm,
        dense_weights=raw_dense_weights,
        id_weights=id_weights,
        pairs=pairs,
        pair_vectors=pair_vectors,
        bias=0.0,
    )
    return _calibrate(teacher, config)


def _interactions(
    rng: np.random.Generator,
    config: SyntheticConfig,
    rank_to_id: list[np.ndarray],
    pmfs: list[np.ndarray],
) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[np.ndarray, np.ndarray], ...]]:
    """The teacher's column pairs with a low-rank interaction, and each pair's vectors."""
    # Interactions live among the smallest-vocabulary columns: crosses of huge columns would
    # be mostly unlearnable tail and only widen the teacher/model gap.
    num_cat = len(config.vocab_sizes)
    num_small = max(2, int(np.ceil(num_cat * _INTERACTION_COLUMN_FRACTION)))
    small = sorted(sorted(range(num_cat), key=lambda j: config.vocab_sizes[j])[:num_small])
    all_pairs = [(a, b) for i, a in enumerate(small) for b in small[i + 1 :]]
    num_pairs = min(_NUM_INTERACTIONS, len(all_pairs))
    chosen = rng.choice(len(all_pairs), size=num_pairs, replace=False)
    pairs = tuple(sorted(all_pairs[int(i)] for i in chosen))
    pair_std = _INTERACTION_LOGIT_STD / np.sqrt(num_pairs) if num_pairs else 0.0
    pair_vectors = tuple(
        _pair_vectors(rng, config, rank_to_id, pmfs, pair, pair_std) for pair in pairs
    )
    return pairs, pair_vectors


def _pair_vectors(
    rng: np.random.Generator,
    config: SyntheticConfig,
    rank_to_id: list[np.ndarray],
    pmfs: list[np.ndarray],
    pair: tuple[int, int],
    pair_std: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-id vectors of the pair's two columns, centred, whose dot product has std
    ``pair_std`` over sampled occurrences."""
    centred = []
    second_moments = []
    for col in pair:
        vecs = rng.standard_normal((config.vocab_sizes[col], _INTERACTION_DIM))
        by_rank = vecs[rank_to_id[col]]
        vecs -= pmfs[col] @ by_rank  # zero mean: no main effect hides in the interaction
        by_rank = vecs[rank_to_id[col]]
        second_moments.append((by_rank * pmfs[col][:, None]).T @ by_rank)
        centred.append(vecs)
    # Independent columns: Var(<x, y>) = sum(E[xx^T] * E[yy^T]); scale both sides equally.
    var = float(np.sum(second_moments[0] * second_moments[1]))
    scale = (pair_std**2 / var) ** 0.25
    return centred[0] * scale, centred[1] * scale


def _calibrate(teacher: _Teacher, config: SyntheticConfig) -> _Teacher:
    """Scale the dense weights to their target std and solve the bias for the positive rate.

    Dense features go through floor/log1p/zero-inflation, so their moments are measured on a
    calibration sample (its own stream) instead of derived; the bias must account for the
    logit noise too, so that is drawn here as well.
    """
    rng = _rng(config.seed, _TAG_CALIBRATION)
    dense, categorical = _sample_features(teacher, rng, _CALIBRATION_ROWS)
    dense_part = dense.astype(np.float64) @ teacher.dense_weights
    dense_std = float(dense_part.std())
    dense_weights = teacher.dense_weights * (_DENSE_LOGIT_STD / dense_std)
    teacher = dataclasses.replace(teacher, dense_weights=dense_weights)

    logit = _logit_without_bias(teacher, dense, categorical)
    logit += config.noise * rng.standard_normal(_CALIBRATION_ROWS)

    def excess_rate(bias: float) -> float:
        return float(expit(logit + bias).mean()) - config.positive_rate

    bias = float(brentq(excess_rate, -50.0, 50.0, xtol=1e-10))
    return dataclasses.replace(teacher, bias=bias)


def _split_is_current(split_dir: Path, expected: dict[str, Any], num_samples: int) -> bool:
    """True if ``split_dir`` holds a complete split made with exactly these parameters."""
    try:
        manifest = json.loads((split_dir / MANIFEST_NAME).read_text())
        if (
            manifest.get("format") != FORMAT_NAME
            or manifest.get("version") != FORMAT_VERSION
            or manifest.get("generator") != expected
            or manifest.get("num_samples") != num_samples
            or not isinstance(manifest.get("teacher_auc"), float)
        ):
            return False
        files = manifest["files"]
        return set(files) == {"dense.npy", "categorical.npy", "label.npy"} and all(
            sha256_file(split_dir / name) == digest for name, digest in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


class _NpyStreamWriter:
    """Append-only .npy writer that hashes as it writes.

    Rows are streamed to the file in order, so memory stays at one block however large the
    split (a memmap would keep every dirty page in the process's resident set until closed),
    and the checksum comes for free instead of re-reading the file.
    """

    def __init__(self, path: Path, dtype: type[np.generic], shape: tuple[int, ...]) -> None:
        self.path = path
        self._dtype = np.dtype(dtype)
        self._row_shape = shape[1:]
        self._rows_left = shape[0]
        self._digest = hashlib.sha256()
        header = io.BytesIO()
        descr = np.lib.format.dtype_to_descr(self._dtype)
        np.lib.format.write_array_header_1_0(
            header, {"descr": descr, "fortran_order": False, "shape": shape}
        )
        self._file = path.open("wb")
        self._write(header.getvalue())

    def _write(self, data: bytes | memoryview) -> None:
        self._file.write(data)
        self._digest.update(data)

    def append(self, rows: np.ndarray) -> None:
        """Append rows (converted to the file's dtype, C order)."""
        if rows.shape[1:] != self._row_shape or rows.shape[0] > self._rows_left:
            raise ValueError(f"{self.path}: unexpected block shape {rows.shape}")
        self._rows_left -= rows.shape[0]
        self._write(np.ascontiguousarray(rows, dtype=self._dtype).data.cast("B"))

    def close(self) -> str:
        """Flush to disk and return the file's hex sha256; every row must have been written."""
        if self._rows_left:
            raise ValueError(f"{self.path}: {self._rows_left} rows never written")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return self._digest.hexdigest()

    def abort(self) -> None:
        """Release the file handle after a failure (idempotent; the directory is discarded)."""
        self._file.close()


def _write_split(teacher: _Teacher, config: SyntheticConfig, split: str, out_dir: Path) -> float:
    """Write one split's arrays and manifest into (empty) ``out_dir``; return its teacher AUC."""
    n = config.num_samples(split)
    writers = {
        "dense.npy": _NpyStreamWriter(out_dir / "dense.npy", np.float32, (n, config.num_dense)),
        "categorical.npy": _NpyStreamWriter(
            out_dir / "categorical.npy", np.int64, (n, len(config.vocab_sizes))
        ),
        "label.npy": _NpyStreamWriter(out_dir / "label.npy", np.float32, (n,)),
    }
    teacher_scores = np.empty(n, dtype=np.float64)  # 8 bytes/sample: needed for the exact AUC
    labels = np.empty(n, dtype=np.int8)
    try:
        for block, start in enumerate(range(0, n, _BLOCK_ROWS)):
            stop = min(start + _BLOCK_ROWS, n)
            day = (config.day,) if config.day else ()  # each day samples rows of its own
            rng = _rng(config.seed, _TAG_SPLIT[split], block, *day)
            dense, categorical = _sample_features(teacher, rng, stop - start)
            logit = teacher.bias + _logit_without_bias(teacher, dense, categorical)
            noisy = logit + config.noise * rng.standard_normal(stop - start)
            label = rng.random(stop - start) < expit(noisy)
            writers["dense.npy"].append(dense)
            writers["categorical.npy"].append(categorical)
            writers["label.npy"].append(label)
            teacher_scores[start:stop] = logit
            labels[start:stop] = label
        files = {name: writer.close() for name, writer in writers.items()}
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    teacher_auc = roc_auc(labels, teacher_scores)
    manifest = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "num_samples": n,
        "num_dense": config.num_dense,
        "categorical": [
            {"name": f"C{j + 1}", "vocab_size": v} for j, v in enumerate(config.vocab_sizes)
        ],
        "seed": config.seed,
        "split": split,
        "teacher_auc": teacher_auc,
        "positive_rate": float(labels.mean()),
        "generator": config.generator_params(),
        "files": files,
    }
    manifest_path = out_dir / MANIFEST_NAME
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    fsync_path(manifest_path)
    return teacher_auc


def _install_split(tmp_dir: Path, target: Path) -> None:
    """Move a finished split into place; a reader sees the old split, none, or the new one."""
    if target.exists():
        old = target.with_name(f".{target.name}.old-{secrets.token_hex(6)}")
        os.replace(target, old)
        os.replace(tmp_dir, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp_dir, target)
    fsync_path(target.parent)


def generate_dataset(
    root: str | os.PathLike[str], config: SyntheticConfig = SyntheticConfig()
) -> GeneratedDataset:
    """Generate (or reuse) ``<root>/train`` and ``<root>/eval`` for ``config``.

    Idempotent: a split whose manifest records the same generator parameters and whose files
    match their checksums is left untouched. Atomic: each split is written to a temporary
    sibling directory and renamed into place, so a crash never leaves a half-written split
    that looks complete.
    """
    root_path = Path(root)
    root_path.mkdir(parents=True, exist_ok=True)
    expected = config.generator_params()
    teacher: _Teacher | None = None
    for split in SPLITS:
        target = root_path / split
        if _split_is_current(target, expected, config.num_samples(split)):
            continue
        if teacher is None:
            teacher = _build_teacher(config)
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{split}.tmp-", dir=root_path))
        try:
            _write_split(teacher, config, split, tmp_dir)
            try:
                _install_split(tmp_dir, target)
            except OSError:
                # A concurrent generator may have installed the same split first; its bytes
                # equal ours (determinism), so keep it. Anything else is a real failure.
                if not _split_is_current(target, expected, config.num_samples(split)):
                    raise
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)  # gone already after a successful rename
    eval_manifest = json.loads((root_path / "eval" / MANIFEST_NAME).read_text())
    return GeneratedDataset(
        root=root_path,
        train_dir=root_path / "train",
        eval_dir=root_path / "eval",
        teacher_auc=float(eval_manifest["teacher_auc"]),
    )


def generate_main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: generate a dataset and print where it went."""
    defaults = SyntheticConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", required=True, help="dataset root (train/ and eval/ go here)")
    parser.add_argument("--num-train", type=int, default=defaults.num_train)
    parser.add_argument("--num-eval", type=int, default=defaults.num_eval)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args(argv)
    try:
        config = SyntheticConfig(num_train=args.num_train, num_eval=args.num_eval, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    started = time.perf_counter()
    dataset = generate_dataset(args.out, config)
    elapsed = time.perf_counter() - started
    print(f"train: {dataset.train_dir}")
    print(f"eval: {dataset.eval_dir}")
    print(f"teacher_auc: {dataset.teacher_auc:.4f}")
    print(f"seconds: {elapsed:.1f}")
    return 0
