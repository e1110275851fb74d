"""Triggers: wait on a job in the triggerer, report its ending as one event."""
