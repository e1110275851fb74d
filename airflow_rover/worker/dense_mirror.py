"""The worker's copy of the dense weights, kept equal to the PS's without reading them back."""

from __future__ import annotations

import numpy as np

from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.rpc.ps_client import DenseReply
from airflow_rover.worker.ps_model import PSModel

REFRESH_EVERY = 4
"""While other workers change the dense weights, a worker takes their updates at most every
this many steps (``DenseMirror.request``)."""


class DenseMirror:
    """The worker's copy of the dense weights and their optimizer state, kept equal to the PS's.

    After each push the worker applies its own dense gradients locally with the PS's optimizer
    (the same NumPy code on the same float32 bytes, so the result is bit-identical). When no
    other worker pushed in between, the PS's dense version is the one the worker expects and
    nothing travels back; otherwise the PS sends its values and state and the copy is replaced.
    One worker thus moves its dense gradients once per step instead of gradients + weights,
    and applies them while the PushPull is in flight (``apply_early``).

    While other workers push too, every reply would bring the weights (values and state) anew;
    the worker asks for them only every ``refresh_every``-th step (``request``) and in between
    applies its own gradients to its copy, with its own copy of the optimizer state: its steps
    then miss the other workers' dense updates of up to ``refresh_every`` steps (never its
    own), and the next refresh replaces values and state with the PS's.
    The model reads these values as inputs of its step function (nothing is assigned).
    """

    def __init__(
        self, model: PSModel, optimizer: Optimizer, refresh_every: int = REFRESH_EVERY
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.refresh_every = max(1, refresh_every)
        self.owner = {name: model.ps.dense_owner(name) for name in model.var_names}
        self._owners = set(self.owner.values())
        self.values: dict[str, np.ndarray] = {}
        self.state: dict[str, dict[str, np.ndarray]] = {}
        self.versions = [-1] * model.ps.num_ps  # -1: nothing known yet, the PS sends it all
        self._last_fresh = True  # whether the last reply asked for brought newer weights
        self._asking = True  # whether the PushPull in flight asks for the PS's weights
        self._skipped = 0  # PushPulls since the last one that asked

    def expected(self, pushing: bool) -> list[int]:
        """The versions each PS will have after this worker's push, if nobody else pushes."""
        return [
            v + 1 if pushing and v >= 0 and i in self._owners else v
            for i, v in enumerate(self.versions)
        ]

    def request(self, pushing: bool) -> tuple[list[int], bool]:
        """For the next PushPull: ``expected(pushing)``, and whether it asks for the PS's
        weights. It does while any are unknown, while the last reply that asked brought none
        (one worker: nothing is sent then anyway, and the copy stays exact) and otherwise on
        every ``refresh_every``-th PushPull."""
        self._asking = (
            not self.values
            or min(self.versions) < 0
            or not self._last_fresh
            or self._skipped + 1 >= self.refresh_every
        )
        self._skipped = 0 if self._asking else self._skipped + 1
        return self.expected(pushing), self._asking

    def apply_early(self, own: dict[str, np.ndarray]) -> bool:
        """Apply ``own`` (this step's dense gradients) while the PushPull is still in flight,
        when its reply brings no newer weights: it does not ask for them, or the last reply
        that asked brought none (one worker, or nobody else pushed), so most likely this one
        brings none either, and the update overlaps the wait for it.
        Returns whether it did (then ``after_reply`` applies ``own`` only on fresh values)."""
        if (self._asking and self._last_fresh) or not self.values:
            return False
        for name in self.owner:
            self.optimizer.apply(self.values[name], self.state[name], own[name])
        return True

    def after_reply(
        self, reply: DenseReply, own: dict[str, np.ndarray] | None, applied: bool = False
    ) -> None:
        """Take a PushPull's reply, then apply ``own`` (gradients the reply cannot include yet:
        they travel with the next push); ``applied``: ``apply_early`` applied it already, to
        the values before the reply (replaced now where the reply is fresh)."""
        for name, ps in self.owner.items():
            if reply.fresh[ps]:
                self.values[name] = np.array(reply.values[name])
                self.state[name] = {k: np.array(v) for k, v in reply.state.get(name, {}).items()}
            if own is not None and (reply.fresh[ps] or not applied):
                self.optimizer.apply(self.values[name], self.state[name], own[name])
        if self._asking:
            self._last_fresh = any(reply.fresh[ps] for ps in self._owners)
        self.versions = list(reply.versions)

    def pushed(self) -> None:
        """A plain push of gradients already applied here has landed."""
        self.versions = self.expected(pushing=True)
