"""The synthetic teacher drifting from day to day (``SyntheticConfig(day=, drift=)``): what
``bench/incremental.py`` trains day after day on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from airflow_rover.data.synthetic import SyntheticConfig, _build_teacher, generate_dataset

SMALL = {"num_train": 500, "num_eval": 100, "vocab_sizes": (50, 200, 1000, 20), "seed": 3}


def weights(config: SyntheticConfig) -> np.ndarray:
    return np.concatenate(_build_teacher(config).id_weights)


def test_each_day_redraws_a_share_drift_of_the_teacher_weights() -> None:
    day0 = weights(SyntheticConfig(**SMALL))  # type: ignore[arg-type]
    day1 = weights(SyntheticConfig(**SMALL, day=1, drift=0.1))  # type: ignore[arg-type]
    day2 = weights(SyntheticConfig(**SMALL, day=2, drift=0.1))  # type: ignore[arg-type]
    still = weights(SyntheticConfig(**SMALL, day=2))  # type: ignore[arg-type]
    one, two = np.corrcoef(day0, day1)[0, 1], np.corrcoef(day0, day2)[0, 1]
    print(f"correlation with day 0: day 1 {one:.4f}, day 2 {two:.4f}")
    assert 0.98 < one < 0.9999 and two < one  # a little each day, more over two days
    np.testing.assert_array_equal(still, day0)  # no drift: the same teacher every day


def test_each_day_has_rows_of_its_own_and_one_held_out_split(tmp_path: Path) -> None:
    """Two days draw other rows; a smaller training split of the same day comes with the
    same held-out split (the bench scores both day-2 runs on it)."""

    def split(name: str, which: str, **kwargs: int | float) -> np.ndarray:
        config = SyntheticConfig(**{**SMALL, **kwargs})  # type: ignore[arg-type]
        data = generate_dataset(tmp_path / name, config)
        return np.load((data.train_dir if which == "train" else data.eval_dir) / "label.npy")

    assert not np.array_equal(split("d1", "train", day=1), split("d2", "train", day=2))
    np.testing.assert_array_equal(
        split("half", "eval", day=2, drift=0.1, num_train=250),
        split("full", "eval", day=2, drift=0.1),
    )


def test_day_zero_without_drift_keeps_the_manifest_of_older_datasets() -> None:
    params = SyntheticConfig(**SMALL).generator_params()  # type: ignore[arg-type]
    assert "day" not in params and "drift" not in params
    assert SyntheticConfig(**SMALL, day=1).generator_params()["day"] == 1  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value"), [("drift", 1.5), ("drift", -0.1), ("day", -1)])
def test_bad_day_or_drift_is_refused_naming_it(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        SyntheticConfig(**{field: value})  # type: ignore[arg-type]
