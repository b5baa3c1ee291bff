"""`ablate eval` end to end on tiny trained runs, and train.eval_lengths at the end of training:
the per-run table, results keyed and additive, the run's own files never changed, a sweep
directory with runs skipped, and every bad input refused in one line with nothing written."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
import yaml

from conftest import TINY, built_once, find_run_dirs, invoke_ablate, run_ablate
from ablate.evaluation.length_record import EvalKey, EvalStatus, read_lengths
from ablate.names import variant_name

LENGTHS = "train.eval_lengths=[32,128]"  # TINY: train.seq_len=32, model.max_seq_len=64


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """pos=learned and pos=rope trained at 32 tokens, each evaluated at 32 and 128 when done;
    once for the session's workers (its tests change copies)."""
    def build(d):
        res = run_ablate("sweep", *TINY, "train.threads=1", "pos=learned,rope", LENGTHS,
                         f"hydra.sweep.dir={d / 'sweep'}")
        assert res.returncode == 0, res.stderr

    return built_once(tmp_path_factory, "eval-sweep", build) / "sweep"


def run_of(root: Path, pos: str) -> Path:
    """The sweep's (first) run of that pos, by its config."""
    return next(d for d in find_run_dirs(root)
                if yaml.safe_load((d / "config.yaml").read_text())["pos"]["name"] == pos)


def copied(sweep: Path, tmp_path: Path, pos: str) -> Path:
    return Path(shutil.copytree(run_of(sweep, pos), tmp_path / f"run_{pos}"))


def files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def refused(res, run: Path | None = None, before: dict | None = None) -> str:
    """The one `error:` line of exit 2; the run's files as they were."""
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith("error: ") and not res.stdout
    if run is not None:
        assert files(run) == before
    return lines[0]


# ---- train.eval_lengths ------------------------------------------------------------------------
def test_training_ends_with_the_lengths_evaluated(sweep):
    for pos in ("learned", "rope"):
        run = run_of(sweep, pos)
        summary = json.loads((run / "summary.json").read_text())
        record = read_lengths(run)
        assert record.train_seq_len == 32 and "eval_lengths" not in run.name
        at_train = record.get(EvalKey(32))
        # the training length reads training's own validation windows: the run's val_loss exactly
        assert at_train.loss == summary["val_loss"] and at_train.bpb == summary["val_bpb"]
        assert at_train.step == summary["step"] and at_train.scored_tokens == 512
        long = record.get(EvalKey(128))
        assert long.status == (EvalStatus.NOT_AVAILABLE if pos == "learned" else EvalStatus.OK)
    assert "64 position rows" in read_lengths(run_of(sweep, "learned")).get(EvalKey(128)).reason


def test_eval_lengths_name_no_variant_and_show_in_the_dry_run(tmp_path):
    assert variant_name(["train.eval_lengths=[64,128]", "pos=rope"]) == "pos=rope"
    res = run_ablate("sweep", *TINY, "pos=rope,alibi", "train.eval_lengths=[64,128]", "--dry-run",
                     f"hydra.sweep.dir={tmp_path / 's'}")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("train.eval_lengths=[64,128]") == 2 and "pos=alibi " in res.stdout
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("value,says", [("[0]", "positive integers"), ("[64,-8]", "positive integers"),
                                        ("[]", None), ("[1.5]", "eval_lengths"), ("abc", "eval_lengths")])
def test_eval_lengths_are_checked_at_compose_time(tmp_path, value, says):
    res = run_ablate("run", *TINY, f"train.eval_lengths={value}", "--cfg", "job")
    if says is None:  # none: nothing evaluated at the end
        assert res.returncode == 0 and "eval_lengths: []" in res.stdout, res.stderr
        return
    assert says in refused(res)


# ---- ablate eval ---------------------------------------------------------------------------------
def test_eval_prints_the_table_adds_keyed_results_and_changes_nothing_else(sweep, tmp_path):
    run = copied(sweep, tmp_path, "learned")
    before = files(run)
    res = run_ablate("eval", str(run), "--lengths", "32,64,128")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == str(run) and "trained at 32 tokens, 512 validation tokens scored" in lines[1]
    rows = {ln.split()[0]: ln.split()[1:] for ln in lines[3:6]}
    record = read_lengths(run)
    assert rows["32"] == [f"{record.get(EvalKey(32)).loss:.4f}", f"{record.get(EvalKey(32)).bpb:.4f}"]
    assert rows["64*"] == [f"{record.get(EvalKey(64)).loss:.4f}", f"{record.get(EvalKey(64)).bpb:.4f}"]
    assert rows["128*"][0] == "n/a" and "position rows" in lines[5]
    assert "2 of 3 stored earlier" in res.stdout  # 32 and 128 from the end of training
    assert {k: v for k, v in files(run).items() if k != "length_eval.json"} == {
        k: v for k, v in before.items() if k != "length_eval.json"}  # summary, metrics, checkpoints
    stored = (run / "length_eval.json").read_bytes()
    again = run_ablate("eval", str(run), "--lengths", "64")
    assert again.returncode == 0 and "1 of 1 stored earlier" in again.stdout
    assert (run / "length_eval.json").read_bytes() == stored
    strided = run_ablate("eval", str(run), "--lengths", "64", "--stride", "16", "--json")
    out = json.loads(strided.stdout)
    (one,) = out["runs"]
    assert one["results"][0]["stride"] == 16 and not one["results"][0]["stored"] and out["skipped"] == []
    assert one["results"][0]["beyond_training"] and one["scored_tokens"] == 512
    assert len(read_lengths(run).results) == 4 and not (run / "run.lock").exists()


def test_rope_scaling_is_recorded_in_the_key(sweep, tmp_path):
    run = copied(sweep, tmp_path, "rope")
    res = run_ablate("eval", str(run), "--lengths", "128", "--rope-scaling", "pi:2", "--json")
    assert res.returncode == 0, res.stderr
    (result,) = json.loads(res.stdout)["runs"][0]["results"]
    assert result["rope_scaling"] == "pi:2.0" and result["status"] == "ok"
    plain = read_lengths(run).get(EvalKey(128))
    assert read_lengths(run).get(EvalKey(128, None, "pi:2.0")).loss != plain.loss


def diverge(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    summary.update(status="diverged", reason="loss 9.1 > 3 x running mean")
    (run / "summary.json").write_text(json.dumps(summary))


def test_a_sweep_evaluates_its_finished_runs_and_lists_the_skipped(sweep, tmp_path):
    root = Path(shutil.copytree(sweep, tmp_path / "sweep"))
    shutil.rmtree(run_of(root, "rope") / "checkpoints")
    diverged = Path(shutil.copytree(run_of(root, "learned"), root / "9_diverged"))
    diverge(diverged)
    res = run_ablate("eval", str(root), "--lengths", "16")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(str(run_of(root, "learned")))
    assert "skipped 2 runs:" in res.stderr and "no checkpoint" in res.stderr and "diverged" in res.stderr
    assert read_lengths(run_of(root, "learned")).get(EvalKey(16)) is not None
    assert read_lengths(diverged).get(EvalKey(16)) is None


@pytest.mark.parametrize("args,says", [
    (["--lengths", "0"], "--lengths must be positive integers"),
    (["--lengths", "-64"], "--lengths must be positive integers"),
    (["--lengths", "64,1.5"], "'1.5'"),
    (["--lengths", ""], "--lengths is empty"),
    (["--lengths", "32,64", "--stride", "32"], "--stride must be at least 1 and below every length"),
    (["--lengths", "64", "--stride", "0"], "--stride"),
    (["--lengths", "64", "--rope-scaling", "pi"], "pi:FACTOR or ntk:FACTOR"),
    (["--lengths", "64", "--rope-scaling", "ntk:0.5"], "factor must be >= 1"),
    (["--lengths", "64", "--rope-scaling", "pi:2"], "needs a RoPE run"),  # a learned run
])
def test_bad_input_is_one_line_and_writes_nothing(sweep, tmp_path, args, says):
    run = copied(sweep, tmp_path, "learned")
    before = files(run)
    assert says in refused(invoke_ablate("eval", str(run), *args), run, before)  # refused before any device


@pytest.mark.parametrize("damage,says", [("weights", "no checkpoint"), ("diverged", "the run diverged"),
                                         ("locked", "in use by another process"),
                                         ("training", "the run is being trained")])
def test_a_run_that_cannot_be_evaluated_is_refused(sweep, tmp_path, other_pid, damage, says):
    run = copied(sweep, tmp_path, "rope")
    if damage == "weights":
        shutil.rmtree(run / "checkpoints")
    elif damage == "diverged":
        diverge(run)
    elif damage == "locked":  # a live process holds the run's lock
        (run / "run.lock").write_text(json.dumps({"pid": other_pid, "host": socket.gethostname()}))
    else:  # its record says running, in a live process
        summary = json.loads((run / "summary.json").read_text())
        summary.update(status="running", pid=other_pid, host=socket.gethostname())
        (run / "summary.json").write_text(json.dumps(summary))
    before = files(run)
    assert says in refused(run_ablate("eval", str(run), "--lengths", "64"), run, before)
