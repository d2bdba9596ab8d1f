"""How many warps of a kernel one SM holds: the budgets of shared memory, registers and warps.

``sm_budget(device)`` reads an SM's budgets from the device attributes a benchmark file
records; ``resident_warps(info, d, regs, budget)`` is how many warps of a version's blocks
fit in them (threads, shared memory with what the driver keeps back per block, and
registers allocated to a warp in units of 256). Chapters 5 and 7 print it beside the
occupancy Nsight Compute measured (``flashref.recorded.kernel_runs.occupancy_lines``).
The standard library only.
"""

from __future__ import annotations

__all__ = ["REG_UNIT", "sm_budget", "resident_warps"]

REG_UNIT = 256  # registers are allocated to a warp in units of 256


def sm_budget(device: dict) -> dict[str, int]:
    """An SM's budgets from the device attributes a benchmark file records
    (``meta["ceilings"]["device"]``): shared memory (and what the driver keeps back per
    block), registers and warps."""
    need = (
        "smem_per_sm_bytes",
        "smem_per_block_optin_bytes",
        "registers_per_sm",
        "max_threads_per_sm",
    )
    missing = [k for k in need if not isinstance(device, dict) or k not in device]
    if missing:
        raise ValueError(f"device has no {missing[0]!r}; expected the recorded device attributes")
    return {
        "smem": device["smem_per_sm_bytes"],
        "smem_reserved": device["smem_per_sm_bytes"] - device["smem_per_block_optin_bytes"],
        "registers": device["registers_per_sm"],
        "warps": device["max_threads_per_sm"] // 32,
    }


def resident_warps(info, d: int, regs: int, budget: dict) -> int:
    """Warps per SM that threads, shared memory and registers allow a version's blocks.

    ``info`` is a version (``threads``, ``smem_bytes(d)``), ``regs`` its registers per
    thread, ``budget`` :func:`sm_budget` (optionally with ``"blocks"``, the most blocks
    per SM).
    """
    if isinstance(regs, bool) or not isinstance(regs, int) or not 0 < regs <= 255:
        raise ValueError(f"regs = {regs!r}; expected registers per thread, 1 to 255")
    for key in ("smem", "smem_reserved", "registers", "warps"):
        if key not in budget:
            raise ValueError(f"budget has no {key!r}; expected sm_budget(device)")
    warps = info.threads // 32  # per block
    per_warp = -(-regs * 32 // REG_UNIT) * REG_UNIT  # rounded up to the allocation unit
    blocks = min(
        budget["warps"] // warps,
        budget["smem"] // (info.smem_bytes(d) + budget["smem_reserved"]),
        budget["registers"] // per_warp // warps,
        budget.get("blocks", budget["warps"]),
    )
    return blocks * warps
