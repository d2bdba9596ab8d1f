"""Every kernel compiles with nvcc for Hopper, and the tensor-core ones do not spill.

Needs no GPU, only the CUDA compiler (marker ``nvcc``; skipped with a reason
when nvcc is not on PATH). The compiler's resource report (registers, shared
memory, spills) is printed, so ``pytest -s -m nvcc`` shows it for every version.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest

from flashref.gpu import BWD_VERSIONS, KERNEL_DIR, VERSIONS
from flashref.gpu.backward_versions import PRE_POST_FILE, pre_post_source
from flashref.gpu.decode import VERSIONS as DECODE_VERSIONS
from flashref.gpu.registry import COMMON_DIR

pytestmark = pytest.mark.nvcc

# The tensor-core versions keep every fragment in registers, except where a version's header
# says it does not: these (version, d) pairs spill a few bytes at 255 registers, and their
# resource report is printed like the others' (chapter 5 prints it too).
KNOWN_SPILLS = {(13, 128), (16, 64), (17, 128)}

# Versions for an architecture-specific target (sm_90a) have their own case below.
CASES = [
    (ver, d, dt)
    for ver in VERSIONS.values()
    if not ver.arch
    for dt in ver.dtypes
    for d in (64, 128)
]


def _compile(ver, d: int, dtype: str, tmp_path) -> str:
    """nvcc on exactly the text NVRTC is given (headers pasted in), with the same defines."""
    src = tmp_path / ver.file
    src.write_text(ver.source())
    out = tmp_path / f"v{ver.number}_d{d}_{dtype}.cubin"
    cmd = ["nvcc", "-arch=sm_90", "-cubin", "--resource-usage", *ver.defines(d, dtype)]
    cmd += ["-o", str(out)]
    proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} {ver.file} failed:\n{proc.stderr}"
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("ver,d,dtype", CASES, ids=[f"v{v.number}-d{d}-{dt}" for v, d, dt in CASES])
def test_kernel_compiles_for_sm90(ver, d, dtype, tmp_path):
    report = _compile(ver, d, dtype, tmp_path)
    regs = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    stack = re.search(r"(\d+) bytes stack frame", report)
    assert regs and spills and stack, f"no resource report in nvcc output:\n{report}"
    print(
        f"\nv{ver.number} {ver.file} d={d} {dtype}: {regs.group(1)} registers, "
        f"{ver.smem_bytes(d)} bytes dynamic shared memory, stack {stack.group(1)} B, "
        f"spill stores {spills.group(1)} B, spill loads {spills.group(2)} B"
    )
    if ver.dtype != "float32" and (ver.number, d) not in KNOWN_SPILLS:
        assert spills.group(1) == spills.group(2) == "0", report
        assert stack.group(1) == "0", report


@pytest.mark.parametrize("name", ["probe_fragments.cu"])
def test_probe_compiles_for_sm90(name, tmp_path):
    """Kernels that tests launch to read register layouts (not versions): they compile."""
    path = KERNEL_DIR / "probes" / name
    cmd = ["nvcc", "-arch=sm_90", "-cubin", "--resource-usage", "-o", str(tmp_path / "probe.cubin")]
    proc = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} {name} failed:\n{proc.stderr}"
    print(f"\n{name}:\n{proc.stdout + proc.stderr}")


DECODE_CASES = [
    (ver, d, rt, dt)
    for ver in sorted(DECODE_VERSIONS)
    for d in (64, 128)
    for rt in (1, 2)
    for dt in ("float16", "bfloat16")
]


@pytest.mark.parametrize(
    "version,d,row_tiles,dtype",
    DECODE_CASES,
    ids=[f"v{v}-d{d}-rows{16 * r}-{dt}" for v, d, r, dt in DECODE_CASES],
)
def test_decode_kernel_compiles_without_spills(version, d, row_tiles, dtype, tmp_path):
    """Each split-KV decode version and its combine kernel, as flashref.gpu.decode compiles them."""
    from flashref.gpu import decode

    ver = decode.VERSIONS[version]
    split_name, combine_name = ver.split_kernel, ver.combine_kernel
    src = tmp_path / ver.file
    src.write_text(decode.source(version))
    out = tmp_path / f"decode_v{version}_d{d}_r{row_tiles}_{dtype}.cubin"
    arch = SM90A if version in decode.SM90A_VERSIONS else ["-arch=sm_90"]  # v5: TMA, sm_90a
    cmd = ["nvcc", *arch, "-cubin", "--resource-usage"]
    cmd += [*decode.defines(d, row_tiles, dtype), "-o", str(out), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    report = proc.stdout + proc.stderr
    for name in (n for n in (split_name, combine_name) if n):  # version 4: no combine kernel
        part = report[report.index(f"'{name}'") :]
        regs = re.search(r"Used (\d+) registers", part)
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", part)
        stack = re.search(r"(\d+) bytes stack frame", part)
        assert regs and spills and stack, f"no resource report for {name}:\n{report}"
        print(
            f"\n{name} d={d} rows={16 * row_tiles} {dtype}: {regs.group(1)} registers, "
            f"stack {stack.group(1)} B, spill stores {spills.group(1)} B, "
            f"spill loads {spills.group(2)} B"
        )
        assert spills.group(1) == spills.group(2) == stack.group(1) == "0", report
    blocks = decode.blocks_per_sm(version, d, row_tiles)  # what the launch bounds promise
    assert decode.smem_bytes(d, row_tiles, version) * blocks <= 228 * 1024 - blocks * 1024


@pytest.mark.parametrize("version", [5, 6, 7], ids=["v5", "v6", "v7"])
@pytest.mark.parametrize("d,row_tiles", [(64, 1), (64, 2), (128, 1), (128, 2)])
def test_decode_v5_ring_is_the_plans(version, d, row_tiles, tmp_path):
    """The STAGES and BLOCKS of versions 5 to 7 (each kernel file's, after the preprocessor)
    are flashref.gpu.decode's STAGES_V5 and BLOCKS_V5, which their shared memory and launch
    bounds use."""
    from flashref.gpu import decode

    probe = tmp_path / "probe.cu"
    probe.write_text(
        decode.source(version) + "\nint stages_probe = STAGES, blocks_probe = BLOCKS;\n"
    )
    cmd = ["nvcc", *SM90A, "-E", *decode.defines(d, row_tiles, "float16")]
    proc = subprocess.run([*cmd, str(probe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = re.search(r"int stages_probe = (\d+), blocks_probe = (\d+);", proc.stdout)
    assert got, "probe line not found in the preprocessed text"
    want = (decode.STAGES_V5[(d, row_tiles)], decode.BLOCKS_V5[(d, row_tiles)])
    assert (int(got[1]), int(got[2])) == want, f"d={d} rows={16 * row_tiles}: {got.groups()}"


def _kernel_params(text: str, name: str) -> list[str]:
    """The parameter declarations of kernel ``name`` in preprocessed text (no comments left)."""
    starts = [m.end() for m in re.finditer(rf"\b{name}\s*\(", text)]
    assert len(starts) == 1, f"{name}( found {len(starts)} times in the preprocessed text"
    params, depth, cur = [], 0, ""
    for ch in text[starts[0] :]:
        if ch == ")" and depth == 0:
            break
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            params.append(" ".join(cur.split()))
            cur = ""
        else:
            cur += ch
    return [*params, " ".join(cur.split())]


class _Map:
    """A stand-in for a TMA descriptor: what tensor_map_of was asked for."""

    def __init__(self, x2, box_rows):
        self.shape, self.box_rows = x2.shape, box_rows


# A pointer parameter's pointee -> the dtype of the array passed for it (fp16 here).
POINTEE = {"half_t": "float16", "float": "float32", "int": "int32", "unsigned": "uint32"}


def _mismatch(param: str, arg, unread: tuple[str, ...] = ()) -> str | None:
    """Why ``arg`` cannot be what CuPy passes for the kernel parameter ``param``, or None.
    A pointer named in ``unread`` (the partials at S = 1) is not dereferenced: any array."""
    import numpy as np

    if "*" in param:
        pointee = param.split("*")[0].replace("const", "").split()[-1]
        if isinstance(arg, np.uintp):  # a null pointer (no block table, no lengths)
            return None if int(arg) == 0 else f"an address {int(arg)}"
        if not isinstance(arg, np.ndarray):
            return f"a {type(arg).__name__}, not an array"
        if param.split()[-1] in unread or str(arg.dtype) == POINTEE[pointee]:
            return None
        return f"an array of {arg.dtype}"
    if "TensorMap" in param:
        return None if isinstance(arg, _Map) else f"a {type(arg).__name__}, not a tensor map"
    scalar = {"int": np.int32, "float": np.float32}[param.split()[0]]
    return None if type(arg) is scalar else f"a {type(arg).__name__}, not {scalar.__name__}"


@functools.cache
def _decode_text(version: int) -> str:
    """Version ``version``'s text after the preprocessor (d = 64, 16 rows, fp16), as NVRTC
    sees it: which parameters each kernel has depends on the defines."""
    import tempfile
    from pathlib import Path

    from flashref.gpu import decode

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "decode.cu"
        src.write_text(decode.source(version))
        arch = SM90A if version in decode.SM90A_VERSIONS else ["-arch=sm_90"]
        cmd = ["nvcc", *arch, "-E", *decode.defines(64, 1, "float16"), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("version", sorted(DECODE_VERSIONS), ids=lambda v: f"v{v}")
def test_decode_launch_passes_each_kernel_its_parameters(version, monkeypatch):
    """flashref.gpu.decode.launch, with NumPy standing in for CuPy and recording kernels, passes
    every kernel exactly the parameters it declares, in order and of the right kind: versions 4
    and 5 the counters, versions 5 and 6 K and V's tensor maps (version 6 with a combine
    kernel and no counters); the combine kernel runs after the split kernel when S > 1 only."""
    import sys
    import types

    import numpy as np

    from flashref.gpu import decode
    from flashref.gpu.decode import buffers as decode_buffers
    from flashref.gpu.decode import launch as decode_launch

    calls = []

    def kernel(name):
        def run(grid, block, args, **kw):
            calls.append((name, grid, block, args, kw))

        return run

    def functions(cp, d, tiles, dtype, smem, v):
        ver = decode.VERSIONS[v]
        return kernel(ver.split_kernel), (
            kernel(ver.combine_kernel) if ver.combine_kernel else None
        )

    fake_launch = types.ModuleType("flashref.gpu._launch")
    fake_launch.as_kernel_input = lambda x, shape: np.ascontiguousarray(x).reshape(shape)
    fake_launch.tensor_map_of = _Map
    device, stream = types.SimpleNamespace(id=0), types.SimpleNamespace(ptr=0)
    cuda = types.SimpleNamespace(Device=lambda: device, get_current_stream=lambda: stream)
    cp = types.SimpleNamespace(
        empty=np.empty,
        zeros=np.zeros,
        float32=np.float32,
        uint16=np.uint16,
        uint32=np.uint32,
        cuda=cuda,
    )
    monkeypatch.setitem(sys.modules, "flashref.gpu._launch", fake_launch)
    monkeypatch.setattr(decode_launch, "kernels", functions)
    monkeypatch.setattr(decode_buffers, "_counters", {})  # never the real (GPU) buffers
    monkeypatch.setattr(decode_buffers, "_partials", {})

    text = _decode_text(version)
    split_name, combine_name = (
        decode.VERSIONS[version].split_kernel,
        decode.VERSIONS[version].combine_kernel,
    )
    B, Hq, Hkv, Nq, Nk, d = 2, 8, 2, 1, 256, 64
    q = np.zeros((B, Hq, Nq, d), np.float16)
    k = np.zeros((B, Hkv, Nk, d), np.float16)
    kp = np.zeros((2 * Nk // 64, Hkv, 64, d), np.float16)  # pages of 64 keys
    lengths = np.array([Nk, 100], np.int32)
    table = np.arange(2 * Nk // 64, dtype=np.int32).reshape(B, Nk // 64)
    for S in (1, 3):
        plan = decode.decode_plan(B, Hq, Hkv, Nq, Nk, d, 132, num_splits=S, version=version)
        common = {"Hkv": Hkv, "causal": False, "scale": 0.125, "plan": plan}
        for what, (K, bt, ps, pages) in {
            "contiguous": (k, None, Nk, 1),
            "paged": (kp, table, 64, Nk // 64),
        }.items():
            calls.clear()
            decode_launch.launch(cp, q, K, K, bt, lengths, page_size=ps, max_pages=pages, **common)
            names = [c[0] for c in calls]
            want = [split_name] + ([combine_name] if combine_name and S > 1 else [])
            assert names == want, f"v{version} {what} S={S}: launched {names}, expected {want}"
            for name, grid, block, args, kw in calls:
                params = _kernel_params(text, name)
                label = f"v{version} {what} S={S} {name}"
                assert len(args) == len(params), (
                    f"{label}: {len(args)} arguments for {len(params)} parameters {params}"
                )
                unread = ("O_part", "lse_part") if S == 1 else ()  # O and lse stand in for them
                for i, (param, arg) in enumerate(zip(params, args, strict=True)):
                    why = _mismatch(param, arg, unread)
                    assert why is None, f"{label}: argument {i} for '{param}' is {why}"
                if name == split_name:
                    assert (grid, block) == (plan.grid, (plan.threads,)), label
                    assert kw == {"shared_mem": plan.smem_bytes}, label
            maps = [a for a in calls[0][3] if isinstance(a, _Map)]
            if version in decode.SM90A_VERSIONS:  # K and V as (rows, d), 64-row boxes
                rows = K.shape[0] * Hkv * ps
                assert [(m.shape, m.box_rows) for m in maps] == [((rows, d), decode.BC)] * 2


@pytest.mark.parametrize("name", ["roof_hbm_read.cu"])
def test_roof_compiles_for_sm90(name, tmp_path):
    path = KERNEL_DIR / "probes" / name
    cmd = ["nvcc", "-arch=sm_90", "-cubin", "--resource-usage", "-o", str(tmp_path / "r.cubin")]
    proc = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} {name} failed:\n{proc.stderr}"


# Hopper-only kernels: wgmma and setmaxnreg need the sm_90a target (the -gencode form, which
# nvcc 13.0 also accepts where -arch=sm_90a would run a plain sm_90 pass as well).
SM90A = ["-gencode=arch=compute_90a,code=sm_90a"]
HOPPER_CASES = [
    ("probes/probe_wgmma.cu", ()),
    ("probes/probe_wgmma.cu", ("-DFLASHREF_BF16",)),
    ("probes/roof_wgmma.cu", ()),
    ("decode/paged_prefill.cu", ("-DHEAD_DIM=64",)),
    ("decode/paged_prefill.cu", ("-DHEAD_DIM=128", "-DFLASHREF_BF16")),
    ("decode/paged_cache.cu", ()),
]


def _nvcc(path, arch, defines, tmp_path):
    cmd = ["nvcc", *arch, "-cubin", "-Xptxas", "-v", f"-I{COMMON_DIR}", f"-I{KERNEL_DIR}", *defines]
    cmd += ["-o", str(tmp_path / "k.cubin"), str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return cmd, proc


@pytest.mark.parametrize(
    "name,defines",
    HOPPER_CASES,
    ids=["probe-fp16", "probe-bf16", "roof", "prefill-d64", "prefill-d128-bf16", "cache"],
)
def test_hopper_kernels_compile_for_sm90a(name, defines, tmp_path):
    """Every kernel of the file builds for sm_90a without spills or a stack frame."""
    cmd, proc = _nvcc(KERNEL_DIR / name, SM90A, defines, tmp_path)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{report}"
    print(f"\n{name} {' '.join(defines)}:\n{report}")
    kernels = re.findall(r"Compiling entry function '(\w+)'", report)
    frames = re.findall(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill", report
    )
    assert kernels and len(frames) == len(kernels), report
    assert all(f == ("0", "0", "0") for f in frames), report
    assert "C7510" not in report and "serialized" not in report, report  # wgmma not serialized
    if name == "probe_wgmma.cu":
        assert len(kernels) == 8, kernels


HOPPER_VERSION_CASES = [
    (ver, d, dt)
    for ver in (*VERSIONS.values(), *BWD_VERSIONS.values())  # forward and backward versions
    if ver.arch
    for dt in ver.dtypes
    for d in (64, 128)
    if d in ver.head_dims
]


def _tag(ver) -> str:
    return f"bwd{ver.number}" if ver.kernel.startswith("flash_bwd") else f"v{ver.number}"


@pytest.mark.parametrize(
    "ver,d,dtype",
    HOPPER_VERSION_CASES,
    ids=[f"{_tag(v)}-d{d}-{dt}" for v, d, dt in HOPPER_VERSION_CASES],
)
def test_hopper_version_compiles_for_sm90a(ver, d, dtype, tmp_path):
    """The text NVRTC is given, for the version's own target: no spills, wgmma not serialized."""
    assert ver.arch == "sm_90a"
    src = tmp_path / ver.file
    src.write_text(ver.source())
    cmd, proc = _nvcc(src, SM90A, ver.defines(d, dtype), tmp_path)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{report}"
    regs = re.search(r"Used (\d+) registers", report)
    frame = re.search(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill", report
    )
    assert regs and frame, f"no resource report in nvcc output:\n{report}"
    print(
        f"\n{_tag(ver)} {ver.file} d={d} {dtype}: {regs.group(1)} registers, "
        f"{ver.smem_bytes(d)} bytes dynamic shared memory, stack {frame.group(1)} B, "
        f"spill stores {frame.group(2)} B, spill loads {frame.group(3)} B"
    )
    assert frame.groups() == ("0", "0", "0"), report
    assert int(regs.group(1)) * ver.threads <= 64 * 1024, report  # one block fits an SM
    assert "C7510" not in report and "serialized" not in report, report
    if "setmaxnreg_inc<" in ver.path.read_text():
        _check_register_split(ver, int(regs.group(1)), report)


def _check_register_split(ver, regs: int, report: str) -> None:
    """setmaxnreg (PTX ISA): budgets are multiples of 8 in 24..256, and the warpgroups' budgets
    after it fit in what the block was given at launch: ptxas caps every thread at entry at
    65536 / threads rounded down to 8 (from __launch_bounds__(threads, 1)), and that whole
    allocation is what the producer gives back and the consumers take."""
    text = ver.path.read_text()
    producer = int(re.search(r"#define PRODUCER_REGS (\d+)", text)[1])
    consumer = int(re.search(r"#define CONSUMER_REGS (\d+)", text)[1])
    n_consumer_wg = int(re.search(r"#define NWG (\d+)", text)[1])
    assert ver.threads == 128 * (n_consumer_wg + 1), (ver.threads, n_consumer_wg)
    assert "__launch_bounds__(NTHREADS, 1)" in text
    for budget in (producer, consumer):
        assert budget % 8 == 0 and 24 <= budget <= 256, budget
    entry = (64 * 1024 // ver.threads) // 8 * 8
    assert regs == entry, f"ptxas gave {regs} registers at entry, expected {entry}:\n{report}"
    assert producer <= entry <= consumer, (producer, entry, consumer)
    assert 128 * (producer + n_consumer_wg * consumer) <= entry * ver.threads, (
        f"{_tag(ver)}: 128 x ({producer} + {n_consumer_wg} x {consumer}) registers after "
        f"setmaxnreg > {entry} x {ver.threads} at launch"
    )


def test_d64_only_version_refuses_other_head_dims(tmp_path):
    """A version offered at d = 64 alone stops at compile time for any other d."""
    d64_only = [ver for ver in VERSIONS.values() if ver.arch and ver.head_dims == (64,)]
    assert d64_only, "no sm_90a version is offered at d = 64 alone"
    for ver in d64_only:
        src = tmp_path / ver.file
        src.write_text(ver.source())
        _, proc = _nvcc(src, SM90A, ver.defines(128, "float16"), tmp_path)
        assert proc.returncode != 0, f"v{ver.number} compiled at d = 128"
        assert f"version {ver.number} is written for d = 64 only" in proc.stderr, proc.stderr


def test_hopper_header_refuses_plain_sm90(tmp_path):
    """Without the 'a' target, wgmma does not assemble: the failure is loud, not silent."""
    _, proc = _nvcc(KERNEL_DIR / "probes" / "probe_wgmma.cu", ["-arch=sm_90"], (), tmp_path)
    assert proc.returncode != 0
    assert "not supported on .target 'sm_90'" in proc.stderr, proc.stderr
    _, proc = _nvcc(KERNEL_DIR / "probes" / "probe_wgmma.cu", ["-arch=sm_80"], (), tmp_path)
    assert proc.returncode != 0 and "need a Hopper target" in proc.stderr, proc.stderr


# The backward versions and their shared preprocess/convert kernels: every (version, d, dtype)
# compiles without spills; the report is printed as for the forward.
# (The sm_90a ones are among HOPPER_VERSION_CASES above, compiled for their own target.)
BWD_CASES = [
    (ver, d, dt)
    for ver in BWD_VERSIONS.values()
    if not ver.arch
    for dt in ver.dtypes
    for d in (64, 128)
]


def _compile_source(name: str, source: str, defines, tmp_path) -> str:
    src = tmp_path / name
    src.write_text(source)
    cmd = ["nvcc", "-arch=sm_90", "-cubin", "--resource-usage", *defines]
    cmd += ["-o", str(tmp_path / "bwd.cubin")]
    proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} {name} failed:\n{proc.stderr}"
    return proc.stdout + proc.stderr


def _no_spills(report: str, label: str) -> None:
    kernels = re.findall(r"Compiling entry function '(\w+)'", report)
    regs = re.findall(r"Used (\d+) registers", report)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    stack = re.findall(r"(\d+) bytes stack frame", report)
    assert kernels and len(kernels) == len(regs) == len(spills) == len(stack), report
    for name, r, (st, ld), fr in zip(kernels, regs, spills, stack, strict=True):
        print(f"\n{label} {name}: {r} registers, stack {fr} B, spill stores {st} B, loads {ld} B")
        assert st == ld == fr == "0", f"{label} {name} spills:\n{report}"


# An SM of compute capability 9.0: 65536 registers, handed out per warp in units of 256; 228 KiB
# of shared memory, of which each resident block also takes 1 KiB for the system.
SM_REGISTERS, REG_UNIT, SM_SMEM, BLOCK_SMEM_RESERVED = 65536, 256, 228 * 1024, 1024


def _blocks_that_fit(regs: int, threads: int, smem: int) -> int:
    """Resident blocks per SM that a kernel of ``regs`` registers per thread, ``threads``
    threads and ``smem`` bytes of dynamic shared memory per block allows (registers, memory)."""
    per_warp = -(-regs * 32 // REG_UNIT) * REG_UNIT
    by_registers = SM_REGISTERS // (per_warp * (threads // 32))
    return min(by_registers, SM_SMEM // (smem + BLOCK_SMEM_RESERVED))


def test_blocks_that_fit_counts_registers_per_warp_and_shared_memory():
    assert _blocks_that_fit(168, 128, 65536) == 3  # 168 x 32 = 5376 = 21 units per warp
    assert _blocks_that_fit(178, 128, 65536) == 2  # 178 x 32 rounds up to 5632
    assert _blocks_that_fit(64, 128, 114688) == 2  # shared memory decides
    assert _blocks_that_fit(226, 256, 93184) == 1


@pytest.mark.parametrize(
    "ver,d,dtype", BWD_CASES, ids=[f"bwd{v.number}-d{d}-{dt}" for v, d, dt in BWD_CASES]
)
def test_backward_kernel_compiles_without_spills(ver, d, dtype, tmp_path):
    report = _compile_source(ver.file, ver.source(), ver.defines(d, dtype), tmp_path)
    label = f"bwd{ver.number} {ver.file} d={d} {dtype} ({ver.smem_bytes(d)} B smem)"
    _no_spills(report, label)
    want = dict(ver.blocks_per_sm).get(d)
    if want is not None:  # the registers its __launch_bounds__ promises
        names = re.findall(r"Compiling entry function '(\w+)'", report)
        regs = int(re.findall(r"Used (\d+) registers", report)[names.index(ver.kernel)])
        got = _blocks_that_fit(regs, ver.threads, ver.smem_bytes(d))
        assert got >= want, (
            f"{label}: {regs} registers x {ver.threads} threads leave room for {got} blocks per "
            f"SM; the registry promises {want}"
        )


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_backward_pre_post_compiles(d, dtype, tmp_path):
    ver = next(iter(BWD_VERSIONS.values()))
    report = _compile_source(
        Path(PRE_POST_FILE).name, pre_post_source(), ver.defines(d, dtype), tmp_path
    )
    _no_spills(report, f"{PRE_POST_FILE} d={d} {dtype}")
