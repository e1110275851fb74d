"""Operators: validate, name and launch jobs, then defer to a trigger."""
