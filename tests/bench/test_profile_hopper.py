"""The Hopper profile (python -m flashref.bench profile --hopper) without a GPU or ncu: its
plan, the counters it asks for, what it writes and prints (ncu and the GPU faked)."""

import json
import shutil
import subprocess

import flashref.gpu as fg
from flashref.bench.profile import hopper as profile_hopper
from flashref.bench.profile import main as profile
from flashref.bench.profile import ncu

LISTING = """\
Metric Name                                      Metric Type Metric Unit Metric Description
sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active Counter cycle # HMMA/HGMMA ops
smsp__warps_active                               Counter    warp   # of warps active
"""


def test_hopper_plan_is_v14_the_sm90a_versions_and_cudnn_at_both_d_and_masks():
    plan = profile_hopper.hopper_plan()

    def sm90a(d):
        return [
            f"v{v.number}" for v in fg.VERSIONS.values() if v.arch == "sm_90a" and d in v.head_dims
        ]

    assert sm90a(64) and sm90a(128), "no sm_90a version registered"
    assert sm90a(64) != sm90a(128), "expected a version that offers d = 64 only (v24)"
    want = [
        (i, d, c)
        for d in (64, 128)
        for c in (False, True)
        for i in ["v14", *sm90a(d), "sdpa_cudnn"]
    ]
    assert [(r["impl"], r["d"], r["causal"]) for r in plan] == want
    assert all((r["B"], r["H"], r["N"], r["dtype"]) == (8, 16, 4096, "float16") for r in plan)
    only = profile_hopper.hopper_plan([21])
    assert {r["impl"] for r in only} == {"v21", "sdpa_cudnn"}


def test_profile_hopper_keeps_listed_counters_and_prints_the_tensor_pipe(
    monkeypatch, tmp_path, capsys
):
    seen = {}

    def fake_profile(plan, metrics):
        seen["metrics"] = metrics
        return [
            {
                **c,
                "kernels": 1,
                profile_hopper.GMMA: 61.5,
                "stalls_per_issue": {"wait": 0.5, "barrier": 2.25, "math": 0.1},
            }
            for c in plan
        ]

    def fake_run(cmd, **kwargs):
        assert cmd == ["ncu", "--query-metrics"], cmd
        return subprocess.CompletedProcess(cmd, 0, LISTING, "")

    monkeypatch.setattr(shutil, "which", lambda name: "/opt/ncu")
    monkeypatch.setattr(fg._runtime, "require_gpu", lambda: None)
    monkeypatch.setattr(profile, "run_meta", lambda cp, **measured: {"gpu": "a GPU"})
    monkeypatch.setattr(ncu.subprocess, "run", fake_run)
    monkeypatch.setattr(profile, "profile", fake_profile)
    monkeypatch.setattr(ncu, "profile", fake_profile)
    out = tmp_path / "hopper.json"
    assert profile.main(["--hopper", "--versions", "21", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["impl"] for r in doc["rows"]] == ["v21", "sdpa_cudnn"] * 4
    assert profile_hopper.GMMA in seen["metrics"]
    missing = "sm__inst_executed_pipe_tensor_op_gmma.sum"
    assert missing not in seen["metrics"] and missing in doc["meta"]["metrics_missing"]
    text = capsys.readouterr().out
    assert (
        "tensor pipe (matrix ops) 61.5%; stalls/issue: barrier 2.25, wait 0.50, math 0.10" in text
    )


def test_profile_refuses_two_modes_at_once(capsys):
    import pytest

    with pytest.raises(SystemExit):
        profile.main(["--hopper", "--decode"])
    assert "each profile on their own" in capsys.readouterr().err
