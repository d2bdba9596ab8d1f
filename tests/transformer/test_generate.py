"""Generation with the paged cache (``flashref.transformer.generate``), on the GPU with torch.

Each generated token must be the model's own greedy choice: the whole model, run again
without a cache over the prompt and the generated tokens, gives each of them the highest
float32 logit (``greedy_logits``), up to a near tie (a gap within what bfloat16 attention's
rounding moves the logits). The model's head is scaled so that its logits spread over
several units: a cache that held a wrong key, a wrong position or another sequence's tokens
changes the choice by far more than a tie.
Both generators, and the paged one copies nothing to the device while it replays.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

TIE = 0.25  # logit gap below which two choices are a tie at bfloat16 (logits of size ~10)


@pytest.mark.parametrize(
    "name,kw",
    [("flashref", {}), ("flashref", {"prefill_chunk": 8}), ("sdpa", {})],
    ids=["paged", "paged-chunked", "sdpa"],
)
def test_generated_tokens_are_the_greedy_choice(torch, name, kw):
    from flashref.transformer.generate import generator, greedy_logits
    from flashref.transformer.model import Config, attention_function, build_model

    cfg = Config(n_layers=2, d_model=128, n_heads=2, context=128)
    torch.manual_seed(0)
    model = build_model(40, cfg, attention_function("sdpa")).cuda().eval()
    with torch.no_grad():
        model.head.weight.mul_(30.0)
    prompts = torch.randint(0, 40, (3, 21), device="cuda")
    if kw:
        cc = torch.cuda.get_device_capability()
        if cc != (9, 0):
            pytest.skip(f"chunked prefill needs compute capability 9.0, this GPU has {cc}")
    res = generator(name, model, cfg, 3, **kw).generate(prompts, 50)
    out = res["tokens"]
    assert out.shape == (3, 50)
    seq = torch.cat([prompts, out], dim=1)
    with torch.no_grad():
        logits = greedy_logits(model, seq[:, :-1])[:, prompts.shape[1] - 1 :]  # predicts out
    chosen = logits.gather(-1, out[..., None])[..., 0]
    gap = logits.max(-1).values - chosen
    worst = float(gap.max())
    assert worst <= TIE, f"{name}: a generated token is {worst:.2f} below the model's best"
    assert float(logits.std()) > 2.0  # the logits do spread: the check above means something
    if name == "flashref":
        assert res["loop_host_copies"] == 0
