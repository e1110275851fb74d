"""Export a trained model for serving: a TensorFlow SavedModel in the model's folder
(``models/<stamp>/saved_model/``) that a downstream task loads with ``tf.saved_model.load``
alone, without airflow_rover.

The SavedModel takes the raw columns (``dense_features`` and one input per categorical
column a table reads: int64 ids or ints, or strings, hashed in the graph as the readers hash
them; a list column as its values and ``<column>_lengths``) and returns the click
probability. The embedding rows the PS saved are baked in; an id
the job never trained reads as its seeded initial row, computed in the graph with the PS's own
hash (``core.hashing.initial_rows``), so the SavedModel scores every row as the PS model does.
Per embedding group it holds the trained rows, not a dense table, and finds an id's row by an
int32 slot per id of the group's id space or, where that space is far larger than the rows
trained (and for a table of index 'ids', which has no id space), by a hash table from each
trained id to its row (``serving_module.hashed_rows``); any other id reads its seeded initial
row. Its size grows with the rows trained.

A job with a ``preprocess`` trained on the preprocessed features: the SavedModel cannot run
that Python function, so it takes the preprocessed features, and its ``export.json`` says so
(``preprocess``, ``note``): the dense features and id columns can be given preprocessed, a
hashed column whose ids the function changes cannot.

Run as ``python -m airflow_rover.worker.export <model folder>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from airflow_rover.core.hashing import INIT_SCALE, name_salt
from airflow_rover.core.spec import FeatureConfig
from airflow_rover.worker.model_folder import model_seed, read_model

SAVED_MODEL = "saved_model"
"""The SavedModel's folder inside a model folder."""
DENSE_COLUMN = "dense_features"
"""The signature's input of the dense features, float32 (batch, num_dense): the Keras
model's ``DENSE_INPUT`` (not imported here: it imports Keras)."""
EXPORT_CARD = "export.json"
"""Written inside the SavedModel folder: its inputs, outputs and what it was made from."""


def exported_path(folder: Path) -> Path:
    return folder / SAVED_MODEL


def preprocess_note(card: dict[str, Any]) -> dict[str, str]:
    """For a model trained with a ``preprocess``: that function and what it means for the
    SavedModel's inputs; nothing for a model without one."""
    ref = card.get("preprocess")
    if not ref:
        return {}
    return {
        "preprocess": ref,
        "note": f"the model was trained on the output of preprocess={ref!r}, which the "
        "SavedModel does not run: give it features already preprocessed by that function "
        "(raw rows score as if unpreprocessed); it hashes its string and int inputs, so a "
        "hashed column whose ids the function changes cannot be given here",
    }


def export_saved_model(folder: Path) -> dict[str, Any]:
    """Write ``folder/saved_model`` (replacing one there) and return its ``export.json``."""
    started = time.monotonic()
    card, groups, dense = read_model(folder)  # before TensorFlow's import: a bad folder fails fast
    import keras
    import tensorflow as tf

    from airflow_rover.worker.models import load_factory
    from airflow_rover.worker.serving_module import ServingModule

    features = FeatureConfig.model_validate(card["features"])
    seed = model_seed(card, folder)
    keras.utils.set_random_seed(seed)
    model = load_factory(card["model"])(features)
    missing = [v.path for v in model.trainable_variables if v.path not in dense]
    if missing:
        raise ValueError(f"model {card['model']!r}: the saved model has no weights for {missing}")
    for variable in model.trainable_variables:
        variable.assign(dense[variable.path])
    module = ServingModule(model, features, groups, seed, INIT_SCALE, name_salt)
    target = exported_path(folder)
    tmp = folder / f".{SAVED_MODEL}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    # the function, not a concrete one: saving traces it (again, if it had been traced)
    tf.saved_model.save(module, str(tmp), signatures={"serving_default": module.serve})
    info = {
        "inputs": {DENSE_COLUMN: ["float32", [None, features.num_dense]]}
        | {name: [spec.dtype.name, [None]] for name, spec in module.inputs.items()},
        "outputs": {"probability": ["float32", [None]], "logit": ["float32", [None]]},
        "job_id": card.get("job_id"),
        "model": card.get("model"),
        "trained_rows": int(sum(g.ids.size for g in groups)),
        "export_s": round(time.monotonic() - started, 3),
        "bytes": sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file()),
    } | preprocess_note(card)
    (tmp / EXPORT_CARD).write_text(json.dumps(info, indent=2))
    if target.exists():
        shutil.rmtree(target)
    os.rename(tmp, target)
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="airflow_rover.worker.export")
    parser.add_argument("folder", type=Path, help="a model folder (model.json, ps-<i>.npz)")
    args = parser.parse_args(argv)
    try:
        info = export_saved_model(args.folder)
    except (OSError, ValueError, KeyError) as exc:
        sys.exit(f"export of {args.folder} failed: {type(exc).__name__}: {exc}")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
