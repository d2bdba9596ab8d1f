"""Checkers for the book's exercises.

Each ``check_*`` function runs a reader's function on ordinary and adversarial
inputs, compares with flashref's float64 reference, and returns a
``CheckResult``: it prints as a short report saying which case failed (shape,
parameters, row), expected against got, and, where the error matches a known
mistake (no rescaling, rescaling the wrong way, off-by-one tile bounds, wrong
causal alignment, float32 precision...), the mistake's name. ``bool(result)`` is
True when every case passed.

All of them follow one set of rules: ``fn`` must be callable (TypeError otherwise,
before anything runs); each case is a separate call, whose exception or
``NotImplementedError`` is reported while the other cases still run, and whose
warnings are recorded, not raised; the answer must be a plain numpy array (a
float for the weighted sum, a state for the merge, an integer array of positions
or of heads, or a pair ``(O, lse)`` for the ring and the combine step), and anything
else is refused with a report line saying what came back (see ``_answer``).

    from flashref.exercises import check_online_softmax
    check_online_softmax(my_online_softmax)
"""

from __future__ import annotations

import importlib

from ._report import CheckResult, Failure

# checker name -> submodule that defines it (loaded on first use)
_CHECKERS = {
    "check_safe_softmax": "softmax",
    "check_online_softmax": "softmax",
    "check_streaming_weighted_sum": "state",
    "check_merge_states": "state",
    "check_one_query_attention": "attention",
    "check_tiled_attention": "attention",
    "check_backward_tile": "backward",
    "check_tiled_backward": "backward",
    "check_held_positions": "ring",
    "check_zigzag_positions": "ring",
    "check_device_step": "ring",
    "check_combine_splits": "decode",
    "check_gqa_heads": "decode",
    "check_paged_gather": "decode",
    "check_mma_fragment": "mma",
    "check_wgmma_accumulator": "hopper",
    "check_swizzle_offset": "hopper",
    "check_ring_parity": "hopper",
    "check_producer_wait": "hopper",
    "check_wait_group": "hopper",
    "check_crossing_memory": "traffic",
    "check_q_outer_traffic": "traffic",
    "check_l2_fit": "traffic",
    "check_warp_tiles": "beyond",
    "check_lazy_update": "beyond",
    "check_l2_walk": "beyond",
    "check_window_tiles": "variants",
    "check_sink_grad": "variants",
    "check_softcap_grad": "variants",
}

__all__ = ["CheckResult", "Failure", *_CHECKERS]


def __getattr__(name: str):
    if name in _CHECKERS:
        module = importlib.import_module(f".{_CHECKERS[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, checkers included though they load on first use (tab completion)."""
    return sorted(__all__)
