"""A model that generates: the chapter 8 transformer with a KV cache, one graph per token.

Generating text repeats one step per token: embed the last token, and in every layer
project it to q, k and v, write k and v into the cache, attend q to the cache, and finish
the block; then pick the next token. The step's shapes never change, so a serving loop
captures it once in a CUDA graph and replays it: the host launches one graph per token
and nothing else. Two generators run the same model (``flashref.transformer.model``) that way:

- ``PagedGenerator``: ``flashref.gpu.DevicePagedKVCache`` (appends on the device, pages
  reserved for the whole generation when it starts) and ``PagedDecodePlan.run``;
- ``StaticSDPAGenerator``: a contiguous cache of the model's whole context per layer
  (written with ``index_copy_`` at the step's position) and PyTorch's
  ``scaled_dot_product_attention`` with a mask of the positions written so far, the
  static-cache pattern of PyTorch serving code.

Both prefill the prompt in one pass (causal attention over the prompt: flashref's
``flash_attention`` and SDPA), take the first new token from it, then replay the step. The
position, the last token and every generated token live on the device, written by the
graph; the tokens are read back once, at the end. Greedy decoding: the argmax of float32
logits (``greedy_logits``).

torch is imported inside the functions: importing this module needs only NumPy.
"""

from __future__ import annotations

import time

from ..gpu import DevicePagedKVCache, flash_attention, paged_prefill_attention

GENERATORS = ("flashref", "sdpa")


def greedy_logits(model, idx, dtype="bfloat16"):
    """The logits the generators choose from, at every position of ``idx (B, N)`` (int64 on
    the model's device): the model under ``dtype`` autocast up to its last layer norm, then
    its head in float32, outside autocast. Returns ``(B, N, vocab)`` float32.

    The head in float32 is what serving engines do before sampling, and it matters for
    greedy decoding: logits of a bfloat16 head have 8 bits of mantissa (steps of 1/16 near
    10), so two tokens often tie exactly, and two implementations of attention, whose
    outputs differ by rounding, then break the tie differently."""
    import torch

    with torch.autocast(idx.device.type, dtype=getattr(torch, dtype), cache_enabled=False):
        h = model.features(idx)
    return float32_head(model, h)


def float32_head(model, h):
    """The model's head on ``h (..., d_model)`` (its last layer norm's output) in float32,
    outside any autocast: the logits greedy decoding picks from."""
    import torch

    with torch.autocast(h.device.type, enabled=False):
        return model.head(h.float())


def _heads(block, x, H):
    """q, k, v ``(B, H, N, d)`` (strided views of one projection) of ``x (B, N, d_model)``."""
    B, N, dm = x.shape
    qkv = block.qkv(block.ln1(x)).view(B, N, 3, H, dm // H)
    return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))


def _finish(block, x, y):
    """The rest of the block after attention: ``y (B, H, N, d)``."""
    B, H, N, d = y.shape
    x = x + block.proj(y.transpose(1, 2).reshape(B, N, H * d))
    return x + block.mlp(block.ln2(x))


class _Generator:
    """What both generators share: the model, the device state, prefill and the loop."""

    def __init__(self, model, cfg, batch, dtype):
        import torch

        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        if dtype not in ("bfloat16", "float16"):
            raise ValueError(f"dtype must be 'bfloat16' or 'float16', got {dtype!r}")
        self.torch, self.model, self.cfg, self.B = torch, model, cfg, batch
        self.H, self.d = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.dt = getattr(torch, dtype)
        dev = next(model.parameters()).device
        self.tok = torch.zeros(batch, dtype=torch.long, device=dev)  # the last token
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)  # its position
        self.graph = None

    def _amp(self):  # no cast cache: a captured graph must not keep casts made outside it
        return self.torch.autocast("cuda", dtype=self.dt, cache_enabled=False)

    def _logits_to_token(self, x):  # greedy_logits' last step, for the last position
        logits = float32_head(self.model, self.model.ln(x[:, -1]))  # (B, vocab) float32
        self.tok.copy_(logits.argmax(-1))

    def generate(self, prompts, new_tokens: int, loop_context=None) -> dict:
        """Greedy continuation of ``prompts (B, P)`` (int64 on the model's device) by
        ``new_tokens`` tokens. Returns ``{"tokens": (B, new_tokens) tensor, "prefill_s"``
        (prefill and one eager step), ``"capture_s", "decode_s"`` (the replayed steps, the
        device synchronised before and after), ``"steps"``, ``"loop_host_copies"`` (the
        paged cache's count of its host-to-device copies during the replays; None for the
        static cache, which makes none)``}``. ``loop_context``: a context
        manager entered around the replays only (a profiler)."""
        import contextlib

        torch = self.torch
        B, P = prompts.shape
        if B != self.B:
            raise ValueError(f"prompts has {B} rows; the generator was made for batch {self.B}")
        if not 2 <= new_tokens or P + new_tokens > self.cfg.context:
            raise ValueError(
                f"new_tokens is {new_tokens}; 2 <= P + new_tokens <= the model's context "
                f"{self.cfg.context} (P = {P})"
            )
        self.out = torch.zeros((new_tokens, B), dtype=torch.long, device=prompts.device)
        self.P = P
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            self._prefill(prompts)  # the first new token
            self.out[0] = self.tok
            self.pos.fill_(P)
            self._before_step()  # the second: an eager step, which compiles and warms up
            self._step()
            self._before_step()  # what the first replay needs
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):  # default mode: a sync or a copy from the host fails
                self._step()
            torch.cuda.synchronize()
            copies = self._host_copies()
            with loop_context or contextlib.nullcontext():
                t2 = time.perf_counter()
                for t in range(new_tokens - 2):
                    if t:
                        self._before_step()
                    g.replay()
                torch.cuda.synchronize()
                t3 = time.perf_counter()
            copies = None if copies is None else self._host_copies() - copies
        return {
            "tokens": self.out.T.clone(),
            "prefill_s": t1 - t0,
            "capture_s": t2 - t1,
            "decode_s": t3 - t2,
            "steps": new_tokens - 2,
            "loop_host_copies": copies,
        }

    def _step(self):
        model = self.model
        self._advance()
        with self._amp():
            x = (model.tok(self.tok) + model.pos(self.pos))[:, None]  # (B, 1, d_model)
            for layer, block in enumerate(model.blocks):
                q, k, v = _heads(block, x, self.H)
                y = self._attend_step(layer, q, k, v)
                x = _finish(block, x, y)
            self._logits_to_token(x)
        self.out.index_copy_(0, self.pos - self.P + 1, self.tok[None])
        self.pos += 1


class PagedGenerator(_Generator):
    """The model generating with ``DevicePagedKVCache`` and ``PagedDecodePlan``.

    ``prefill_chunk``: None (default) prefills the prompt in one pass with ``flash_attention``
    (causal), an int writes it into the cache ``prefill_chunk`` tokens at a time, each chunk
    attending to the cache with ``paged_prefill_attention`` (bottom-right; compute
    capability 9.0)."""

    def __init__(self, model, cfg, batch, *, page_size=64, dtype="bfloat16", prefill_chunk=None):
        super().__init__(model, cfg, batch, dtype)
        if prefill_chunk is not None and (
            isinstance(prefill_chunk, bool)
            or not isinstance(prefill_chunk, int)
            or prefill_chunk < 1
        ):
            raise ValueError(f"prefill_chunk must be None or a positive int, got {prefill_chunk!r}")
        self.prefill_chunk = prefill_chunk

        torch = self.torch
        per_seq = -(-cfg.context // page_size)
        self.cache = DevicePagedKVCache(
            batch * per_seq,
            page_size,
            self.H,
            self.d,
            max_batch=batch,
            max_pages_per_seq=per_seq,
            num_layers=cfg.n_layers,
            dtype=dtype,
            max_step_tokens=batch * cfg.context,
            device=self.tok.device.index,
        )
        self.seqs = [self.cache.new_sequence() for _ in range(batch)]
        self.q = torch.empty((batch, self.H, 1, self.d), dtype=self.dt, device=self.tok.device)
        self.plan = self.cache.plan(self.q)

    def _prefill(self, prompts):
        torch, model, P = self.torch, self.model, prompts.shape[1]
        for s in self.seqs:  # the pages of the whole generation now: none while replaying
            self.cache.reserve(s, self.cfg.context)
        chunk = self.prefill_chunk or P
        for c0 in range(0, P, chunk):
            n = min(chunk, P - c0)
            self.cache.begin_step(self.seqs, n)
            with self._amp():
                where = torch.arange(c0, c0 + n, device=prompts.device)
                x = model.tok(prompts[:, c0 : c0 + n]) + model.pos(where)
                for layer, block in enumerate(model.blocks):
                    q, k, v = _heads(block, x, self.H)
                    self.cache.append(layer, k, v)
                    if self.prefill_chunk is None:
                        y = flash_attention(q, k, v, causal=True)
                    else:  # every key so far, from the pages, the chunk's own bottom-right
                        y = paged_prefill_attention(
                            q, *self.cache.pools(layer), self.cache.block_table, self.cache.lengths
                        )
                    x = _finish(block, x, y)
        with self._amp():
            self._logits_to_token(x)

    def _before_step(self):
        self.cache.prepare_step(self.seqs, 1)

    def _host_copies(self):
        return self.cache.host_copies

    def _advance(self):
        self.cache.advance()

    def _attend_step(self, layer, q, k, v):
        self.cache.append(layer, k, v)
        self.q.copy_(q)
        return self.plan.run(self.q, *self.cache.pools(layer))


class StaticSDPAGenerator(_Generator):
    """The model generating with a contiguous static cache and SDPA (the baseline)."""

    def __init__(self, model, cfg, batch, *, dtype="bfloat16"):
        super().__init__(model, cfg, batch, dtype)
        torch = self.torch
        shape = (cfg.n_layers, batch, self.H, cfg.context, self.d)
        self.K = torch.zeros(shape, dtype=self.dt, device=self.tok.device)
        self.V = torch.zeros(shape, dtype=self.dt, device=self.tok.device)
        self.keys = torch.arange(cfg.context, device=self.tok.device)

    def _prefill(self, prompts):
        sdpa = self.torch.nn.functional.scaled_dot_product_attention
        torch, model, P = self.torch, self.model, prompts.shape[1]
        with self._amp():
            x = model.tok(prompts) + model.pos(torch.arange(P, device=prompts.device))
            for layer, block in enumerate(model.blocks):
                q, k, v = _heads(block, x, self.H)
                self.K[layer, :, :, :P], self.V[layer, :, :, :P] = k, v
                x = _finish(block, x, sdpa(q, k, v, is_causal=True))
            self._logits_to_token(x)

    def _before_step(self):
        pass

    def _host_copies(self):
        return None

    def _advance(self):
        self.mask = (self.keys <= self.pos)[None, None, None]  # (1, 1, 1, context)

    def _attend_step(self, layer, q, k, v):
        sdpa = self.torch.nn.functional.scaled_dot_product_attention
        self.K[layer].index_copy_(2, self.pos, k)
        self.V[layer].index_copy_(2, self.pos, v)
        return sdpa(q, self.K[layer], self.V[layer], attn_mask=self.mask)


def generator(name: str, model, cfg, batch, **kwargs):
    """``PagedGenerator`` (``"flashref"``) or ``StaticSDPAGenerator`` (``"sdpa"``)."""
    if name == "flashref":
        return PagedGenerator(model, cfg, batch, **kwargs)
    if name == "sdpa":
        return StaticSDPAGenerator(model, cfg, batch, **kwargs)
    raise ValueError(f"name must be one of {GENERATORS}, got {name!r}")
