"""The character-level transformer of chapter 8 (needs torch; the training comparison a GPU).

Without torch every test here is skipped, saying so; the text it trains on is tested
without torch in ``test_booktext.py``.
"""

from __future__ import annotations

import math

import pytest

from flashref.transformer.booktext import CharCorpus, book_text

torch = pytest.importorskip(
    "torch", reason="torch is not installed (flashref.transformer.model needs it)"
)

from flashref.transformer import model as charmodel  # noqa: E402  (after the skip)

# Small enough for the CPU, with heads of d = 64, which flashref's backward kernels take.
TINY = charmodel.Config(
    n_layers=2, d_model=128, n_heads=2, context=32, batch_size=4, warmup=2, eval_batches=2
)


@pytest.fixture(scope="module")
def corpus():
    return CharCorpus(book_text())


def test_model_shapes(corpus):
    cfg = charmodel.Config()  # the recorded model: 4 layers, d_model 256, 4 heads of d = 64
    seen = []

    def attend(q, k, v):
        seen.append((tuple(q.shape), q.is_contiguous()))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    model = charmodel.build_model(corpus.vocab_size, cfg, attend)
    x, _ = next(corpus.batches(batch_size=2, context=cfg.context, seed=0))
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
    assert logits.shape == (2, cfg.context, corpus.vocab_size)
    assert seen == [((2, 4, cfg.context, 64), False)] * 4  # transposed views reach attention
    params = sum(p.numel() for p in model.parameters())
    assert 3_000_000 < params < 3_300_000, params


def test_greedy_logits_are_the_models_with_a_float32_head(corpus):
    from flashref.transformer.generate import greedy_logits

    torch.manual_seed(0)
    attend = charmodel.attention_function("sdpa")
    model = charmodel.build_model(corpus.vocab_size, TINY, attend).eval()
    x, _ = next(corpus.batches(batch_size=2, context=TINY.context, seed=0))
    idx = torch.from_numpy(x)
    with torch.no_grad():
        got = greedy_logits(model, idx, "bfloat16")
        assert got.dtype == torch.float32 and got.shape == (2, TINY.context, corpus.vocab_size)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = model.features(idx)
            bf16 = model(idx)  # the head under autocast too: bfloat16 logits
        assert torch.equal(got, model.head(h.float()))
        assert bf16.dtype == torch.bfloat16
        assert torch.equal(model(idx), model.head(model.features(idx)))

    def ties(logits):  # exact ties of the best two logits
        top = logits.float().topk(2, dim=-1).values
        return int((top[..., 0] == top[..., 1]).sum())

    with torch.no_grad():
        assert ties(got) == 0 and (got - bf16.float()).abs().max() > 0


def test_training_on_cpu_is_seeded(corpus):
    a = charmodel.train("sdpa", steps=4, device="cpu", cfg=TINY, corpus=corpus)
    b = charmodel.train("sdpa", steps=4, device="cpu", cfg=TINY, corpus=corpus)
    c = charmodel.train("sdpa", steps=4, seed=1, device="cpu", cfg=TINY, corpus=corpus)
    assert a["loss"] == b["loss"] and a["val_loss"] == b["val_loss"]
    assert a["loss"] != c["loss"]
    assert len(a["loss"]) == 4 and all(math.isfinite(x) for x in a["loss"])
    # an untrained model guesses every character about equally: loss near log(vocab)
    assert abs(a["loss"][0] - math.log(corpus.vocab_size)) < 0.5
    assert set(a) == {"attention", "seed", "loss", "val_loss", "first_step_s", "s_per_step"}


def test_runs_trained_in_turn_learn_as_alone(corpus):
    # train_in_turn alternates the runs' steps (for the timing); each run's losses must be
    # the ones it has trained alone, bit for bit, in either position of the plan
    alone = [
        charmodel.train("sdpa", steps=5, seed=s, device="cpu", cfg=TINY, corpus=corpus)
        for s in (0, 1)
    ]
    plan = [("sdpa", 1), ("sdpa", 0)]
    together = charmodel.train_in_turn(plan, steps=5, device="cpu", cfg=TINY, corpus=corpus)
    assert [(r["attention"], r["seed"]) for r in together] == plan
    for run, ref in zip(together, alone[::-1], strict=True):
        assert run["loss"] == ref["loss"] and run["val_loss"] == ref["val_loss"]
    for bad, message in (
        ([], "plan must name"),
        ([("sdpa", 0), ("sdpa",)], "pairs"),
        ([("sdpa", 0), ("cudnn", 1)], "attention must be one of"),
        ([("sdpa", 0), ("sdpa", True)], "int seed"),
    ):
        with pytest.raises(ValueError, match=message):
            charmodel.train_in_turn(bad, steps=1, device="cpu", cfg=TINY, corpus=corpus)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attention": "xformers"}, "attention must be one of"),
        ({"attention": "flashref", "device": "cpu"}, "runs on a CUDA device"),
        ({"attention": "sdpa", "steps": 0}, "steps must be a positive int"),
        ({"attention": "sdpa", "dtype": "float8"}, "dtype must be"),
    ],
)
def test_arguments_are_checked(corpus, kwargs, message):
    with pytest.raises(ValueError, match=message):
        charmodel.train(**kwargs, corpus=corpus, cfg=TINY)


@pytest.mark.gpu
def test_flashref_and_sdpa_start_alike_and_learn(corpus):
    runs = [charmodel.train(a, steps=20, cfg=TINY, corpus=corpus) for a in ("flashref", "sdpa")]
    flash, sdpa = (r["loss"] for r in runs)
    # The same weights and batch: the first losses differ only by the attention's bf16
    # rounding, averaged over 4 x 32 tokens; 1e-2 relative is 2.5 bf16 roundings (2^-8).
    assert abs(flash[0] - sdpa[0]) <= 1e-2 * sdpa[0], (flash[0], sdpa[0])
    assert all(math.isfinite(x) for x in flash), flash
    assert flash[-1] < flash[0] - 0.5, f"flashref's run did not learn: {flash}"


@pytest.mark.gpu
def test_command_writes_what_the_chapter_reads(tmp_path):
    from flashref.bench import training
    from flashref.recorded.training import load_training, training_summary

    out = tmp_path / "gpu_training.json"
    assert training.main(["--steps", "8", "--out", str(out)]) == 0
    meta, runs = load_training(out)
    assert meta["steps"] == 8 and meta["model"]["d_model"] == 256
    assert [(r["attention"], r["seed"]) for r in runs] == [
        ("flashref", 0),
        ("sdpa", 0),
        ("sdpa", 1),
    ]
    assert training_summary(runs, window=4)["other_seed"] is runs[2]
