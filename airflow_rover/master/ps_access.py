"""The master's calls on its parameter servers: a client of the current PS set per call, with
the errors a PS that is down (or not up yet) raises turned into ``PsUnreachable``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import grpc

from airflow_rover.core.job_tls import JobTLS
from airflow_rover.core.policies import PsCalls, PsUnreachable
from airflow_rover.rpc.ps_client import PSClient

log = logging.getLogger(__name__)


class PsAccess:
    """Clients of the job's PS; ``addresses`` raises LookupError while they are not all up."""

    def __init__(
        self, addresses: Callable[[], list[str]], token: str, tls: JobTLS | None = None
    ) -> None:
        """``tls``: the job's certificate, the only one its PS are trusted with."""
        self._addresses = addresses
        self._token = token
        self._tls = tls

    def addresses(self) -> list[str]:
        """Every PS's address; LookupError while they are not all up."""
        return self._addresses()

    def client(self) -> PSClient:
        """A client of every PS (close it); LookupError while they are not all up."""
        return self.client_of(self._addresses())

    def client_of(self, addresses: list[str]) -> PSClient:
        """A client of the PS at ``addresses`` (a resize's old and new PS together)."""
        return PSClient(addresses, self._token, tls=self._tls)

    @contextlib.contextmanager
    def calls(self) -> Iterator[PsCalls]:
        """A client for the block; a PS not up or not answering raises ``PsUnreachable``."""
        try:
            client = self.client()
        except LookupError as exc:
            raise PsUnreachable(str(exc)) from exc
        try:
            yield client
        except grpc.RpcError as exc:
            raise PsUnreachable(str(exc)) from exc
        finally:
            client.close()

    def applied_everywhere(self, purpose: str) -> set[int] | None:
        """The batch keys every PS has applied, or None (logged) if a PS cannot say."""
        try:
            with self.calls() as ps:
                ledgers = ps.ledgers()
        except PsUnreachable as exc:
            log.warning("PS ledgers unreadable (%s); %s", exc.__cause__ or exc, purpose)
            return None
        return set.intersection(*(applied for applied, _ in ledgers))
