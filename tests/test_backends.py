"""train.sdpa_backend and train.compile_mode (ablate/train/backends.py): checked, set for the whole
process the same way every time, and equal in what they train. Their CUDA kernels are timed by
`ablate bench --vs` and run for real in the cuda tier (tests/test_cuda_tier.py)."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY, completed_trainer, invoke_ablate, loss_curve, run_ablate, scripted_trainer


@pytest.mark.parametrize("args, message", [
    (["train.sdpa_backend=fast"], "error: train.sdpa_backend must be auto, flash, efficient, cudnn or math"),
    (["train.compile_mode=turbo"], "error: train.compile_mode must be default, reduce-overhead"),
    (["train.compile_mode=reduce-overhead", "train.compile_backend=eager"],
     "error: train.compile_mode=reduce-overhead is an Inductor mode"),
    (["train.sdpa_backend=cudnn", "train.deterministic=true"],
     "error: train.sdpa_backend=cudnn has no deterministic backward"),
])
def test_bad_kernel_settings_are_one_line_errors(tmp_path, args, message):
    res = invoke_ablate("run", *TINY, *args, f"hydra.run.dir={tmp_path / 'run'}")  # refused before Hydra
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [next(l for l in res.stderr.splitlines() if l.startswith("error:"))]
    assert message in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "run").exists()


def test_a_cuda_only_kernel_on_cpu_fails_in_one_line(tmp_path):
    res = run_ablate("run", *TINY, "train.sdpa_backend=efficient", "logger=none",
                     f"hydra.run.dir={tmp_path / 'run'}")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "error: train.sdpa_backend=efficient is a CUDA kernel; on cpu use auto, flash or math" in res.stderr


def _curve(tmp_path, *overrides):
    return loss_curve(completed_trainer(tmp_path, "train.steps=8", "train.log_every=1", *overrides))


def test_each_cpu_kernel_trains_the_same_model(tmp_path):
    """flash and math are two kernels for one function: the same curve up to fp32 rounding."""
    auto = _curve(tmp_path / "auto")
    for name in ("flash", "math"):
        assert _curve(tmp_path / name, f"train.sdpa_backend={name}") == pytest.approx(auto, rel=1e-4, abs=1e-5)


def test_a_chosen_kernel_is_the_only_one_and_does_not_leak_into_the_next_job(tmp_path):
    from ablate.train.backends import SDPA_DEFAULTS

    cuda = torch.backends.cuda
    scripted_trainer(tmp_path / "a", "train.sdpa_backend=math")
    assert cuda.math_sdp_enabled() and not cuda.flash_sdp_enabled() and not cuda.cudnn_sdp_enabled()
    scripted_trainer(tmp_path / "b")  # the next job of an in-process sweep: torch's defaults again
    assert {"flash": cuda.flash_sdp_enabled(), "efficient": cuda.mem_efficient_sdp_enabled(),
            "cudnn": cuda.cudnn_sdp_enabled(), "math": cuda.math_sdp_enabled()} == SDPA_DEFAULTS


def test_a_kernel_that_cannot_run_the_model_is_refused_at_start(monkeypatch):
    """The probe runs the model's attention shape once under the chosen kernel."""
    from ablate.errors import ConfigError
    from ablate.train.backends import check_sdpa_backend, set_sdpa_backend

    set_sdpa_backend("flash", "cpu")
    try:
        check_sdpa_backend("flash", 2, 16, torch.device("cpu"), torch.float32)  # runs: no error
        torch.backends.cuda.enable_flash_sdp(False)  # as if flash could not take this input
        with pytest.raises(ConfigError, match=r"train.sdpa_backend=flash cannot run this model's "
                                              r"attention on cpu \(float32, head_dim 16\)"):
            check_sdpa_backend("flash", 2, 16, torch.device("cpu"), torch.float32)
    finally:
        set_sdpa_backend("auto", "cpu")


def test_bench_times_each_contender_under_its_own_settings():
    """`bench --vs train.sdpa_backend=math`: the switches are process-wide and the contenders
    alternate in one process, so each round must run under its own contender's settings."""
    from ablate.measure.bench import bench_variants

    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.backends.cuda.flash_sdp_enabled())
        return real(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        r = bench_variants([*TINY, "train.threads=1"], [("math", ["train.sdpa_backend=math"])],
                           steps=4, warmup=1, rounds=4)
    finally:
        torch.nn.functional.scaled_dot_product_attention = real
    assert "error" not in r["rows"][0]
    # from the variant's first step on (its Trainer switched flash off for the process), the
    # baseline's rounds still run with flash allowed, the variant's without
    after = seen[seen.index(False):]
    assert True in after and after.count(False) >= 4
