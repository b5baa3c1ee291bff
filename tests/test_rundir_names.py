"""Run and sweep job directory names that a shell takes as printed: a value with shell-special
characters (quotes, brackets, globs, spaces, $, braces) or a long one is named by a short stable
hash of it; plain values keep their readable names. A printed path pasted unquoted into a real
shell reaches `ablate resume` and `ablate compare` as it was printed."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, TINY, find_run_dirs, run_ablate

# What a shell leaves alone in an unquoted word (bash and zsh alike): no quote, glob, bracket,
# brace, $, ~, space, ;, &, |, <, >, !, #, * or ?.
SHELL_PLAIN = re.compile(r"[A-Za-z0-9._+,:@%=/-]+")


def shell(command: str) -> subprocess.CompletedProcess:
    """`command` run by bash, as a user pastes it (the path interpolated unquoted)."""
    env_python = shlex.quote(sys.executable)
    return subprocess.run(["bash", "-c", command.replace("ablate ", f"{env_python} -m cli.main ", 1)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize("overrides", [
    'data.paths=["corpus/*.txt"],data=text_files,train.steps=50',
    "data.paths=[a.txt,b.txt]", "logger.name='my run'", "x=${oc.env:HOME}", "x={a,b}", "x=a;b",
    "x=it's", "x=!1", "x=#1", "~model.d_ff", "+x=" + "1" * 60, "a=1," * 60 + "b=2",
])
def test_every_name_is_one_plain_shell_word(overrides):
    from ablate.run.directory import dir_name

    name = dir_name(overrides)
    assert SHELL_PLAIN.fullmatch(name) and shlex.split(name) == [name], name
    assert "/" not in name and len(name) <= 160


def test_plain_values_keep_their_names_and_others_a_stable_hash():
    from ablate.run.directory import dir_name
    from ablate.sweep.planning import Job

    for plain in ("train.steps=200", "act=swiglu,norm=rmsnorm", "+model.z_loss=1e-4",
                  "model.init_std=-0.02", "baseline", "+rmsnorm"):
        assert dir_name(plain) == plain
    assert dir_name("tokenizer.path=/a/b") == "tokenizer.path=_a_b"  # a path does not nest
    special = 'data.paths=["corpus/*.txt"]'
    name = dir_name(special + ",train.steps=50")
    assert re.fullmatch(r"data\.paths=h[0-9a-f]{8},train\.steps=50", name), name
    assert dir_name(special) == dir_name(special)  # stable: resumed sweeps find their jobs
    assert dir_name(special) != dir_name('data.paths=["corpus/*.md"]')
    assert dir_name("x=" + "a" * 40) == "x=" + "a" * 40 and dir_name("x=" + "a" * 41) != "x=" + "a" * 41
    assert Job([], "act=swiglu", seed=0).dir_name == "act=swiglu_seed0"
    assert Job([], "baseline", seed=2, tag="r0_lr0.01").dir_name == "baseline_r0_lr0.01_seed2"
    job = Job([], 'data.paths=["a.txt"]', seed=1)
    assert re.fullmatch(r"data\.paths=h[0-9a-f]{8}_seed1", job.dir_name)
    assert job.name == 'data.paths=["a.txt"]_seed1'  # the label (progress lines, W&B) reads as typed


def _printed_run_dir(stdout: str) -> str:
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("  run dir ")]
    return line[len("  run dir "):]


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    text = (ROOT / "README.md").read_text()
    for i in range(2):
        (d / f"part{i}.txt").write_text(text[i * 20000:(i + 1) * 20000])
    return d


def test_a_printed_run_dir_pastes_into_resume_and_compare(tmp_path, corpus):
    res = run_ablate("run", *TINY, "data=text_files", f'data.paths=["{corpus}/*.txt"]', f"out_dir={tmp_path}/runs")
    assert res.returncode == 0, res.stderr
    printed = _printed_run_dir(res.stdout)
    (run_dir,) = find_run_dirs(tmp_path / "runs")
    assert printed == str(run_dir) and SHELL_PLAIN.fullmatch(printed), printed
    assert re.search(r"_data\.paths=h[0-9a-f]{8},data=text_files,", run_dir.name), run_dir.name
    resumed = shell(f"ablate resume {printed} --extend 8")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 8
    compared = shell(f"ablate compare {printed} --json")
    assert compared.returncode == 0, compared.stderr
    assert json.loads(compared.stdout)[0]["n"] == 1


def test_sweep_job_dirs_paste_into_resume(tmp_path, corpus):
    (corpus / "other.md").write_text((ROOT / "README.md").read_text()[:30000])
    sweep_dir = tmp_path / "sweep"
    res = run_ablate("sweep", *TINY, "train.threads=1", "data=text_files", f"hydra.sweep.dir={sweep_dir}",
                     f'data.paths=["{corpus}/*.txt"],["{corpus}/*.md"]')
    assert res.returncode == 0, res.stderr
    names = sorted(d.name for d in find_run_dirs(sweep_dir))
    assert names[0] == "0_baseline" and re.fullmatch(r"1_data\.paths=h[0-9a-f]{8}", names[1]), names
    assert '[1/2] baseline' in res.stdout and f'data.paths=["{corpus}/*.md"]' in res.stdout  # labels as typed
    resumed = shell(f"ablate resume {sweep_dir / names[1]}")
    assert resumed.returncode == 0 and "already completed" in resumed.stderr, resumed.stderr
