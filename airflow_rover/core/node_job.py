"""What a job's checkpoint policy is told of its job in a PS or worker process."""

from __future__ import annotations

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.policies import NodeJob
from airflow_rover.core.spec import JobSpec


def node_job(spec: JobSpec, job_dir: JobDir) -> NodeJob:
    """The job as its policy's node hooks see it: the PS count, the seed, the rows of each
    embedding group."""
    groups = EmbeddingPlacement.from_features(spec.resolved_features).groups
    vocab = {g.name: g.vocab_size for g in groups}
    raw = frozenset(g.name for g in groups if g.index == "ids")
    return NodeJob(job_dir, spec.plan.num_ps, spec.training.seed, vocab, raw)
