"""Sanity-check the synthetic dataset: is its signal learnable, and how far below the teacher?

Generates the default dataset (or reuses it under ``--out``), trains a small Keras model in
this one process and prints the teacher AUC next to the learned eval AUC. Not a test: it
takes tens of seconds and its figures are documented, not asserted.

    python bench/data_quality.py                       # one-epoch logistic regression
    python bench/data_quality.py --model wide_deep     # per-id embeddings + MLP
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_rover.core.metrics import roc_auc
from airflow_rover.data import Batch, open_dataset
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

if TYPE_CHECKING:
    import keras

# Tuned on seed 0 (Adagrad, like the runtime): per-id weights seen only a few times want a
# large step; 0.05-0.5 all work, 0.3 is near the best for both models.
_DEFAULTS = {
    "lr": {"epochs": 1, "learning_rate": 0.3, "batch_size": 256},
    "wide_deep": {"epochs": 2, "learning_rate": 0.3, "batch_size": 256},
}


def _global_ids(batch: Batch, offsets: np.ndarray) -> np.ndarray:
    """Shift each column's ids into its own range of one shared table (one lookup per batch)."""
    return batch.categorical + offsets[None, :]


def _build_model(
    model: str, num_dense: int, num_cat: int, total_vocab: int, lr: float
) -> keras.Model:
    """Logistic regression with a scalar weight per id, optionally plus a Deep tower.

    ``wide_deep`` mirrors the runtime's reference model (16-dim embeddings, MLP 256-128,
    Adagrad everywhere), so its AUC predicts what a real job on this data should reach.
    """
    import keras

    dense_in = keras.Input(shape=(num_dense,), dtype="float32", name="dense_features")
    ids_in = keras.Input(shape=(num_cat,), dtype="int64", name="ids_in")
    wide_weights = keras.layers.Embedding(total_vocab, 1, embeddings_initializer="zeros")(ids_in)
    logit = keras.ops.sum(keras.ops.squeeze(wide_weights, axis=-1), axis=1, keepdims=True)
    logit = logit + keras.layers.Dense(1)(dense_in)
    if model == "wide_deep":
        emb = keras.layers.Embedding(
            total_vocab,
            16,
            embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05),
        )(ids_in)
        hidden = keras.layers.Concatenate()([keras.layers.Flatten()(emb), dense_in])
        for units in (256, 128):
            hidden = keras.layers.Dense(units, activation="relu")(hidden)
        logit = logit + keras.layers.Dense(1)(hidden)
    net = keras.Model([dense_in, ids_in], keras.layers.Activation("sigmoid")(logit))
    optimizer = keras.optimizers.Adagrad(lr, initial_accumulator_value=0.1, epsilon=1e-7)
    net.compile(optimizer=optimizer, loss="binary_crossentropy")
    return net


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", help="dataset root to create or reuse (default: a temp dir)")
    parser.add_argument("--num-train", type=int, default=SyntheticConfig.num_train)
    parser.add_argument("--num-eval", type=int, default=SyntheticConfig.num_eval)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=sorted(_DEFAULTS), default="lr")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--batch-size", type=int)
    args = parser.parse_args(argv)
    defaults = _DEFAULTS[args.model]
    epochs = args.epochs or int(defaults["epochs"])
    learning_rate = args.learning_rate or float(defaults["learning_rate"])
    batch_size = args.batch_size or int(defaults["batch_size"])

    config = SyntheticConfig(num_train=args.num_train, num_eval=args.num_eval, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="rover-data-quality-") as scratch:
        root = Path(args.out) if args.out else Path(scratch)
        started = time.perf_counter()
        dataset = generate_dataset(root, config)
        gen_seconds = time.perf_counter() - started
        train_reader = open_dataset(dataset.train_dir)
        eval_reader = open_dataset(dataset.eval_dir)
        train = train_reader.read(0, train_reader.num_samples)
        test = eval_reader.read(0, eval_reader.num_samples)

    schema = train_reader.schema
    sizes = np.array(schema.vocab_sizes, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    import keras

    keras.utils.set_random_seed(args.seed)
    net = _build_model(
        args.model, schema.num_dense, schema.num_categorical, int(sizes.sum()), learning_rate
    )
    started = time.perf_counter()
    net.fit(
        {"dense_features": train.dense, "ids_in": _global_ids(train, offsets)},
        train.label,
        batch_size=batch_size,
        epochs=epochs,
        shuffle=True,
        verbose=0,
    )
    train_seconds = time.perf_counter() - started
    predictions = net.predict(
        {"dense_features": test.dense, "ids_in": _global_ids(test, offsets)},
        batch_size=8192,
        verbose=0,
    )
    learned_auc = roc_auc(test.label, np.asarray(predictions, dtype=np.float64).ravel())

    print(f"samples: train={len(train)} eval={len(test)} seed={args.seed}")
    print(f"positive_rate: train={train.label.mean():.4f} eval={test.label.mean():.4f}")
    print(f"generation_seconds: {gen_seconds:.2f}")
    print(f"teacher_auc: {dataset.teacher_auc:.4f}")
    print(
        f"learned_auc: {learned_auc:.4f} (model={args.model} epochs={epochs} "
        f"lr={learning_rate} batch={batch_size} train_seconds={train_seconds:.1f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
