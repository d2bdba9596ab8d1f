"""The host path of every entry point with torch tensors: where it runs, what it allocates,
and that a CUDA graph captures it (GPU tests; they need torch).

- ``torch.cuda.graph`` in its default capture mode, after one eager warm-up call on the
  current stream, captures ``flash_attention``, ``flash_attention_backward``,
  ``decode_attention``, ``paged_decode_attention`` and ``flashref.torch.attention`` forward
  and backward; the replay gives the eager call's bits, and a graph replayed after new values
  are copied into its inputs (and, for decode, longer lengths and new pages in the device
  tables) gives the eager result of the new values. A call that synchronised, copied to the
  host or launched on another stream would break the capture.
- The direct route (contiguous, aligned inputs) and the general route (views to copy first)
  give the same bits; outputs are torch tensors from torch's allocator.
- Device ``lengths`` and ``block_table`` are read where they are and give the host tables'
  results; their shapes and dtypes are checked.
- ``torch.compile(fullgraph=True)`` compiles a block calling ``flashref.torch.attention``
  (no graph break), forward and backward, and ``mode="reduce-overhead"`` runs it.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ft(torch):
    import flashref.torch

    return flashref.torch


def _randn(torch, shape, dtype="float16", seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda").to(getattr(torch, dtype))


def _captured(torch, fn):
    """(graph, outputs) of ``fn()`` captured in default mode after one eager call."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # capture_error_mode="global": any sync or other stream fails
        out = fn()
    return g, out if isinstance(out, tuple) else (out,)


def _same(torch, got, want, what, atomic=()):
    """Equal bits; for the outputs numbered in ``atomic`` (a dQ summed with float32 atomics,
    whose order varies from call to call) equal to within that sum's rounding."""
    want = want if isinstance(want, tuple) else (want,)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}[{i}]"
        if i in atomic:
            size = b.float().abs().max().item()
            err = (a.float() - b.float()).abs().max().item()
            assert err <= 1e-2 * size, f"{what}[{i}]: the replay differs by {err} (size {size})"
        else:
            assert torch.equal(a, b), f"{what}[{i}]: the replay differs from the eager call"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_capture_and_replay_new_values(torch, fg, dtype, causal):
    shape = (2, 4, 200, 64)
    q, k, v, dO = (_randn(torch, shape, dtype, s) for s in range(4))
    O, lse = fg.flash_attention(q, k, v, causal=causal, return_lse=True)
    g_f, out_f = _captured(
        torch, lambda: fg.flash_attention(q, k, v, causal=causal, return_lse=True)
    )
    g_b, out_b = _captured(
        torch, lambda: fg.flash_attention_backward(q, k, v, O, lse, dO, causal=causal)
    )
    g_f.replay()
    g_b.replay()
    torch.cuda.synchronize()
    _same(torch, out_f, (O, lse), "forward")
    want_b = fg.flash_attention_backward(q, k, v, O, lse, dO, causal=causal)
    _same(torch, out_b, want_b, "backward", atomic=(0,))
    for x, s in ((q, 10), (k, 11), (v, 12)):  # new values in the captured inputs
        x.copy_(_randn(torch, shape, dtype, s))
    g_f.replay()
    torch.cuda.synchronize()
    _same(torch, out_f, fg.flash_attention(q, k, v, causal=causal, return_lse=True), "new")


def test_grouped_heads_and_a_negative_scale_capture(torch, fg):
    # the general route (CuPy operations inside torch's stream and allocator)
    q = _randn(torch, (1, 8, 40, 64), "float16", 1)
    k, v = (_randn(torch, (1, 2, 70, 64), "float16", s) for s in (2, 3))
    for kw in ({"version": None}, {"scale": -0.3}):
        want = fg.flash_attention(q, k, v, **kw)
        g, out = _captured(torch, lambda kw=kw: fg.flash_attention(q, k, v, **kw))
        g.replay()
        torch.cuda.synchronize()
        _same(torch, out, want, f"grouped {kw}")


def test_direct_and_general_routes_agree(torch, fg):
    base = _randn(torch, (2, 3, 130, 2, 64), "bfloat16", 5)
    views = [base[:, :, :, i % 2].transpose(1, 2) for i in range(3)]  # (2, 130, 3, 64) views
    assert not any(x.is_contiguous() for x in views)
    dense = [x.contiguous() for x in views]
    O_v, lse_v = fg.flash_attention(*views, causal=True, return_lse=True)  # copies first
    O_d, lse_d = fg.flash_attention(*dense, causal=True, return_lse=True)  # direct
    assert torch.equal(O_v, O_d) and torch.equal(lse_v, lse_d)
    assert isinstance(O_d, torch.Tensor) and O_d.is_contiguous() and O_d.device == dense[0].device
    dO = _randn(torch, O_d.shape, "bfloat16", 6)
    got_v = fg.flash_attention_backward(*views, O_v, lse_v, dO, causal=True)
    got_d = fg.flash_attention_backward(*dense, O_d, lse_d, dO, causal=True)
    _same(torch, got_v, tuple(got_d), "views against dense", atomic=(0,))


def test_out_is_written_and_returned(torch, fg):
    q, k, v = (_randn(torch, (1, 2, 64, 128), "float16", s) for s in range(3))
    out = torch.full((1, 2, 64, 128), float("nan"), dtype=torch.float16, device="cuda")
    O = fg.flash_attention(q, k, v, out=out)
    assert O is out and torch.equal(out, fg.flash_attention(q, k, v))
    with pytest.raises(ValueError, match="out must be an array of shape"):
        fg.flash_attention(q, k, v, out=out[:, :1])
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        fg.flash_attention(q, k, v, out=out.transpose(2, 3).contiguous().transpose(2, 3))


def test_mixed_torch_and_cupy_inputs_are_refused(torch, fg, cp):
    q = _randn(torch, (1, 2, 16, 64))
    with pytest.raises(TypeError, match="k is a cupy.ndarray|k must be a torch CUDA tensor"):
        fg.flash_attention(q, cp.asarray(q), q)


def _decode_inputs(torch, dtype="bfloat16"):
    B, Hq, Hkv, Nk, d, ps = 4, 16, 4, 1000, 128, 64
    q = _randn(torch, (B, Hq, 1, d), dtype, 1)
    k, v = (_randn(torch, (B, Hkv, Nk, d), dtype, s) for s in (2, 3))
    pages = B * 16
    kp, vp = (_randn(torch, (pages, Hkv, ps, d), dtype, s) for s in (4, 5))
    g = torch.Generator(device="cuda").manual_seed(7)
    table = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).reshape(B, 16)
    return q, k, v, kp, vp, table


def test_decode_with_device_tables_equals_host_tables(torch, fg):
    q, k, v, kp, vp, table = _decode_inputs(torch)
    lengths = [1000, 1, 517, 0]
    dev = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    _same(
        torch,
        (fg.decode_attention(q, k, v, lengths=dev),),
        fg.decode_attention(q, k, v, lengths=lengths),
        "contiguous",
    )
    got = fg.paged_decode_attention(q, kp, vp, table, dev.to(torch.int64))  # converted on device
    want = fg.paged_decode_attention(q, kp, vp, table.cpu().numpy(), lengths)
    # the split count follows the table's capacity for device tables, the longest length for
    # host ones: the same values, summed in another order
    assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=0)
    with pytest.raises(ValueError, match="lengths has shape"):
        fg.decode_attention(q, k, v, lengths=dev[:3])
    with pytest.raises(TypeError, match="lengths has dtype float32"):
        fg.decode_attention(q, k, v, lengths=dev.float())
    with pytest.raises(TypeError, match="block_table is a host array but the other table"):
        fg.paged_decode_attention(q, kp, vp, table.cpu(), dev)


def test_decode_graph_replays_growing_lengths_and_new_pages(torch, fg):
    q, k, v, kp, vp, table = _decode_inputs(torch)
    lengths = torch.tensor([64, 1, 300, 0], dtype=torch.int32, device="cuda")
    g_c, out_c = _captured(torch, lambda: fg.decode_attention(q, k, v, lengths=lengths))
    g_p, out_p = _captured(torch, lambda: fg.paged_decode_attention(q, kp, vp, table, lengths))
    for step in range(3):  # a decode loop: the lengths grow, a page is swapped in
        lengths += torch.tensor([100, 200, 1, 0], dtype=torch.int32, device="cuda")
        table[1, step] = table[3, step]
        g_c.replay()
        g_p.replay()
        torch.cuda.synchronize()
        _same(torch, out_c, fg.decode_attention(q, k, v, lengths=lengths), f"contiguous {step}")
        _same(torch, out_p, fg.paged_decode_attention(q, kp, vp, table, lengths), f"paged {step}")


def test_adapter_forward_and_backward_capture(torch, ft):
    q, k, v, dO = (_randn(torch, (2, 4, 150, 64), "bfloat16", s) for s in range(4))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]

    def step():
        return torch.autograd.grad(ft.attention(*leaves, is_causal=True), leaves, dO)

    want = step()
    g, out = _captured(torch, step)
    g.replay()
    torch.cuda.synchronize()
    _same(torch, out, want, "adapter step", atomic=(0,))


def test_adapter_takes_sdpa_positional_call(torch, ft):
    q, k, v = (_randn(torch, (1, 4, 33, 64), "float16", s) for s in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    got = ft.attention(q, k, v, None, 0.0, True, scale=0.2)
    want = sdpa(q.float(), k.float(), v.float(), None, 0.0, True, scale=0.2)
    assert (got.float() - want).abs().max() < 2e-3
    kg, vg = k[:, :2].contiguous(), v[:, :2].contiguous()
    got = ft.attention(q, kg, vg, enable_gqa=True)
    want = sdpa(q.float(), kg.float(), vg.float(), enable_gqa=True)
    assert (got.float() - want).abs().max() < 2e-3


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile_fullgraph(torch, ft, mode):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(128, 384)

        def forward(self, x):
            B, N, _ = x.shape
            q, k, v = self.qkv(x).view(B, N, 3, 2, 64).unbind(2)
            y = ft.attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            return y.transpose(1, 2).reshape(B, N, 128)

    torch.manual_seed(0)
    block = Block().cuda().to(torch.bfloat16)
    x = torch.randn(2, 96, 128, device="cuda", dtype=torch.bfloat16)
    want = block(x)
    want.float().sum().backward()
    grad = block.qkv.weight.grad.clone()
    torch._dynamo.reset()
    fn = torch.compile(block, fullgraph=True, mode=mode)  # a graph break is an error
    for _ in range(3):
        block.zero_grad()
        got = fn(x)
        got.float().sum().backward()
    torch.cuda.synchronize()
    assert torch.allclose(got.float(), want.float(), atol=1e-2)
    assert torch.allclose(block.qkv.weight.grad.float(), grad.float(), atol=5e-2, rtol=2e-2)


def test_a_thread_that_never_called_cuda_runs_every_entry_point(torch, fg):
    """The autograd engine runs a backward on a thread of its own: a call whose first CUDA
    work on a thread is a TMA descriptor or a launch through the driver gets the device's
    context made current there, and gives the main thread's bits."""
    import threading

    q, k, v, dO = (_randn(torch, (2, 4, 300, 64), "bfloat16", s) for s in range(4))
    qd = _randn(torch, (2, 8, 1, 128), "bfloat16", 5)
    kd, vd = (_randn(torch, (2, 2, 700, 128), "bfloat16", s) for s in (6, 7))

    def calls():
        O, lse = fg.flash_attention(q, k, v, causal=True, return_lse=True)
        grads = fg.flash_attention_backward(q, k, v, O, lse, dO, causal=True)
        return (O, lse, *grads, fg.decode_attention(qd, kd, vd))

    want = calls()
    got = []
    t = threading.Thread(target=lambda: got.append(calls()))
    t.start()
    t.join()
    assert got, "the thread raised"
    _same(torch, got[0], want, "on a new thread", atomic=(2,))  # dQ: float32 atomics
