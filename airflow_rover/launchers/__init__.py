"""Where a job's processes run: local processes (the embedded default) or Kubernetes pods."""
