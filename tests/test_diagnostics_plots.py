"""The diagnostics figure of `ablate compare --plot` (ablate/tracking/diagnostics_plots.py)."""

from __future__ import annotations

from ablate.tracking.diagnostics_plots import plot_diagnostics


def test_plot_diagnostics_writes_a_figure(tmp_path):
    def rows(scale):
        out = []
        for step in (1, 5, 10):
            r = {"step": step, "train_loss": 3.0}
            out.append(r)
            d = {"step": step, "diag/loss_spikes": step // 5}
            for i in range(3):
                d[f"diag/grad_norm/block{i}"] = scale * (i + 1) / step
                d[f"diag/grad_norm/block{i}.attn"] = scale
                d[f"diag/resid_rms/block{i}"] = 1.0 + i
                d[f"diag/max_attn_logit/block{i}"] = float(step + i)
                d[f"diag/dead_ffn_frac/block{i}"] = 0.01 * step
            if step > 1:
                d["diag/update_ratio/input"] = 1e-3
            out.append(d)
        return out

    path = tmp_path / "cmp_diag.png"
    assert plot_diagnostics({"pre": rows(1.0), "post": rows(2.0)}, path) == str(path)
    assert path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG"
    assert plot_diagnostics({"none": [{"step": 1, "train_loss": 3.0}]}, tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()
