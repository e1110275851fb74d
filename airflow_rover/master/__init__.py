"""The job master: control API, shard dispatch, node supervision."""
