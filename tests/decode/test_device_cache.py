"""The paged KV cache on the GPU (``flashref.gpu.DevicePagedKVCache``) and plan / run
(``flashref.gpu.PagedDecodePlan``), against the CPU cache and the public paged call.

- Appends on the device (prompt chunks, then one token per step for the whole batch, two
  layers) leave each sequence's keys and values exactly where ``flashref.PagedKVCache`` puts
  them: gathered, the bits are equal.
- A step that needs more pages than are free raises ``CacheFullError`` and changes nothing,
  on the host or the device.
- ``run`` gives ``paged_decode_attention``'s bits, and the float64 reference to the decode
  tolerance.
- A decode step (advance, appends and attention of every layer) captured once with
  ``torch.cuda.graph`` in its default mode replays correctly while the sequences grow across
  page boundaries, with no host-to-device copy when the pages were reserved ahead.
- A replay without its ``prepare_step`` past the reserved pages writes nothing and
  ``check()`` says so.
"""

from __future__ import annotations

import numpy as np
import pytest

import flashref

pytestmark = pytest.mark.gpu


def _rand(torch, shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda").to(getattr(torch, dtype))


def _host(x):
    return x.float().cpu().numpy()


def _twin(torch, fg, dtype="float16", ps=64, layers=2, pages=40, batch=4, Hkv=2, d=64, **kw):
    dev = fg.DevicePagedKVCache(
        pages,
        ps,
        Hkv,
        d,
        max_batch=batch,
        num_layers=layers,
        max_step_tokens=1024,
        dtype=dtype,
        **kw,
    )
    cpu = [flashref.PagedKVCache(pages, ps, Hkv, d, dtype=np.float32) for _ in range(layers)]
    return dev, cpu


def _step(torch, dev, cpu, seqs, n, seed, dtype):
    """The same step on both: k, v (len(seqs), Hkv, n, d) per layer; the device's given as
    a strided view (the layout a model's projection makes)."""
    dev.begin_step(seqs, n)
    for layer, c in enumerate(cpu):
        kv = _rand(
            torch, (len(seqs), n, 2, dev.num_kv_heads, dev.head_dim), dtype, seed * 10 + layer
        )
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)  # strided views
        dev.append(layer, k, v)
        for r, s in enumerate(seqs):
            c.append(s, _host(k[r]), _host(v[r]))


def _same_contents(dev, cpu, seqs):
    for layer, c in enumerate(cpu):
        for s in seqs:
            K, V = dev.gather(s, layer)
            Kc, Vc = c.gather(s)
            np.testing.assert_array_equal(_host(K), Kc, err_msg=f"K of seq {s}, layer {layer}")
            np.testing.assert_array_equal(_host(V), Vc, err_msg=f"V of seq {s}, layer {layer}")
    np.testing.assert_array_equal(
        dev.lengths_now()[[dev.row_of(s) for s in seqs]], [cpu[0].lengths[s] for s in seqs]
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("ps", [64, 128])
def test_appends_match_the_cpu_cache(torch, fg, dtype, ps):
    dev, cpu = _twin(torch, fg, dtype, ps)
    seqs = [dev.new_sequence() for _ in range(3)]
    for c in cpu:
        assert [c.new_sequence() for _ in range(3)] == seqs
    _step(torch, dev, cpu, [seqs[0]], 70, 1, dtype)  # prompt chunks of different lengths
    _step(torch, dev, cpu, [seqs[1]], 5, 2, dtype)
    _step(torch, dev, cpu, [seqs[0]], 64, 3, dtype)
    for t in range(4, 4 + 2 * ps // 3):  # decode: one token for the batch per step
        _step(torch, dev, cpu, seqs, 1, t, dtype)
    torch.cuda.synchronize()
    _same_contents(dev, cpu, seqs)
    assert dev.pages.block_tables == cpu[0].block_tables  # one allocation rule
    dev.check()


def test_cupy_cache_and_free(torch, fg, cp):
    dev = fg.DevicePagedKVCache(8, 64, 1, 64, max_batch=2, library="cupy")
    a = dev.new_sequence()
    dev.begin_step([a], 100)
    k = cp.asarray(np.arange(100 * 64, dtype=np.float16).reshape(1, 1, 100, 64))
    dev.append(0, k, k)
    K, _ = dev.gather(a, 0)
    np.testing.assert_array_equal(cp.asnumpy(K), cp.asnumpy(k[0]))
    free_before = dev.pages.num_free_pages
    dev.free(a)
    assert dev.pages.num_free_pages == free_before + 2
    assert dev.lengths_now()[0] == 0 and int(dev.block_table[0].max()) == -1
    b = dev.new_sequence()
    assert dev.row_of(b) in (0, 1)


def test_a_full_cache_changes_nothing(torch, fg):
    dev, cpu = _twin(torch, fg, pages=5, layers=1)
    seqs = [dev.new_sequence() for _ in range(2)]
    for c in cpu:
        c.new_sequence(), c.new_sequence()
    _step(torch, dev, cpu, [seqs[0]], 130, 1, "float16")  # 3 pages
    _step(torch, dev, cpu, [seqs[1]], 60, 2, "float16")  # 1 page: 1 left
    torch.cuda.synchronize()
    before = (
        dev.k_pages.clone(),
        dev.block_table.clone(),
        dev.lengths.clone(),
        {s: list(p) for s, p in dev.pages.block_tables.items()},
        dict(dev.pages.lengths),
        dev.host_copies,
    )
    with pytest.raises(flashref.CacheFullError, match="cache is full"):
        dev.begin_step(seqs, 70)  # both need a page: 2 > 1 free
    torch.cuda.synchronize()
    assert torch.equal(dev.k_pages, before[0]) and torch.equal(dev.block_table, before[1])
    assert torch.equal(dev.lengths, before[2])
    assert dev.pages.block_tables == before[3] and dev.pages.lengths == before[4]
    assert dev.host_copies == before[5]
    with pytest.raises(ValueError, match="k_new has shape"):
        dev.begin_step([seqs[1]], 2)
        dev.append(0, *(_rand(torch, (1, 2, 3, 64), "float16", 0),) * 2)


def test_arguments_are_named(torch, fg):
    with pytest.raises(TypeError, match="dtype is 'float32'"):
        fg.DevicePagedKVCache(4, 64, 1, 64, max_batch=1, dtype="float32")
    with pytest.raises(ValueError, match="library is 'jax'"):
        fg.DevicePagedKVCache(4, 64, 1, 64, max_batch=1, library="jax")
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        fg.DevicePagedKVCache(4, 64, 1, 64, max_batch=0)
    dev = fg.DevicePagedKVCache(4, 64, 1, 64, max_batch=2, max_pages_per_seq=2)
    a = dev.new_sequence()
    with pytest.raises(RuntimeError, match="no step is prepared"):
        dev.advance()
    with pytest.raises(ValueError, match="at most max_pages_per_seq"):
        dev.begin_step([a], 129)
    with pytest.raises(ValueError, match="seqs has a sequence twice"):
        dev.begin_step([a, a], 1)
    with pytest.raises(ValueError, match="seqs\\[0\\] 7 is not a sequence"):
        dev.begin_step([7], 1)
    dev.begin_step([a], 1)
    x = _rand(torch, (1, 1, 1, 64), "float16", 0)
    with pytest.raises(TypeError, match="k_new has dtype torch.float32"):
        dev.append(0, x.float(), x)
    with pytest.raises(ValueError, match="layer is 1"):
        dev.append(1, x, x)
    with pytest.raises(ValueError, match="last axis contiguous"):
        dev.append(0, _rand(torch, (1, 1, 64, 1), "float16", 0).transpose(2, 3), x)
    dev.new_sequence()
    with pytest.raises(ValueError, match="all 2 rows of the table"):
        dev.new_sequence()


def _reference(cpu, seqs, q):
    return flashref.paged_attention(q.astype(np.float64), cpu, seqs, return_lse=True)


@pytest.mark.parametrize("ps", [64, 128])
def test_run_equals_the_public_call(torch, fg, ps):
    from flashref.gpu.tolerances import CEILING

    dev, cpu = _twin(torch, fg, "bfloat16", ps, layers=2, batch=4, Hkv=2, d=128, pages=60)
    seqs = [dev.new_sequence() for _ in range(3)]  # row 3 holds no sequence: length 0
    for c in cpu:
        [c.new_sequence() for _ in range(3)]
    for i, s in enumerate(seqs):
        _step(torch, dev, cpu, [s], [300, 1, 777][i], i, "bfloat16")
    q = _rand(torch, (4, 8, 1, 128), "bfloat16", 9)
    plan = dev.plan(q)
    for layer in range(2):
        O = plan.run(q, *dev.pools(layer))
        want = fg.paged_decode_attention(q, *dev.pools(layer), dev.block_table, dev.lengths)
        assert torch.equal(O, want), f"layer {layer}: run differs from the public call"
        ref, _ = _reference(cpu[layer], seqs, _host(q[:3]))
        err = np.linalg.norm(_host(O[:3]) - ref) / np.linalg.norm(ref)
        assert err <= CEILING["bfloat16"], f"layer {layer}: relative error {err}"
        assert float(O[3].abs().max()) == 0.0  # the empty row
    with pytest.raises(ValueError, match="the plan was made for"):
        plan.run(q[:2], *dev.pools(0))


def test_graph_replays_a_growing_batch_without_copies(torch, fg):
    dev, cpu = _twin(torch, fg, "float16", 64, layers=2, batch=3, Hkv=2, d=64, pages=30)
    seqs = [dev.new_sequence() for _ in range(3)]
    for c in cpu:
        [c.new_sequence() for _ in range(3)]
    for i, s in enumerate(seqs):
        _step(torch, dev, cpu, [s], [60, 10, 127][i], i, "float16")
        dev.reserve(s, 80)  # pages for every step below: none copied while replaying
    q = _rand(torch, (3, 4, 1, 64), "float16", 5)
    kv = torch.empty((2, 3, 1, 2, 2, 64), dtype=torch.float16, device="cuda")  # per layer
    plan = dev.plan(q)
    outs = [torch.empty_like(plan.out) for _ in range(2)]

    def step():
        dev.advance()
        for layer in range(2):
            k, v = kv[layer, :, :, 0].transpose(1, 2), kv[layer, :, :, 1].transpose(1, 2)
            dev.append(layer, k, v)
            plan.run(q, *dev.pools(layer), out=outs[layer])

    dev.prepare_step(seqs, 1)  # the warm-up is a real step
    kv.copy_(_rand(torch, kv.shape, "float16", 100))
    step()
    for layer, c in enumerate(cpu):
        for r, s in enumerate(seqs):
            c.append(
                s,
                _host(kv[layer, r, :, 0].transpose(0, 1)),
                _host(kv[layer, r, :, 1].transpose(0, 1)),
            )
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    dev.prepare_step(seqs, 1)
    with torch.cuda.graph(g):  # default mode: a sync, a copy or another stream would fail
        step()
    copies = dev.host_copies
    for t in range(70):  # seqs 0 and 2 cross page boundaries (64, 128, 192)
        if t:
            dev.prepare_step(seqs, 1)
        kv.copy_(_rand(torch, kv.shape, "float16", 200 + t))
        g.replay()
        for layer, c in enumerate(cpu):
            for r, s in enumerate(seqs):
                c.append(
                    s,
                    _host(kv[layer, r, :, 0].transpose(0, 1)),
                    _host(kv[layer, r, :, 1].transpose(0, 1)),
                )
        if t % 23 == 0 or t == 69:
            torch.cuda.synchronize()
            for layer in range(2):
                want = fg.paged_decode_attention(q, *dev.pools(layer), dev.block_table, dev.lengths)
                assert torch.equal(outs[layer], want), f"replay {t}, layer {layer}"
    torch.cuda.synchronize()
    assert dev.host_copies == copies, "a replayed step copied to the device"
    _same_contents(dev, cpu, seqs)
    dev.check()
    # past the reserved pages without prepare_step: nothing written, and check() says so
    for _ in range(200):
        g.replay()
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="found no page on the device"):
        dev.check()
    lengths = dev.lengths_now()
    assert all(lengths[dev.row_of(s)] <= len(dev.pages.block_tables[s]) * 64 for s in seqs)
