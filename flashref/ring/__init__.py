"""Ring attention: one sequence sharded over devices, K/V blocks passed round a ring.

``simulate``: the ring on simulated devices in NumPy (``ring_attention``, ``RingSchedule``,
``shard_positions``), what chapter 9 teaches; ``dist``: the same ring on real devices, one
process per device under ``torch.distributed`` (needs torch; ``import flashref`` does not
import it). The launcher and its timing are ``python -m flashref.bench ring``.
"""

from __future__ import annotations

from .simulate import RingSchedule, ring_attention, shard_positions

__all__ = ["RingSchedule", "ring_attention", "shard_positions"]
