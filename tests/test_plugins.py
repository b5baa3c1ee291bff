"""Your own variant without forking. A norm defined in a directory outside the package (on
PYTHONPATH) is loaded by `plugins=[...]` or an `ablate.plugins` entry point, its conf file is
found on Hydra's search path, and it is run and swept against the built-ins; an option with its
own setting and its own init takes the same path as the built-in norm=dyt."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, TINY, find_run_dirs, run_ablate

from ablate.model import options

# The README's example, as written there.
MY_NORM = '''\
"""CRMSNorm: center, then RMS-normalize, with a gain (LayerNorm without its bias)."""
import torch
from torch import nn

from ablate.model.roles import Role, tag
from ablate.plugins import register_option


class CRMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        tag(self.weight, Role.GAIN)  # every parameter has a role (init, weight decay)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d) -> (B, T, d)
        x = x - x.mean(-1, keepdim=True)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


register_option("norm", "crmsnorm", CRMSNorm, params=lambda spec, d: d)  # one gain of width d
'''


def make_plugin(root: Path, conf_file: bool = False) -> dict:
    """conf_file: also a conf/norm/crmsnorm.yaml, the older way to give an option its config values (still used)."""
    pkg = root / "my_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "my_norm.py").write_text(MY_NORM)
    if conf_file:
        (pkg / "conf" / "norm").mkdir(parents=True)
        (pkg / "conf" / "norm" / "crmsnorm.yaml").write_text("name: crmsnorm\neps: 1.0e-6\n")
    return {"PYTHONPATH": str(root)}


def test_a_norm_from_outside_the_package_is_swept_against_the_builtins(tmp_path):
    env = make_plugin(tmp_path / "src")
    sweep_dir = tmp_path / "sweep"
    res = run_ablate("sweep", *TINY, "train.threads=1", "plugins=[my_pkg.my_norm]",
                     "norm=layernorm,rmsnorm,crmsnorm", f"hydra.sweep.dir={sweep_dir}", env=env)
    assert res.returncode == 0, res.stderr
    runs = {d.name: json.loads((d / "summary.json").read_text()) for d in find_run_dirs(sweep_dir)}
    assert sorted(runs) == ["0_baseline", "1_norm=rmsnorm", "2_norm=crmsnorm"]
    assert runs["2_norm=crmsnorm"]["status"] == "completed"
    assert runs["2_norm=crmsnorm"]["axes"]["norm"] == "crmsnorm"
    # one gain per norm, no bias: fewer parameters than LayerNorm's, as the model really built it
    assert runs["2_norm=crmsnorm"]["params"] < runs["0_baseline"]["params"]
    from ablate.analysis import compare_dirs

    assert [r["variant"] for r in compare_dirs([sweep_dir])] == ["baseline", "norm=rmsnorm", "norm=crmsnorm"]
    assert "norm=crmsnorm" in res.stdout  # the comparison printed at the end


def test_a_missing_plugin_module_is_one_line_and_nothing_is_written(tmp_path):
    for command in ("run", "sweep", "inspect"):
        res = run_ablate(command, *TINY, "plugins=[no_such_pkg.norms]", "norm=layernorm,rmsnorm"
                         if command == "sweep" else "norm=layernorm", f"out_dir={tmp_path}")
        assert res.returncode == 2, (command, res.stderr)
        assert res.stderr.startswith("error: plugin module 'no_such_pkg.norms' not found")
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert not list(tmp_path.iterdir())


def test_an_option_without_its_plugin_names_the_valid_options(tmp_path):
    res = run_ablate("run", *TINY, "norm=crmsnorm", f"out_dir={tmp_path}")
    builtin = ", ".join(sorted(options.names("norm")))
    assert res.returncode == 2 and f"Available options in 'norm': {builtin}\n" in res.stderr


def test_an_installed_entry_point_plugin_is_loaded_without_naming_it(tmp_path):
    src = tmp_path / "src"
    env = make_plugin(src, conf_file=True)
    dist = src / "my_pkg-0.1.dist-info"  # what `pip install` of a package declaring it writes
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[ablate.plugins]\ncrmsnorm = my_pkg.my_norm\n")
    res = run_ablate("inspect", "norm=crmsnorm", "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["axes"]["norm"] == "crmsnorm"
    # the plugin's own conf file is the option's config, without Hydra's schema-matching warning
    assert json.loads(res.stdout)["spec"]["norm_eps"] == 1e-6 and not res.stderr


def test_a_plugin_option_runs_in_launcher_subprocesses(tmp_path):
    """submitit_local starts each job in a fresh process (as SLURM does): the job imports the
    plugins its config lists before it builds the model."""
    env = make_plugin(tmp_path / "src")
    sweep_dir = tmp_path / "sweep"
    res = run_ablate("sweep", *TINY, "train.threads=1", "launcher=submitit_local",
                     "plugins=[my_pkg.my_norm]", "norm=layernorm,crmsnorm",
                     f"hydra.sweep.dir={sweep_dir}", env=env)
    assert res.returncode == 0, res.stderr
    summary = json.loads((sweep_dir / "1_norm=crmsnorm" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["axes"]["norm"] == "crmsnorm"


def test_axes_lists_a_plugins_options_beside_the_builtins(tmp_path):
    env = make_plugin(tmp_path / "src")
    res = run_ablate("axes", "plugins=[my_pkg.my_norm]", "--json", env=env)
    assert res.returncode == 0, res.stderr
    norm = next(r for r in json.loads(res.stdout) if r["group"] == "norm")
    assert norm["options"] == sorted(options.names("norm")) + ["crmsnorm"]
    assert norm["plugins"] == {"crmsnorm": "my_pkg.my_norm"}
    table = run_ablate("axes", "plugins=[my_pkg.my_norm]", env=env).stdout
    assert "crmsnorm*" in table and "* from a plugin: my_pkg.my_norm" in table
    plain = next(r for r in json.loads(run_ablate("axes", "--json").stdout) if r["group"] == "norm")
    assert plain["options"] == sorted(options.names("norm")) and plain["plugins"] == {}


def test_axes_refuses_other_overrides_and_missing_plugins_in_one_line():
    for arg, message in [("norm=rmsnorm", "error: ablate axes takes only plugins=[my_pkg.my_module], got "
                                          "'norm=rmsnorm'"),
                         ("plugins=[no_such_pkg.norms]", "error: plugin module 'no_such_pkg.norms' not found")]:
        res = run_ablate("axes", arg)
        assert res.returncode == 2 and res.stderr.startswith(message), res.stderr
        assert len(res.stderr.strip().splitlines()) == 1


# ---- an option is one declaration ----------------------------------------------------------------
# A norm with a bias and a gated activation, one registration each, from outside the package and
# with no config file: structurally LayerNorm and SwiGLU, so every count must equal theirs.
OUR_OPTIONS = '''\
import torch.nn.functional as F

from ablate.model.norms import LayerNorm
from ablate.plugins import register_option


class BiasRMSNorm(LayerNorm):
    """RMSNorm with LayerNorm's gain and beta: y = x / rms(x) * g + b (b only with bias=on)."""

    def forward(self, x):  # (B, T, d) -> (B, T, d)
        y = F.rms_norm(x, x.shape[-1:], self.weight, self.eps)
        return y if self.bias is None else y + self.bias


register_option("norm", "biasrms", BiasRMSNorm, params=lambda spec, d: d * (2 if spec.bias else 1))
register_option("act", "sqreglu", lambda x: F.relu(x).square(), gated=True)  # Primer's ReLU^2, gated
'''


def make_options_plugin(root: Path) -> dict:
    root.mkdir(parents=True)
    (root / "our_options.py").write_text(OUR_OPTIONS)
    return {"PYTHONPATH": str(root)}


def inspect_json(*args: str, env: dict | None = None) -> dict:
    res = run_ablate("inspect", *args, "--json", "--build", env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_options_from_outside_are_counted_listed_tested_and_trained_like_builtins(tmp_path):
    env = make_options_plugin(tmp_path / "src")
    ours = inspect_json("plugins=[our_options]", "norm=biasrms", "act=sqreglu", env=env)
    same_shape = inspect_json("norm=layernorm", "act=swiglu")
    # inspect: the counts (by component), the FFN width and the FLOPs of LayerNorm + SwiGLU ...
    for key in ("params", "non_embedding_params", "flops_per_token", "vs_baseline"):
        assert ours[key] == same_shape[key], key
    assert ours["spec"]["d_ff"] == same_shape["spec"]["d_ff"] == 336  # gated: size-matched
    assert ours["ffn"]["gated"] is True
    # ... and the model built from the declarations has exactly that many parameters
    assert ours["built_params"] == ours["params"]
    # axes: both listed, marked as the plugin's
    res = run_ablate("axes", "plugins=[our_options]", "--json", env=env)
    rows = {r["group"]: r for r in json.loads(res.stdout)}
    assert rows["norm"]["plugins"] == {"biasrms": "our_options"} and "biasrms" in rows["norm"]["options"]
    assert rows["act"]["plugins"] == {"sqreglu": "our_options"} and "sqreglu" in rows["act"]["options"]
    # the fairness test holds them to its checks (size delta = inspect's, shared init, signal)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                          "tests/test_fairness.py", "-k", "option_changes_only_its_axis and (biasrms or sqreglu)"],
                         cwd=ROOT, env={**os.environ, **env, "ABLATE_TEST_PLUGINS": "our_options"},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "2 passed" in res.stdout, res.stdout + res.stderr
    # a real run: summary.json's params and FLOPs are the built model's
    run_dir = tmp_path / "run"
    res = run_ablate("run", *TINY, "train.steps=2", "plugins=[our_options]", "norm=biasrms",
                     "act=sqreglu", f"hydra.run.dir={run_dir}", env=env)
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    tiny = inspect_json(*TINY, "plugins=[our_options]", "norm=biasrms", "act=sqreglu", env=env)
    assert summary["status"] == "completed"
    assert summary["params"] == tiny["built_params"]["total"] == tiny["params"]["total"]
    assert summary["flops_per_token"] == tiny["flops_per_token"]


# ---- an option with its own setting and its own init: docs/extending.md's ScaleNorm ----------------
def documented_plugin(root: Path, module: str) -> dict:
    """my_pkg/<module>.py as docs/extending.md writes it (its heredoc), under `root`."""
    text = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    code = re.search(rf"cat > my_pkg/{module}\.py <<'PY'\n(.*?)\nPY\n", text, re.S)
    assert code, f"docs/extending.md lost its my_pkg/{module}.py example"
    (root / "my_pkg").mkdir(parents=True, exist_ok=True)
    (root / "my_pkg" / "__init__.py").write_text("")
    (root / "my_pkg" / f"{module}.py").write_text(code.group(1) + "\n")
    return {"PYTHONPATH": str(root)}


def test_a_plugin_norm_with_its_own_setting_and_init_runs_end_to_end(tmp_path):
    env = documented_plugin(tmp_path / "src", "scale_norm")
    plugin = ["plugins=[my_pkg.scale_norm]", "norm=scalenorm"]
    # its init: g = g0_scale * sqrt(d) in every norm of the model the run would build
    probe = ("from ablate.config.compose import compose_config as c; from ablate.model.spec import ModelSpec as S; "
             "from ablate.model.transformer import build_model as b; import sys; "
             "m = b(S.from_config(c(sys.argv[1:]))); "
             "print(sorted({round(p.item(), 4) for n, p in m.named_parameters() if n.endswith('.g')}))")
    for g0_scale, expected in ((None, [round(32 ** 0.5, 4)]), ("2", [round(2 * 32 ** 0.5, 4)])):
        setting = [f"norm.g0_scale={g0_scale}"] if g0_scale else []
        res = subprocess.run([sys.executable, "-c", probe, *TINY, *plugin, *setting], cwd=ROOT,
                             env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and res.stdout.strip() == str(expected), res.stdout + res.stderr
    # its setting: a typed key of its config group, an unknown one refused listing the valid ones
    bad = run_ablate("run", *TINY, *plugin, "norm.g0=2", f"out_dir={tmp_path / 'none'}", env=env)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: unknown config key 'norm.g0' (none is close; norm has: eps, g0_scale, name)")
    # a real run, counted as inspect counts it; then the fairness checks (it normalizes)
    run_dir = tmp_path / "run"
    res = run_ablate("run", *TINY, "train.steps=2", *plugin, "norm.g0_scale=2", f"hydra.run.dir={run_dir}",
                     env=env)
    assert res.returncode == 0, res.stderr
    assert "g0_scale: 2.0" in (run_dir / "config.yaml").read_text()
    inspected = json.loads(run_ablate("inspect", *TINY, *plugin, "norm.g0_scale=2", "--json", "--build",
                                      env=env).stdout)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["params"] == inspected["built_params"]["total"]
    assert inspected["spec"]["settings"] == {"norm": {"g0_scale": 2.0}}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                          "tests/test_fairness.py", "-k", "option_changes_only_its_axis and scalenorm"],
                         cwd=ROOT, env={**os.environ, **env, "ABLATE_TEST_PLUGINS": "my_pkg.scale_norm"},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "1 passed" in res.stdout, res.stdout + res.stderr
