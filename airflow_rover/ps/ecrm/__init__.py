"""ECRM on a running PS process (ECRM section 3): parity of the other PS's rows, difference
propagation after each applied push, and the rebuild of a lost PS while training goes on.

``core.ecrm`` has the coding (placement, codecs, propagation, decode plans, the chunked
rebuild state machine); this package runs it over gRPC between PS processes. Every call is one
``Ecrm`` RPC whose ``op`` picks the operation (``EcrmPeer.handle``):

- ``setup`` (master, every PS, before training): the placement (``k``), the PS addresses and
  incarnations. Each PS then sends its batch ledger to its parity holders, so a holder knows
  every batch a source has applied (a replacement's ledger is what its holders know).
- ``encode`` (master, every PS, after a restore): re-encode the parity this PS holds from the
  restored rows of its sources, before any worker trains.
- ``rebuild`` (master, a replacement PS started empty): fence the dead incarnation at the
  holders (they hand back its ledger and the last replica of its dense variables) while its
  sources re-point their channels at it and say which rows they have (one round trip), and
  rebuild it chunk by chunk in a thread (``Replacement``).
- ``parity`` (a source, in order per holder), ``parity_read``, ``applied``, ``fence``,
  ``rollback``, ``reset_holder``, ``created``, ``fields``, ``lock``, ``unlock``, ``status``.

Threads: the PS's apply lock covers a push, its propagation and the update buffer (so a
lock's ``sent()`` watermark is exact); the holder's lock covers its ``ParityStore``. A sender
thread per holder delivers the messages in order and retries until the holder (or its
replacement, which re-points the channel) takes them. Dense variables are small and updated
by every push, so instead of coding them each PS copies them to its first holder every
``DENSE_REPLICA_S`` (the paper recovers them from a worker; a replica up to that old is a state
asynchronous training could have reached).

Modules: ``channels`` (``Peers``, ``ParityChannel``), ``holder`` (``ParityHolder``: the parity
this PS holds and the ops on it), ``peer`` (``EcrmPeer``: propagation, the update buffer, the
op dispatch, degraded reads), ``positional`` (``PositionalRows``: a table of raw ids, coded by
row position) and ``replacement`` (``Replacement``: the rebuild).
"""

from airflow_rover.ps.ecrm.peer import EcrmPeer
from airflow_rover.ps.ecrm.replacement import Replacement

__all__ = ["EcrmPeer", "Replacement"]
