"""A small character-level transformer, trained with flashref's attention or with SDPA.

The model is GPT-shaped: token and position embeddings, ``n_layers`` pre-LayerNorm blocks
of causal self-attention (``n_heads`` heads of ``d_model // n_heads``) and a 4x GELU MLP,
a final LayerNorm and a linear head. Mixed precision: float32 weights, matrix products in
``dtype`` (bfloat16 by default) under ``torch.autocast``, so attention sees ``dtype``.
It learns the book's own prose (``flashref.transformer.booktext``). ``train`` trains one
run, ``train_in_turn`` several in turn (one step of each, so that they share the GPU's
state); ``python -m flashref.bench training`` (``flashref.bench.training``) trains flashref's
attention beside SDPA's from the same seed and records the curves.

torch is imported inside the functions: importing this module needs only NumPy.
"""

from __future__ import annotations

import dataclasses
import math
import time

from .booktext import CharCorpus, book_text

ATTENTIONS = ("flashref", "sdpa")
VAL_SEED = 12345  # every run is validated on the same windows, whatever its seed


@dataclasses.dataclass(frozen=True)
class Config:
    n_layers: int = 4
    d_model: int = 256
    n_heads: int = 4  # head dim d = d_model // n_heads = 64
    context: int = 256
    batch_size: int = 32
    lr: float = 1e-3
    warmup: int = 30  # steps of linear learning-rate warm-up
    eval_batches: int = 8  # validation batches at the end


def build_model(vocab_size: int, cfg: Config, attend):
    """The transformer as a ``torch.nn.Module``; ``attend(q, k, v)`` is causal attention."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
            self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
            self.proj = nn.Linear(cfg.d_model, cfg.d_model)
            self.mlp = nn.Sequential(
                nn.Linear(cfg.d_model, 4 * cfg.d_model),
                nn.GELU(),
                nn.Linear(4 * cfg.d_model, cfg.d_model),
            )

        def forward(self, x):  # (B, N, d_model)
            B, N, _ = x.shape
            qkv = self.qkv(self.ln1(x)).view(B, N, 3, cfg.n_heads, -1)  # (B, N, 3, H, d)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, N, d) views
            y = attend(q, k, v)  # (B, H, N, d)
            x = x + self.proj(y.transpose(1, 2).reshape(B, N, cfg.d_model))
            return x + self.mlp(self.ln2(x))

    class CharTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab_size, cfg.d_model)
            self.pos = nn.Embedding(cfg.context, cfg.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layers))
            self.ln = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, vocab_size)

        def features(self, idx):  # (B, N) int64 -> (B, N, d_model): what the head reads
            pos = torch.arange(idx.shape[1], device=idx.device)  # (N,)
            x = self.tok(idx) + self.pos(pos)  # (B, N, d_model)
            for block in self.blocks:
                x = block(x)
            return self.ln(x)

        def forward(self, idx):  # (B, N) int64
            return self.head(self.features(idx))  # (B, N, vocab)

    return CharTransformer()


def attention_function(name: str):
    """Causal attention ``(q, k, v) -> y`` by ``name``: "flashref" or "sdpa"."""
    if name == "flashref":
        from flashref.torch import attention

        return lambda q, k, v: attention(q, k, v, is_causal=True)
    if name == "sdpa":
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        return lambda q, k, v: sdpa(q, k, v, is_causal=True)
    raise ValueError(f"attention must be one of {ATTENTIONS}, got {name!r}")


def training_parts(attention, *, seed, dtype, device, cfg, corpus):
    """The model of ``attention`` from ``seed`` and the two halves of one training step, as
    :func:`train` runs them: ``(model, loss_of, update)``. ``loss_of(x, y)`` is the forward
    under autocast to ``dtype`` and the cross-entropy of a batch (NumPy token ids);
    ``update(loss)`` the backward, gradient clipping, AdamW and the learning-rate schedule.
    ``python -m flashref.bench training_step`` profiles the same step."""
    import torch

    attend = attention_function(attention)  # checks the name
    device = torch.device(device)
    if attention == "flashref" and device.type != "cuda":
        raise ValueError(f"attention='flashref' runs on a CUDA device, not {device}")
    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"d_model={cfg.d_model} is not a multiple of n_heads={cfg.n_heads}")
    torch.manual_seed(seed)
    model = build_model(corpus.vocab_size, cfg, attend).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]  # weights, not biases or gains
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup))
    amp = dict(device_type=device.type, dtype=getattr(torch, dtype), enabled=dtype != "float32")

    def loss_of(x, y):
        with torch.autocast(**amp):
            logits = model(torch.from_numpy(x).to(device))  # (B, N, vocab)
        target = torch.from_numpy(y).to(device)  # (B, N)
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten())

    def update(loss):
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()

    return model, loss_of, update


def train(
    attention="flashref",
    *,
    steps=300,
    seed=0,
    dtype="bfloat16",
    device="cuda",
    cfg=None,
    corpus=None,
    keep_model=False,
) -> dict:
    """Train from ``seed`` for ``steps`` steps; returns the loss curve and timings (and the
    trained model as ``"model"`` with ``keep_model=True``).

    ``seed`` fixes the initial weights (``torch.manual_seed``) and the batches
    (``CharCorpus.batches``), so two calls that differ only in ``attention`` start from the
    same weights and see the same batches. Returns ``{"attention", "seed", "loss"`` (the
    training loss of every step, before its update), ``"val_loss"`` (mean over
    ``cfg.eval_batches`` validation batches after the last step, the same batches for every
    run), ``"first_step_s"``,
    ``"s_per_step"`` (median over the steps after the first five)``}``.
    """
    return train_in_turn(
        [(attention, seed)],
        steps=steps,
        dtype=dtype,
        device=device,
        cfg=cfg,
        corpus=corpus,
        keep_model=keep_model,
    )[0]


def train_in_turn(
    plan, *, steps=300, dtype="bfloat16", device="cuda", cfg=None, corpus=None, keep_model=False
) -> list[dict]:
    """The runs of ``plan`` (``(attention, seed)`` pairs) trained together, a step of each in
    turn: step ``i`` of every run in the plan's order for even ``i`` and in reverse for odd
    ``i``. A drift of the machine's speed (a step here is mostly host time) then falls on
    every run alike, as interleaved rounds do for a benchmark. Each run keeps its own model,
    optimizer and batches, and nothing in a step draws random numbers, so every run's losses
    are those :func:`train` gives it alone (a CPU test checks this). Returns :func:`train`'s
    dict for each run, in the plan's order."""
    import torch

    cfg = cfg or Config()
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype must be 'bfloat16', 'float16' or 'float32', got {dtype!r}")
    plan = list(plan)
    if not plan:
        raise ValueError("plan must name at least one (attention, seed) run")
    for entry in plan:  # every run checked before any model is built
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
            raise ValueError(f"plan must hold (attention, seed) pairs, got {entry!r}")
        attention_function(entry[0])  # says which names there are
        if type(entry[1]) is not int:
            raise ValueError(f"plan must give each run an int seed, got {entry[1]!r}")
    corpus = corpus or CharCorpus(book_text())
    runs = []
    for attention, seed in plan:
        model, loss_of, update = training_parts(
            attention, seed=seed, dtype=dtype, device=device, cfg=cfg, corpus=corpus
        )
        batches = corpus.batches(batch_size=cfg.batch_size, context=cfg.context, seed=seed)
        runs.append(
            {
                "model": model,
                "loss_of": loss_of,
                "update": update,
                "batches": batches,
                "losses": [],
                "seconds": [],
            }
        )
    for i in range(steps):
        for run in runs if i % 2 == 0 else runs[::-1]:
            x, y = next(run["batches"])
            t0 = time.perf_counter()
            loss = run["loss_of"](x, y)
            run["update"](loss)
            run["losses"].append(loss.item())  # waits for the step to finish
            run["seconds"].append(time.perf_counter() - t0)
    out = []
    for (attention, seed), run in zip(plan, runs, strict=True):
        model, loss_of = run["model"], run["loss_of"]
        model.eval()
        val = corpus.batches(
            batch_size=cfg.batch_size, context=cfg.context, seed=VAL_SEED, split="val"
        )
        with torch.no_grad():
            pairs = zip(range(cfg.eval_batches), val, strict=False)
            val_loss = [loss_of(x, y).item() for _, (x, y) in pairs]
        seconds = run["seconds"]
        timed = sorted(seconds[5:] or seconds)
        kept = {"model": model} if keep_model else {}
        out.append(
            kept
            | {
                "attention": attention,
                "seed": seed,
                "loss": run["losses"],
                "val_loss": math.fsum(val_loss) / len(val_loss),
                "first_step_s": seconds[0],
                "s_per_step": timed[len(timed) // 2],
            }
        )
    return out
