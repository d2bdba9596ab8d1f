"""What every recorded GPU run says about its software: the driver and the CUDA runtime."""

from __future__ import annotations

from ..gpu.backward_versions import BWD_VERSIONS, pre_post_source
from ..gpu.decode.versions import VERSIONS as DECODE_VERSIONS
from ..gpu.forward_versions import VERSIONS


def _cuda_version(v: int) -> str:
    """CUDA's integer version (major * 1000 + minor * 10) as ``major.minor``."""
    return f"{v // 1000}.{v % 1000 // 10}"


def driver_version(runtime) -> str:
    """The NVIDIA driver's version from NVML (``580.159.04``); without pynvml, the CUDA
    version the driver supports, read through ``runtime`` (``cupy.cuda.runtime``)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return driver.decode() if isinstance(driver, bytes) else driver
    except Exception:  # no pynvml, or no NVML on this machine
        return f"CUDA driver API {_cuda_version(runtime.driverGetVersion())}"


def runtime_version(runtime) -> str:
    """The CUDA runtime's version, ``major.minor``."""
    return _cuda_version(runtime.runtimeGetVersion())


def git_commit() -> str:
    """The commit of the checkout this package runs from (with ``+dirty`` where tracked files
    differ from it), or ``"unknown"`` outside a git checkout; ``$FLASHREF_COMMIT`` where set
    (a copy of the tree without its ``.git``, run elsewhere, says its commit so)."""
    import os
    import subprocess
    from pathlib import Path

    if os.environ.get("FLASHREF_COMMIT"):
        return os.environ["FLASHREF_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "-uno"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def source_hash(text: str) -> str:
    """The first 16 hex digits of the SHA-256 of a kernel's source (includes pasted in)."""
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


# Text-only changes: sources whose text (so their hash) changed while the PTX nvcc makes of
# them did not, for every build the PTX snapshot makes of them (python -m flashref.bench
# ptx_snapshot OUT --compare BEFORE, with --entries where kernels a module no longer needed
# were dropped). A results file recorded against the old text still describes
# the kernels it measured. {version: {old hash: new hash}}, each change commented with the
# commit its BEFORE snapshot was taken at and what moved.
SAME_PTX: dict[str, dict[str, str]] = {
    # 1009953: the split-KV pieces of decode versions 2 to 7 moved into split_kv.cuh and
    # split_merge.cuh; versions 2 to 4 byte-identical, versions 5 to 7 the same function by
    # function without the dead kernels of versions 2 to 4
    "decode/2": {"b2eed6b2f0be2280": "1e8598c1dfca388f"},
    "decode/3": {"5514cc1d2928fd8a": "7d17557e30fe0435"},
    "decode/4": {"d4d07ccc50b604f1": "f18e89a249a8766c"},
    # 179f203: the paged pools' row (pool_row) moved into paged_kv.cuh, which versions 5 to 7
    # and the chunked prefill include; their builds byte-identical
    "decode/5": {
        "2361e0481883455b": "a63c054f13320df7",
        "a63c054f13320df7": "2eee25c63f72e820",
        "2eee25c63f72e820": "f9c59ede0a2f5fd9",
    },
    "decode/6": {
        "71625d8291c15c86": "538fb50f0030afdc",
        "538fb50f0030afdc": "aa19b4e9ac1381c8",
        "aa19b4e9ac1381c8": "2ccf11564a30b544",
    },
    "decode/7": {
        "9dc4871da3cec524": "0cd84d08688dd270",
        "0cd84d08688dd270": "e6b605cff9d1072d",
        "e6b605cff9d1072d": "fc062375197593c9",
    },
    # cbfc4a1: the pieces backward versions 1 to 7 share (tile_loads.cuh) and 8 to 19 share
    # (dkdv_loop.cuh) moved into headers; every backward build byte-identical
    "backward/1": {"8468caaf177f868e": "5e5a8cbd43adfad3"},
    "backward/2": {"d251ebdd574f503f": "80a5947ca79765af"},
    "backward/3": {"498b05e56201170c": "cef9ebce58ba3384"},
    "backward/4": {"a8caaeba7a0deb87": "cc65d9a1a56d2f3e"},
    "backward/5": {"09eb49e4268ccdbc": "a8fc2fc837c3e24c"},
    "backward/6": {"6e60ebdc03966e09": "0ae46a411a9632ae"},
    "backward/7": {"72ba33dad0c6a632": "8a8ce6f7b607ce41"},
    "backward/8": {
        "0dd967a690a60491": "d0861ba929d72653",
        "d0861ba929d72653": "bb6906ccb35c126e",
        "bb6906ccb35c126e": "24c34761dd64d8e7",
    },
    "backward/9": {
        "6099c4810a689385": "bd4c67f31477d518",
        "bd4c67f31477d518": "b5ee42245405a791",
        "b5ee42245405a791": "55afbb0d510eea75",
    },
    "backward/10": {
        "3fb674b7218a4dc5": "9db4e0ff160ad488",
        "9db4e0ff160ad488": "78d2b62840e8157d",
        "78d2b62840e8157d": "07ab01b5f3bd3df0",
    },
    "backward/11": {
        "b0eb323d79fbbf9e": "4f20454ce258eaa0",
        "4f20454ce258eaa0": "e52cf050719e9a31",
        "e52cf050719e9a31": "00998cc1a5f7ece5",
    },
    "backward/12": {
        "ddbb874b1dd7481c": "88aab08b2d9fa3c3",
        "88aab08b2d9fa3c3": "b02ae5fa5edbeef6",
        "b02ae5fa5edbeef6": "005ef9fe65f25546",
    },
    "backward/13": {
        "6d644fb00c8f9fe8": "e87c4a071bc7138b",
        "e87c4a071bc7138b": "f556b33589446a97",
        "f556b33589446a97": "b31dfc3c0ae4b58a",
    },
    "backward/14": {
        "a211ca07ce446176": "bfcc1b1fc507e68f",
        "bfcc1b1fc507e68f": "c90569541d091ec1",
        "c90569541d091ec1": "f796a9bd6b604a55",
    },
    "backward/15": {
        "50ec2124d1ec11ae": "fa43898064c87dcb",
        "fa43898064c87dcb": "dcd2edd8ac75c3f3",
        "dcd2edd8ac75c3f3": "1569f3816fcf41cb",
    },
    "backward/16": {
        "e2ff740e4f067535": "743f99b472db3c39",
        "743f99b472db3c39": "f7e6362b7b024c66",
        "f7e6362b7b024c66": "cb1054fb8d8041b1",
    },
    "backward/17": {
        "00871179d98d7372": "2dcd6bbbfb9cb8c3",
        "2dcd6bbbfb9cb8c3": "712fb7407570c6f1",
        "712fb7407570c6f1": "90aea759b9aecdde",
    },
    "backward/18": {
        "381639811a0ada7b": "8d6b5dda0fb0ef1b",
        "8d6b5dda0fb0ef1b": "57d0ffd77d22f154",
        "57d0ffd77d22f154": "427876979b0bad0c",
    },
    "backward/19": {
        "da44a8a9cd9d24ed": "4c593449f204fdd6",
        "4c593449f204fdd6": "f1ef727d804ecc7e",
        "f1ef727d804ecc7e": "65c24ea89df95229",
    },
    # fa268b3: the kernels' comments name the rooms flashref.gpu.models moved to (hardware,
    # gpu.tma), in the Hopper versions and backward 8 to 19 (their second entries above);
    # comments only, every build byte-identical
    "forward/19": {"877f9c5d89fea6e3": "506b259cca61cead", "506b259cca61cead": "8fde89a489f482b3"},
    "forward/20": {"dde8dcc383a2bcd5": "aa57ef54c4c81f2a", "aa57ef54c4c81f2a": "b272724833031299"},
    "forward/21": {"25f8431cf255e601": "c1f733176b7511a7", "c1f733176b7511a7": "50163b53081cfb8a"},
    "forward/22": {"3e884af157b0c4e1": "f2c1c29846d6d6e3", "f2c1c29846d6d6e3": "b7e66e1c17147c9f"},
    "forward/23": {"65d5b0bf2eb4038b": "b6141e79568a951b", "b6141e79568a951b": "daa3624849f657bf"},
    "forward/24": {"f34c907111641402": "f49faf7f9514ec30", "f49faf7f9514ec30": "9c048baa7e9569ef"},
    "forward/25": {"1483531a7e4f59ac": "7c2e5a9508078145", "7c2e5a9508078145": "eebd88f95b812762"},
    "forward/26": {"a70e51cf7791926e": "5a57f5deb55c45f4", "5a57f5deb55c45f4": "a0fe00559a7666ad"},
    "forward/27": {"7a1cc6374ca054c5": "c2612a8855f737bb", "c2612a8855f737bb": "8dc4af66d300de0d"},
    "forward/28": {"1e26744469fab6f6": "ec91a15875e85748", "ec91a15875e85748": "d4468659cd6b64a5"},
    "forward/30": {"245d2e9530c570f2": "6efd7adb072ca552", "6efd7adb072ca552": "0915fb82e89428da"},
    # the merge of 29dff51: the kernels' comments name the rooms that flashref.gpu.models,
    # the prefill and their tests moved to (hopper_common.cuh, tile_scheduler.cuh, the
    # Hopper versions, paged_prefill.cu): the last entry of forward 19 to 30, backward 8 to
    # 19 and decode 5 to 7 above, and the prefill's (by its path); comments only, every
    # build byte-identical
    "forward/29": {"5b30f56ad57884a2": "eaa4249e3d198e67"},
    # and 179f203's paged_kv.cuh (see decode 5 to 7 above): the prefill's second entry
    "decode/paged_prefill.cu": {
        "397ba023322216dc": "62db5eaa3c16cd27",
        "62db5eaa3c16cd27": "36a4bbfbb1bee9e3",
    },
}


# Kernel files that moved since a results file recorded their hash under other_sources:
# {recorded path: path now}, both under flashref/kernels/. The text NVRTC is given did not
# change with the move (the same hash).
MOVED = {"hopper/paged_prefill.cu": "decode/paged_prefill.cu"}


def describes(name: str, recorded: str, now: str | None) -> bool:
    """Whether a hash recorded for ``name`` ("decode/7") describes the tree's source, whose
    hash is ``now``: the same, or carried to it by text-only changes (``SAME_PTX``)."""
    seen = set()
    while recorded != now and recorded in SAME_PTX.get(name, {}) and recorded not in seen:
        seen.add(recorded)
        recorded = SAME_PTX[name][recorded]
    return recorded == now


def kernel_hashes(forward=(), backward=(), decode=()) -> dict[str, str]:
    """``{"forward/29": hash, "backward/8": hash, "decode/7": hash, ...}``: the source hash
    of each version a run measured, as ``current_hashes`` computes it again for the check
    that a recorded file still describes the kernels in the tree
    (``tests/bench/test_provenance.py``)."""
    return {
        name: h for name, h in current_hashes().items() if _wanted(name, forward, backward, decode)
    }


def _wanted(name: str, forward, backward, decode) -> bool:
    family, number = name.split("/")
    return int(number) in {"forward": forward, "backward": backward, "decode": decode}[family]


def current_hashes() -> dict[str, str]:
    """The source hash of every registered version of the three families. A backward
    version's hash covers its preprocess and dQ conversion kernels too."""

    out = {f"forward/{n}": source_hash(v.source()) for n, v in VERSIONS.items()}
    pp = pre_post_source()
    out |= {f"backward/{n}": source_hash(v.source() + pp) for n, v in BWD_VERSIONS.items()}
    out |= {f"decode/{n}": source_hash(v.source()) for n, v in DECODE_VERSIONS.items()}
    return out


def tree(forward=(), backward=(), decode=()) -> dict:
    """``{"commit", "sources"}``: the commit and the source hash of each measured version,
    what every results file records beside its measurements (``"all"`` for a family: every
    registered version)."""
    everything = current_hashes()

    def numbers(family, chosen):
        if chosen == "all":
            return {int(n.split("/")[1]) for n in everything if n.startswith(family + "/")}
        return {int(x) for x in chosen}

    picked = numbers("forward", forward), numbers("backward", backward), numbers("decode", decode)
    sources = {n: h for n, h in everything.items() if _wanted(n, *picked)}
    return {"commit": git_commit(), "sources": sources}


def provenance(cp, torch, *, forward=(), backward=(), decode=()) -> dict:
    """What a results file says about where it came from: the GPU, driver, CUDA runtime,
    CuPy, torch, Python, NumPy, date, the commit, and the source hash of each version
    measured: the one builder of every GPU program's run metadata, which adds its own."""
    import datetime
    import platform

    import numpy

    dev = cp.cuda.Device()
    return {
        "gpu": cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode(),
        "driver": driver_version(cp.cuda.runtime),
        "cuda_runtime": runtime_version(cp.cuda.runtime),
        "cupy": cp.__version__,
        "torch": None if torch is None else torch.__version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "date": datetime.date.today().isoformat(),
        **tree(forward, backward, decode),
    }
