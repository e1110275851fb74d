"""The end of a job: once every shard is done, a final checkpoint (a failure from there on
retrains nothing), the held-out evaluation, then the model saved from the PS and the result
that the task pushes to XCom.

The held-out split is scored by the first worker that asks once training is over: its
TensorFlow and model are warm, so no node starts for it. A node of its own (``evaluator``)
scores it only when no worker is left to ask, none asked in ``CLAIM_S``, or the worker that
scored it died."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.job_dir import atomic_write_json
from airflow_rover.core.ledger import batch_accounting
from airflow_rover.core.model_release import new_model_folder, publish_model
from airflow_rover.core.spec import JobSpec
from airflow_rover.core.states import JobState
from airflow_rover.master.checkpointing import Checkpoints
from airflow_rover.master.data_workers import DataWorkerRoom
from airflow_rover.master.job_core import JobCore
from airflow_rover.master.nodes import NodeInfo
from airflow_rover.master.resize import PlanExecutor
from airflow_rover.rpc.ps_client import PSClient

EVALUATOR_NODE = "evaluator"
CLAIM_S = 30.0
"""How long a running worker has to ask for the evaluation before a node of its own does it."""


class EndingJob(JobCore, Protocol):
    """What the end of a job uses of it beyond its core."""

    checkpointing: Checkpoints
    plans: PlanExecutor
    data_workers: DataWorkerRoom
    train_started_at: float | None
    samples_resumed: int

    def ps_client(self) -> PSClient: ...

    def record_samples(self) -> None: ...

    def recovery_summary(self) -> dict[str, Any]: ...


class WrapUp:
    """Ends training and the job (called with the job's lock held)."""

    def __init__(self, job: EndingJob) -> None:
        self.job = job
        self.started = False  # training done: final checkpoint taken, evaluation started
        self.train_finished_at: float | None = None
        self.evaluation: dict[str, Any] | None = None
        self.evaluator: str | None = None  # the node scoring the held-out split
        self._claim_by = 0.0  # when a worker must have asked for the evaluation
        self.result: dict[str, Any] | None = None

    def training_over(self) -> None:
        """Every shard is done: cancel a PS resize, take the final checkpoint, score the
        held-out split."""
        job = self.job
        self.started = True  # until a PS restore sends training back
        job.plans.cancel("training ended before the PS resize")
        self.train_finished_at = time.time()
        job.record_samples()
        if job.spec.recovery.checkpoint_interval_s > 0:
            job.checkpointing.checkpointer.checkpoint()  # a failure from here on retrains nothing
        if job.spec.eval_data:
            job.state = JobState.EVALUATING
            self.evaluation = None  # a PS restore may have sent training back
            self.evaluator, self._claim_by = None, time.time() + CLAIM_S
            job.message = "scoring the held-out split"
            job.mirror_state(force=True)

    def claim_evaluation(self, node_id: str) -> bool:
        """Whether worker ``node_id``, done training, scores the held-out split: the first
        running worker to ask while it is unscored does."""
        node = self.job.nodes.known(node_id)
        if self.evaluator == node_id:
            return True  # asked again (its first answer was lost)
        if self.job.state != JobState.EVALUATING or self.evaluator is not None:
            return False
        if node.role != "worker" or not node.running:
            return False
        self.evaluator = node_id
        self.job.message = f"scoring the held-out split on {node_id}"
        self.job.mirror_state(force=True)
        return True

    def tick(self) -> None:
        """While evaluating: a node of its own scores the held-out split if no worker will
        (or the worker that took it exited without a score), and the job completes once it
        is scored."""
        if self.evaluator is None:
            workers = self.job.nodes.of_role("worker")
            if time.time() >= self._claim_by or not any(w.running for w in workers):
                self.evaluate_on_own_node()
        elif self.evaluator != EVALUATOR_NODE and self.evaluation is None:
            worker = self._evaluator_node()
            if worker is None or worker.exit_code is not None:
                self.evaluate_on_own_node()
        if self.evaluation_over():
            self.complete()

    def _evaluator_node(self) -> NodeInfo | None:
        return self.job.nodes.get(self.evaluator) if self.evaluator else None

    def evaluate_on_own_node(self) -> None:
        """Start the ``evaluator`` node to score the held-out split."""
        self.evaluator = EVALUATOR_NODE
        self.job.message = "scoring the held-out split"
        self.job.nodes.start(EVALUATOR_NODE, "evaluator")
        self.job.mirror_state(force=True)

    def training_resumed(self) -> None:
        """A PS restore may send training back: stop the evaluation (it scores again once
        training is over) and wrap up again."""
        self.started = False
        evaluator = self._evaluator_node()
        if evaluator is not None and evaluator.running:
            self.job.nodes.stop(evaluator)
        self.evaluator = None

    def ready_without_evaluation(self) -> bool:
        """Trained, no held-out split to score, the last checkpoint durable."""
        job = self.job
        return self.started and job.state == JobState.RUNNING and job.checkpointing.durable()

    def evaluation_over(self) -> bool:
        """The evaluator reported and exited, and the last checkpoint is durable."""
        evaluator = self._evaluator_node()
        if self.evaluation is None or evaluator is None or evaluator.exit_code is None:
            return False
        return self.job.checkpointing.durable()

    def complete(self) -> None:
        """Save the model from the PS into a folder of its own, publish it as ``model``,
        write the result, and mark the job succeeded."""
        job = self.job
        folder = new_model_folder(job.job_dir)
        client = job.ps_client()
        try:
            rows = client.save(folder)
            ledgers = client.ledgers()
        finally:
            client.close()
        self._write_model_card(folder)
        publish_model(job.job_dir, folder)
        self.result = self._result(rows, ledgers)
        self.result["model_folder"] = str(folder.resolve())  # init_from="previous" loads it
        job.finish(JobState.SUCCEEDED, self._message())

    def _write_model_card(self, folder: Path) -> None:
        atomic_write_json(folder / "model.json", model_card(self.job.spec))

    def _result(self, rows: int, ledgers: list[tuple[set[int], int]]) -> dict[str, Any]:
        job, evaluation = self.job, self.evaluation
        now = time.time()
        # a resumed job whose queue was already done trains nothing: no negative time
        train_s = max(0.0, (self.train_finished_at or now) - (job.train_started_at or now))
        samples = job.queue.done_samples
        this_run = samples - job.samples_resumed
        result = {
            "samples_trained": samples,
            "samples_resumed": job.samples_resumed,
            "samples_trained_this_run": this_run,
            "train_seconds": round(train_s, 3),
            "samples_per_second": round(this_run / train_s, 1) if train_s > 0 else 0.0,
            "auc": evaluation["auc"] if evaluation else None,
            "logloss": evaluation["logloss"] if evaluation else None,
            "eval_samples": evaluation["samples"] if evaluation else 0,
            "embedding_rows": rows,
            "model_dir": str(job.job_dir.model_dir),
            "plan": job.spec.plan.model_dump(),
            "accounting": {
                **job.queue.accounting(),
                "batches": batch_accounting(job.queue.expected_keys(), ledgers),
            },
            # the checkpoint list stays in the status: the result goes to XCom
            "recovery": {
                k: v for k, v in job.recovery_summary().items() if k != "checkpoint_history"
            },
        }
        if job.data_workers.enabled:
            result["data_workers"] = job.data_workers.summary()
        mirror = job.checkpointing.mirror
        if mirror is not None and mirror.last is not None:
            result["durable_checkpoint"] = mirror.last.summary()
        return result

    def _message(self) -> str:
        job = self.job
        message = f"trained {job.queue.done_samples} samples"
        quarantined = job.queue.quarantined_shards()
        if quarantined:
            message += (
                f"; {len(quarantined)} shard(s) quarantined after repeated worker deaths and not "
                f"trained: {[(q['shard_id'], q['start'], q['end']) for q in quarantined]}"
            )
        mirror = job.checkpointing.mirror
        if mirror is not None and (not mirror.flush(timeout=0) or mirror.last_error):
            message += f"; the last checkpoint was not copied to {job.spec.checkpoint_uri}"
        return message


def model_card(spec: JobSpec) -> dict[str, Any]:
    """``model.json``: what a saved model is and how to read it back (the serving export, a
    job continuing it); ``preprocess`` when its features were preprocessed."""
    features = spec.resolved_features
    card: dict[str, Any] = {
        "job_id": spec.job_id,
        "fingerprint": spec.fingerprint,
        "model": spec.model,
        "seed": spec.training.seed,  # untrained ids read as rows seeded by it
        "features": features.model_dump(),
        "embedding_groups": [
            {"name": g.name, "dim": g.dim, "tables": [t.__dict__ for t in g.tables]}
            for g in EmbeddingPlacement.from_features(features).groups
        ],
        "num_ps": spec.plan.num_ps,
        "partitions": [f"ps-{i}.npz" for i in range(spec.plan.num_ps)],
    }
    if spec.preprocess is not None:
        card["preprocess"] = spec.preprocess
    return card
