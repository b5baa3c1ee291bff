"""What a run prints: a banner before the first step, plain step lines off a terminal (a cluster
job's log), eval lines always, the same lines in the run's ablate.log, nothing cut at 80
columns, and a quiet console in a sweep job."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
import re
import subprocess
import sys

from conftest import ROOT, TINY, run_ablate, run_on_terminal

from ablate.run.record import RunInfo, RunRecord
from ablate.tracking.sinks import About, ConsoleSink

STEP = re.compile(r"^step +(\d+)/(\d+) \| loss \d+\.\d{4} \| [\d,]+ tok/s( \| mfu \d+\.\d%)? \| eta (\?|\S+)$")
EVAL = re.compile(r"^step +(\d+)/(\d+) \| val_loss \d+\.\d{4} \| val_bpb \d+\.\d{4}$")


def test_a_piped_run_prints_a_banner_plain_lines_and_writes_them_to_ablate_log(tmp_path):
    run = tmp_path / ("a-long-run-directory-name-" + "x" * 60)
    args = [o for o in TINY if o != "train.progress=false"]
    res = run_ablate("run", *args, "train.log_every=2", "train.eval_every=3", f"hydra.run.dir={run}")
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert "\r" not in res.stdout  # no progress-bar frames in a file
    steps = [line for line in out if STEP.match(line)]
    assert [int(STEP.match(line).group(1)) for line in steps] == [2, 4, 6]
    assert [int(EVAL.match(line).group(1)) for line in out if EVAL.match(line)] == [0, 3, 6]
    # the banner comes before the first step and says what trains, where
    first = out.index(steps[0])
    head = "\n".join(out[:first])
    assert "params 37,760" in head and "FLOPs/token" in head and "tokens/step 128" in head
    assert "device cpu | precision fp32 | compile off | 6 steps" in head and f"run dir {run}" in head
    # the final table is not cut at 80 columns: the whole run dir is on one line
    assert any(str(run) in line and "run dir" in line for line in out[first:])
    logged = (run / "ablate.log").read_text()
    for line in steps + [line for line in out if EVAL.match(line)] + [f"  run dir {run}"]:
        assert line in logged
    assert "status" in logged and "completed" in logged  # the table too


def test_progress_false_still_prints_eval_lines(tmp_path):
    res = run_ablate("run", *TINY, "train.eval_every=3", f"hydra.run.dir={tmp_path / 'r'}")
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert [int(EVAL.match(line).group(1)) for line in out if EVAL.match(line)] == [0, 3, 6]
    assert not [line for line in out if STEP.match(line)]
    assert len([line for line in (tmp_path / "r" / "ablate.log").read_text().splitlines() if "| loss " in line]) == 6


def rows():
    yield {"step": 5, "tokens": 640, "train_loss": 4.0, "grad_norm": 1.0, "lr": 1e-3, "tokens_per_s": 1234.5, "mfu": 0.3125}
    yield {"step": 5, "tokens": 640, "val_loss": 4.1, "val_bpb": 1.5}
    yield {"step": 10, "tokens": 1280, "train_loss": 3.5, "grad_norm": 1.0, "lr": 1e-3, "tokens_per_s": 1500.0}


INFO = RunInfo(params=1000, non_embedding_params=500, flops_per_token=6000, tokens_per_step=128,
               device="cuda:0", precision="bf16", compile=True)


def test_step_lines_show_mfu_when_the_row_has_it(capsys, caplog):
    sink = ConsoleSink(100, tty=False, about=About("norm=rmsnorm", 1, "runs/x"))
    with caplog.at_level(logging.INFO, logger="ablate"):
        sink.start(INFO)
        for row in rows():
            sink.log(row)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "ablate run: norm=rmsnorm (seed 1)"
    assert out[2] == "  device cuda:0 | precision bf16 | compile on | 100 steps"
    assert out[4:] == ["step   5/100 | loss 4.0000 | 1,234 tok/s | mfu 31.2% | eta ?",
                       "step   5/100 | val_loss 4.1000 | val_bpb 1.5000",
                       out[6]]
    assert STEP.match(out[6]) and "mfu" not in out[6] and not out[6].endswith("eta ?")
    assert [r.getMessage() for r in caplog.records] == out  # ablate.log gets the same lines


def test_a_sweep_job_prints_nothing_but_logs_everything(capsys, caplog):
    from ablate.run.summary import print_summary

    sink = ConsoleSink(100, quiet=True, tty=True, about=About("v", 0, "d"))
    with caplog.at_level(logging.INFO, logger="ablate"):
        sink.start(INFO)
        for row in rows():
            sink.log(row)
        sink.finish(RunRecord("completed"))
        print_summary(RunRecord.from_json({"status": "completed", "variant": "v", "seed": 0}), "d" * 120,
                      console=False)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 4 + 3 + 1 and "d" * 120 in logged[-1]


def _corpus(root, sizes=(25_000, 15_000)):
    """Plain ASCII text files of exactly these sizes (bytes): the corpus a user points at."""
    text = (ROOT / "README.md").read_text(encoding="ascii", errors="ignore").replace("\r", "")
    root.mkdir()
    for i, size in enumerate(sizes):
        (root / f"part{i}.txt").write_text((text * (size // len(text) + 1))[:size])
    return sum(sizes)


def _tokenize_args(tmp_path) -> list[str]:
    # train.progress on (TINY turns it off): what a user's run shows while tokenizing
    return ["run", *[o for o in TINY if o != "train.progress=false"], "data=text_files",
            f'data.paths=["{tmp_path}/corpus/*.txt"]', f"hydra.run.dir={tmp_path / 'run'}"]


def test_off_a_terminal_tokenizing_is_plain_lines_with_the_corpus_bytes(tmp_path):
    total = _corpus(tmp_path / "corpus")
    log = tmp_path / "run.log"
    with log.open("w") as out:  # `ablate run ... > run.log 2>&1`
        res = subprocess.run([sys.executable, "-m", "cli.main", *_tokenize_args(tmp_path)], cwd=ROOT,
                             stdout=out, stderr=subprocess.STDOUT, timeout=300,
                             env={**os.environ, "ABLATE_CACHE": str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": ""})
    text = log.read_text()
    assert res.returncode == 0, text
    assert "\r" not in text and "it/s" not in text and "B/s" not in text  # no bar fragments
    lines = text.splitlines()
    assert lines[0] == "tokenizing text_files with byte ..."
    done = re.fullmatch(r"tokenizing text_files with byte: done, ([\d,]+) bytes of text in 2 documents -> "
                        r"([\d,]+) tokens \(\d+\.\d s\)", lines[1])
    assert done and int(done.group(1).replace(",", "")) == total, lines[1]
    assert int(done.group(2).replace(",", "")) == total + 2  # byte tokenizer: one per byte, one end-of-text per file
    assert lines[2].startswith("ablate run: ")  # the banner on a line of its own


def test_on_a_terminal_the_bar_ends_at_the_corpus_bytes(tmp_path):
    _corpus(tmp_path / "corpus", sizes=(30_000, 10_000))  # 40.0kB
    code, seen = run_on_terminal(*_tokenize_args(tmp_path), stdout=False,
                                 env={"ABLATE_CACHE": str(tmp_path / "cache")})
    assert code == 0, seen
    frames = [f for f in re.split(r"[\r\n]", seen) if f.startswith("tokenizing text_files with byte:")]
    assert frames and frames[-1].startswith("tokenizing text_files with byte: 40.0kB "), repr(seen)


def _banner_args(tmp_path) -> list[str]:
    """A run whose banner has a line of fields longer than 80 columns."""
    return ["run", *TINY, "model.d_model=128", "train.batch_size=64", "train.steps=1",
            f"hydra.run.dir={tmp_path / 'run'}"]


def _banner(text: str) -> list[str]:
    lines = text.splitlines()
    return lines[:next(i for i, line in enumerate(lines) if "run dir" in line) + 1]


def test_the_banner_breaks_between_fields_on_a_terminal_and_not_when_piped(tmp_path):
    piped = run_ablate(*_banner_args(tmp_path / "piped"), env={"COLUMNS": "80"})
    assert piped.returncode == 0, piped.stderr
    full = _banner(piped.stdout)
    (params,) = [line for line in full if line.startswith("  params ")]
    assert len(params) > 80 and params.endswith(" | tokens/step 2,048")  # whole, though COLUMNS=80
    code, seen = run_on_terminal(*_banner_args(tmp_path / "tty"), columns=80)
    assert code == 0, seen
    shown = _banner(seen)
    for line in [line for line in full if " | " in line]:  # every field whole on one terminal line
        for field in line.strip().split(" | "):
            assert any(field in row for row in shown), (field, shown)
    rows = shown[shown.index(next(r for r in shown if r.startswith("  params "))):]
    assert rows[1] == "    tokens/step 2,048" and all(len(r) <= 80 for r in rows[:3]), shown


def test_wrapped_lines_keep_every_word_and_fit_unless_a_word_cannot():
    from ablate.terminal import wrap_line
    from ablate.tracking.sinks import banner

    path = "/runs/2026-11-26/17-19-28_" + "data.paths=h74dba236,model.d_model=32," * 3
    lines = banner(About("norm=rmsnorm", 0, path), replace(INFO, grad_accum_steps=4, micro_batch=8), 1200)
    lines.append(("FFN: act=swiglu is gated (three matrices: gate, up, down), so d_ff is 336; " * 3).rstrip())
    for line in lines:
        for width in range(20, 130, 7):
            rows = wrap_line(line, width)
            assert " ".join(" ".join(rows).replace(" | ", " ").split()) == " ".join(line.replace(" | ", " ").split())
            assert all(not row.endswith(" ") for row in rows)
            longest = max(len(w) for w in line.split())
            for row in rows:  # too wide only when it holds a word wider than a line
                assert len(row) <= width or longest > width - 4, (width, rows)
            assert all(row.startswith(" " * (len(line) - len(line.lstrip()) + 2)) for row in rows[1:])


def test_the_final_table_says_where_the_offline_wandb_run_is_and_how_to_upload_it(tmp_path):
    run = tmp_path / "run"
    args = [o for o in TINY if o != "logger=none"] + ["logger=wandb", f"hydra.run.dir={run}"]
    res = run_ablate("run", *args, env={"WANDB_MODE": "offline"})
    assert res.returncode == 0, res.stderr
    (offline,) = (run / "wandb").glob("offline-run-*")  # what `wandb sync` uploads
    rows = [line.split("│")[1:3] for line in res.stdout.splitlines() if line.startswith("│ ")]
    assert [cell.strip() for cell in rows[-1]] == ["W&B", f"offline; upload with: wandb sync {offline}"]
