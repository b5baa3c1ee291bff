"""`ablate eval` and `ablate sample` on inputs that used to end in a traceback, a hang or a
misleading line: sizes checked before anything is allocated (the figure in the message),
damaged files named in one line with the command that fixes them, a sweep's run that cannot be
evaluated skipped with its reason while the others are evaluated and printed; and eval's
progress (a line per run, each table as it is done) and the threads notice."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import ablate.evaluation.budget as budget
from ablate.evaluation.length_record import EvalKey, read_lengths
from ablate.evaluation.sample import SampleOptions, TextStream, sample_run
from ablate.train import threads
from conftest import invoke_ablate
from test_eval_cli import copied, files, refused, run_of, sweep  # noqa: F401 (the trained sweep fixture)
from test_sample import write_run

GIB = 2 ** 30


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory) -> Path:
    """A RoPE run's config and random weights (no training): nothing bounds its positions."""
    d = tmp_path_factory.mktemp("rope") / "run"
    write_run(d, ["pos=rope"])
    return d


def one_error_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr and not res.stdout, res.stderr
    return lines[0]


# ---- sizes ----------------------------------------------------------------------------------------
def test_a_cache_too_big_for_memory_is_refused_with_its_size(rope_run, monkeypatch):
    monkeypatch.setattr(budget, "free_bytes", lambda device="cpu": 8 * GIB)
    # TINY: 2 layers x 2 KV heads x head_dim 16, fp32: 2 x 2 x 2 x 16 x 4 = 512 bytes a position
    line = one_error_line(invoke_ablate("sample", str(rope_run), "--max-new-tokens", "1000000000"))
    assert line.startswith("error: --max-new-tokens 1,000,000,000: a KV cache of 1,000,000,001 positions "
                           "(512 B each per sample) needs about 476.84 GiB, more than the 8.00 GiB free; "
                           "ask for at most "), line
    most = int(line.split("at most ")[1].split(" new tokens")[0].replace(",", ""))
    assert 0.75 * 8 * GIB / 512 / budget.HEADROOM < most <= 8 * GIB / 512 / budget.HEADROOM
    line = one_error_line(invoke_ablate("sample", str(rope_run), "--num-samples", "1000000"))
    assert "--max-new-tokens 200 for 1,000,000 samples: a KV cache of 201 positions (512 B each per sample)" in line
    samples = int(line.split("at most ")[-1].split(" samples")[0].replace(",", ""))
    assert 0.9 * 8 * GIB / budget.HEADROOM / (201 * 512) < samples < 8 * GIB / budget.HEADROOM / (201 * 512)


def test_an_eval_length_too_big_for_memory_is_refused_before_anything_is_evaluated(sweep, tmp_path, monkeypatch):
    run = copied(sweep, tmp_path, "rope")
    before = files(run)
    monkeypatch.setattr(budget, "free_bytes", lambda device="cpu": 600 * 2 ** 10)
    # TINY scores 512 validation tokens: 512 is the longest length with a window (logits alone: 512 KiB)
    line = refused(invoke_ablate("eval", str(run), "--lengths", "64,512"), run, before)
    assert line.startswith(f"error: {run}: --lengths 512: 1 window of 512 tokens (pos=rope) needs about ")
    assert "more than the 600.00 KiB free; evaluate shorter lengths (" in line and " tokens fit) or free memory" in line


def test_the_estimate_is_the_real_passes_peak_and_grows_with_the_square_of_an_alibi_bias():
    import torch

    from conftest import compose
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import Transformer

    spec = ModelSpec.from_config(compose(["pos=alibi", "model.max_seq_len=4096"]), tokenizer_vocab=256)
    real = Transformer(spec).eval()
    x = torch.zeros(1, 256, dtype=torch.long)
    on_cpu = budget.peak_bytes(lambda: torch.nn.functional.cross_entropy(real(x).logits.flatten(0, 1), x.flatten()))
    assert budget.forward_bytes(spec, 1, 256) == pytest.approx(on_cpu, rel=0.01)  # meta: the same tensors
    small, large = budget.forward_bytes(spec, 1, 1024), budget.forward_bytes(spec, 1, 2048)
    bias = spec.n_heads * 2048 ** 2 * 4  # the (1, heads, T, T) fp32 bias ALiBi adds to the logits
    assert large >= bias and 3.5 < large / small < 4.2
    cache = budget.decode_bytes(spec, 3, 10, 1000) - budget.decode_bytes(spec, 3, 10, 10)
    assert cache == 2 * spec.n_layers * 3 * spec.n_kv_heads * 990 * spec.head_dim * 4  # k and v, fp32


# ---- damaged files --------------------------------------------------------------------------------
def test_damaged_files_are_named_in_one_line_with_what_fixes_them(sweep, tmp_path):
    run = copied(sweep, tmp_path, "rope")
    (run / "length_eval.json").write_text('{"version": 1, "train_')
    line = one_error_line(invoke_ablate("eval", str(run), "--lengths", "64"))
    assert line.startswith(f"error: {run / 'length_eval.json'}: unreadable (Unterminated string")
    assert line.endswith(f"`mv {run / 'length_eval.json'} {run / 'length_eval.json'}.bad`")
    (run / "length_eval.json").unlink()
    summary = (run / "summary.json").read_text()
    (run / "summary.json").write_text(summary[:40])
    line = one_error_line(invoke_ablate("eval", str(run), "--lengths", "64"))
    assert line.startswith(f"error: {run / 'summary.json'}: unreadable (")
    assert line.endswith(f"rewrite it from the run's last checkpoint with `ablate resume {run}`, then evaluate it")
    (run / "summary.json").write_text(summary)
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text("model: [unclosed\n")
    for cmd in (["eval", str(run), "--lengths", "64"], ["sample", str(run)]):
        line = one_error_line(invoke_ablate(*cmd))
        assert line.startswith(f"error: {run / 'config.yaml'}: unreadable (") and \
            line.endswith(f"restore it from Hydra's copy: `cp {run / '.hydra' / 'config.yaml'} {run / 'config.yaml'}`")
    (run / "config.yaml").write_text(config)


def test_a_sweep_skips_what_cannot_be_evaluated_and_prints_the_others_with_progress(sweep, tmp_path):
    root = Path(shutil.copytree(sweep, tmp_path / "sweep"))
    learned, rope = run_of(root, "learned"), run_of(root, "rope")
    (rope / "length_eval.json").write_text("[]")
    unstarted = root / "9_unstarted"
    unstarted.mkdir()
    shutil.copy(learned / "config.yaml", unstarted / "config.yaml")
    res = invoke_ablate("eval", str(root), "--lengths", "16")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"{learned}\n") and read_lengths(learned).get(EvalKey(16)) is not None
    assert f"[1/3] {learned}: evaluating at 16 tokens" in res.stderr
    skipped = res.stderr.split("skipped 2 runs:\n")[1]
    assert f"  {rope / 'length_eval.json'}: unreadable (" in skipped
    assert f"  {unstarted}: no summary.json: the run has not started, or its process was killed" in skipped
    assert "Traceback" not in res.stderr


def test_sample_names_a_sweep_and_one_of_its_runs(sweep):
    line = one_error_line(invoke_ablate("sample", str(sweep)))
    assert line.startswith(f"error: {sweep}: a directory of 2 runs (a sweep), not one run; give one of them, e.g. ")


# ---- streaming and progress -----------------------------------------------------------------------
def test_sample_streams_the_text_as_it_is_drawn(rope_run):
    pieces: list[str] = []
    out = sample_run(rope_run, SampleOptions(prompt="ab", max_new_tokens=20, seed=3), stream=pieces.append)
    assert "".join(pieces) == out.prompt + out.texts[0] and len(pieces) >= 10  # token by token, not at the end


def test_a_character_split_across_tokens_waits_for_its_last_byte():
    from ablate.data.tokenizers import build_tokenizer

    tok, shown = build_tokenizer("byte"), []
    stream = TextStream(tok, shown.append)
    for b in "aé".encode():
        stream([b])
    stream.close()
    assert shown == ["a", "é"]


def test_eval_says_when_the_cpu_is_busy(sweep, tmp_path, monkeypatch):
    run = copied(sweep, tmp_path, "rope")
    monkeypatch.setattr(threads, "_start_cpu", threads.CpuLoad(2, 2, 6.5))  # as this process found it
    res = invoke_ablate("eval", str(run), "--lengths", "64", env={"OMP_NUM_THREADS": None})
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines()[0] == ("notice: the CPU is busy (load 6.5 on 2 cores): computing with 1 thread; "
                                          "times are slower than on an idle machine (--threads N chooses the threads)")
    quiet = invoke_ablate("eval", str(run), "--lengths", "64", "--threads", "1", env={"OMP_NUM_THREADS": None})
    assert quiet.returncode == 0 and "notice" not in quiet.stderr
    assert one_error_line(invoke_ablate("eval", str(run), "--lengths", "64", "--threads", "-1")) == (
        "error: --threads must be 0 (chosen from the free cores) or a number of threads, got -1")
