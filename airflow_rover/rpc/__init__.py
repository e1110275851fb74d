"""The wire between a job's processes: the master's HTTP API (bodies, client) and the
parameter servers' gRPC service (tensor frames, method names, client). Master, PS, workers and
launchers import it; it imports only ``core``."""
