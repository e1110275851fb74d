"""Sensors: let downstream tasks start on a job's milestone instead of on its completion."""
