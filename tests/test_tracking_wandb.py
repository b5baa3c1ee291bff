"""W&B: an offline run is written under the run dir and read back from its .wandb file; no key
and no network never makes a run wait; a failing online init falls back to offline."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from ablate.run.record import RunInfo, RunRecord
from ablate.tracking.wandb_file import BLOCK, WandbFileError, iter_payloads, read_run
from conftest import TINY, no_login_env, read_jsonl, run_ablate, run_context

WANDB_TINY = [o for o in TINY if not o.startswith(("logger=", "train.eval_every="))] + [
    "logger=wandb", "train.eval_every=3", "train.threads=1"]


def test_default_run_logs_offline_and_the_file_reads_back(tmp_path):
    run_dir = tmp_path / "run"
    # a preset with one axis taken back on the command line: W&B must say which preset it was
    res = run_ablate("run", *WANDB_TINY, "arch=llama", "model.n_heads=4", "act=gelu", "seed=1",
                     "logger.group=abl-test", f"hydra.run.dir={run_dir}", env=no_login_env(tmp_path))
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    where = summary["wandb"]
    assert where["mode"] == "offline" and where["init_s"] < 5  # never waited on the network
    assert f"wandb sync {where['dir']}" in res.stdout

    run = read_run(run_dir)
    assert run.group == "abl-test" and run.job_type == "train" and run.project == "ablate"
    assert "norm=rmsnorm" in run.tags and not any(t.startswith("act=") for t in run.tags)
    assert "arch=llama" in run.tags and run.config["arch"] == "llama"  # filterable by preset
    assert run.name.endswith("seed=1") and "arch=llama" in run.name
    # axes at top level (the UI groups by them), their options beside them, sizes included
    assert run.config["norm"] == "rmsnorm" and run.config["act"] == "gelu" and run.config["pos"] == "rope"
    assert run.config["norm_eps"] == pytest.approx(1e-5) and run.config["model"]["d_model"] == 32
    assert run.config["params"] == summary["params"]
    assert run.config["flops_per_token"] == summary["flops_per_token"]
    # every logged train row, with W&B names, against tokens
    train = [h for h in run.history if "train/loss" in h]
    local = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "train_loss" in r]
    assert [h["train/loss"] for h in train] == pytest.approx([r["train_loss"] for r in local])
    assert all({"train/grad_norm", "train/lr", "train/tokens_per_s", "tokens"} <= set(h) for h in train)
    assert any("val/loss" in h and "val/bpb" in h for h in run.history)
    assert run.metrics["train/*"]["step_metric"] == "tokens"
    assert run.metrics["val/loss"]["summary"] == ["min"]
    assert run.summary["val/loss"]["min"] == pytest.approx(
        min(r["val_loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "val_loss" in r))
    assert run.summary["params"] == summary["params"] and run.summary["status"] == "completed"
    assert run.exit_code == 0  # wandb.finish() ran
    # one name per metric: the logged (W&B) name, never also the metrics.jsonl one
    assert not {"val_loss", "val_bpb", "train_loss", "tokens_per_s"} & set(run.summary)
    assert run.summary["train/tokens_per_s"] == pytest.approx(train[-1]["train/tokens_per_s"])
    assert run.summary["step"] == summary["step"] and run.summary["wall_time_s"] == summary["wall_time_s"]
    # provenance: which code ran where, in summary.json and the W&B config
    prov = summary["provenance"]
    assert prov["torch"] and prov["ablate"] and prov["hostname"] and prov["device_name"]
    assert prov["git"] is None or len(prov["git"]["commit"]) == 40
    assert run.config["provenance"] == prov


def test_online_init_failure_falls_back_to_offline_with_one_warning(tmp_path):
    env = no_login_env(tmp_path)
    # a key that looks real and a server that refuses at once: nothing leaves this machine
    env.update(WANDB_API_KEY="a" * 40, WANDB_BASE_URL="http://127.0.0.1:9")
    run_dir = tmp_path / "run"
    res = run_ablate("run", *WANDB_TINY, "logger.mode=online",
                     "logger.init_timeout=3", f"hydra.run.dir={run_dir}", env=env)
    assert res.returncode == 0, res.stderr
    warnings = [ln for ln in (res.stdout + res.stderr).splitlines() if "init failed" in ln]
    assert len(warnings) == 1 and "W&B online init failed" in warnings[0]
    assert "logging offline instead" in warnings[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["wandb"]["mode"] == "offline"
    assert any("train/grad_norm" in h for h in read_run(run_dir).history)


def test_a_failed_online_init_is_remembered_so_the_next_run_does_not_wait(tmp_path, monkeypatch, capsys):
    """A key but no network (a refused port): the first run waits init_timeout once, the next
    mode=auto run goes offline at once with one warning; logger.mode=online still tries."""
    import time

    from ablate.tracking import wandb_sink

    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    timeout = 2.0
    tried = []  # the modes each start initialised W&B in: the wait is the online try's
    init = wandb_sink.WandbSink._init
    monkeypatch.setattr(wandb_sink.WandbSink, "_init", lambda self, wandb, mode: (tried.append(mode),
                                                                                    init(self, wandb, mode))[1])

    def start(name, mode="auto"):
        sink = sink_for(tmp_path / name, mode)
        sink.cfg.init_timeout = timeout
        (tmp_path / name).mkdir()
        info, t0 = RunInfo(), time.monotonic()
        tried.clear()
        sink.start(info)
        waited = time.monotonic() - t0
        sink.finish(RunRecord("completed"))
        warnings = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("warning:")]
        return info.wandb.mode, waited, warnings

    mode, waited, warnings = start("first")
    assert mode == "offline" and waited >= timeout and tried == ["online", "offline"]  # it tried and waited
    assert len(warnings) == 1 and "online init failed (" in warnings[0]
    mode, waited, warnings = start("second")
    assert mode == "offline" and tried == ["offline"]  # no online try, so no wait (a loaded host's offline
    # init alone can take init_timeout, so the time is not the test)
    assert len(warnings) == 1 and "logging offline at once (logger.mode=online tries again)" in warnings[0]
    assert "connection refused" in warnings[0]  # says why
    mode, waited, warnings = start("forced", mode="online")
    assert waited >= timeout and tried[0] == "online" and "online init failed (" in warnings[0]  # explicit: tries
    # the memory lasts OFFLINE_MEMORY_S
    marker = wandb_sink._failure_marker()
    assert wandb_sink.recent_online_failure() is not None
    data = json.loads(marker.read_text())
    marker.write_text(json.dumps({**data, "time": data["time"] - wandb_sink.OFFLINE_MEMORY_S - 1}))
    assert wandb_sink.recent_online_failure() is None


# ---- the reader on a file written here, with records split across 32 KiB blocks ------------------
def write_log(path, payloads):
    """The writer side of the format (LevelDB log), to check the reader's block handling."""
    out = bytearray(struct.pack("<4sHB", b":W&B", 0xBEE1, 0))
    for data in payloads:
        first = True
        while True:
            left = BLOCK - len(out) % BLOCK
            if left < 7:
                out += b"\x00" * left
                continue
            piece, data = data[:left - 7], data[left - 7:]
            kind = (1 if first else 4) if not data else (2 if first else 3)
            out += struct.pack("<IHB", zlib.crc32(bytes([kind]) + piece), len(piece), kind) + piece
            first = False
            if not data:
                break
    path.write_bytes(bytes(out))


def history_record(step, size):
    from wandb.proto import wandb_internal_pb2 as pb

    rec = pb.Record()
    item = rec.history.item.add()
    item.key, item.value_json = "train/loss", json.dumps(float(step))
    item = rec.history.item.add()
    item.key, item.value_json = "blob", json.dumps("x" * size)
    return rec.SerializeToString()


def test_reader_joins_records_across_blocks(tmp_path):
    path = tmp_path / "run-x.wandb"
    sizes = [10, 40_000, 32_700, 5, 70_000, 3]  # FULL, FIRST/LAST, FIRST/MIDDLE/LAST, padding
    write_log(path, [history_record(i, n) for i, n in enumerate(sizes)])
    run = read_run(path)
    assert [h["train/loss"] for h in run.history] == list(range(len(sizes)))
    assert [len(h["blob"]) for h in run.history] == sizes
    # a torn tail (the writer was killed) ends the records; a corrupt byte is refused
    data = path.read_bytes()
    path.write_bytes(data[:-2])
    assert len(list(iter_payloads(path))) == len(sizes) - 1
    path.write_bytes(data[:20] + bytes([data[20] ^ 0xFF]) + data[21:])
    with pytest.raises(WandbFileError, match="bad checksum"):
        list(iter_payloads(path))
    path.write_bytes(b"not a wandb file")
    with pytest.raises(WandbFileError, match="not a W&B run file"):
        read_run(path)


# ---- the sink in-process: finish() records how the run ended; a W&B that cannot start is not fatal
def read_finished(path, timeout: float = 20.0):
    """The run file once it holds the exit record. In-process, W&B's service can still be writing
    the file when run.finish() returns (CI once read it empty); a subprocess's reads are after exit."""
    import time

    from ablate.tracking.wandb_file import WandbFileError

    deadline = time.monotonic() + timeout
    while True:
        try:
            run = read_run(path)
        except WandbFileError:  # not there yet, or only its first bytes
            if time.monotonic() > deadline:
                raise
            run = None
        if run is not None and (run.exit_code is not None or time.monotonic() > deadline):
            return run
        time.sleep(0.1)


def sink_for(tmp_path, mode="offline"):
    from types import SimpleNamespace

    from ablate.tracking.wandb_sink import WandbSink

    cfg = SimpleNamespace(mode=mode, project="ablate-test", entity=None, job_type="train",
                          init_timeout=5.0)
    return WandbSink(cfg, tmp_path, "x seed=0", {"norm": "rmsnorm", "hf_token": "hf_secret"},
                     ["norm=rmsnorm"], "grp")


def test_failed_run_is_finished_with_a_failing_exit_code(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    sink = sink_for(tmp_path)
    info = RunInfo(params=123, flops_per_token=456)
    sink.start(info)
    try:
        sink.log({"step": 1, "tokens": 64, "train_loss": 5.0, "grad_norm": 1.5})
    finally:
        sink.finish(RunRecord("failed", error="boom", info=RunInfo(params=123)))
    assert sink.run is None and info.wandb.mode == "offline"
    run = read_finished(tmp_path)
    assert run.exit_code == 1 and run.summary["status"] == "failed"
    assert run.summary["flops_per_token"] == 456
    assert run.config["norm"] == "rmsnorm" and "hf_token" not in run.config  # no credentials
    assert run.history[0]["train/grad_norm"] == 1.5 and run.history[0]["tokens"] == 64


def test_a_wandb_that_cannot_start_does_not_stop_the_run(tmp_path, monkeypatch, capsys):
    import wandb

    def refuse(**kwargs):
        raise RuntimeError("disk full\nmore detail")

    monkeypatch.setattr(wandb, "init", refuse)
    sink = sink_for(tmp_path)
    sink.start(RunInfo())
    sink.log({"step": 1, "tokens": 64, "train_loss": 5.0})  # no-op, no error
    sink.finish(RunRecord("completed"))
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["warning: W&B offline init failed (RuntimeError: disk full); "
                   "this run is not logged to W&B"]


def test_a_sweep_run_is_grouped_by_the_sweep_name(tmp_path):
    from ablate.tracking.wandb_sink import WandbSink
    from ablate.train.launch import build_sinks
    from conftest import compose

    cfg = compose([*WANDB_TINY, "norm=rmsnorm", "act=swiglu", "seed=2"])
    info = RunInfo(params=10, non_embedding_params=5, flops_per_token=60)
    sinks = build_sinks(cfg, run_context(tmp_path, "norm=rmsnorm,act=swiglu", "sweep-0922"), 0, info)
    sinks.finish(RunRecord("completed"))  # closes metrics.jsonl; the W&B sink was never started
    (w,) = [s for s in sinks.sinks if isinstance(s, WandbSink)]
    assert w.group == "sweep-0922" and w.name == "norm=rmsnorm,act=swiglu seed=2"
    assert sorted(w.tags) == ["act=swiglu", "norm=rmsnorm"]
    assert w.config["act"] == "swiglu" and w.config["params"] == 10 and w.config["seed"] == 2
    cfg = compose([*WANDB_TINY, "logger.group=mine"])
    sinks = build_sinks(cfg, run_context(tmp_path, "baseline", "sweep-0922"), 0, info)
    sinks.finish(RunRecord("completed"))
    (w,) = [s for s in sinks.sinks if isinstance(s, WandbSink)]
    assert w.group == "mine" and w.tags == []  # an explicit group wins; defaults get no tags


def test_arch_preset_in_the_config_and_a_tag_unless_default(tmp_path):
    from ablate.tracking.wandb_sink import WandbSink, wandb_config
    from conftest import compose

    cfg = compose([*WANDB_TINY, "arch=llama", "model.n_heads=4"])
    info = RunInfo(params=10)
    # outside a Hydra job the preset is unknown unless the caller names it
    assert "arch" not in wandb_config(cfg, "arch=llama", info)
    config = wandb_config(cfg, "arch=llama", info, arch="llama")
    assert config["arch"] == "llama" and config["norm"] == "rmsnorm"
    sink = WandbSink(cfg.logger, tmp_path, "x", config, ["norm=rmsnorm"], None)
    assert sink.tags == ["arch=llama", "norm=rmsnorm"]
    gpt2 = wandb_config(compose(WANDB_TINY), "baseline", info, arch="gpt2")
    assert gpt2["arch"] == "gpt2" and WandbSink(cfg.logger, tmp_path, "x", gpt2, [], None).tags == []


@pytest.mark.parametrize("how", ["none", "netrc_env", "identity_token_file", "api_key"])
def test_credentials_are_found_by_wandb_s_own_rules(tmp_path, monkeypatch, how):
    """A user logged in through NETRC or an identity-token file runs online (mode=auto), as
    wandb.init itself would find them; with nothing, offline."""
    import wandb
    from wandb.sdk.lib.wbauth import unauthenticate_session

    from ablate.tracking.wandb_sink import resolve_mode

    wandb.teardown()  # a fresh process's state: no session credentials from earlier tests
    unauthenticate_session(update_settings=False)
    for k, v in no_login_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.delenv("WANDB_IDENTITY_TOKEN_FILE", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    if how == "netrc_env":
        netrc = tmp_path / "elsewhere" / "my-netrc"
        netrc.parent.mkdir()
        netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {'b' * 40}\n")
        netrc.chmod(0o600)
        monkeypatch.setenv("NETRC", str(netrc))
    elif how == "identity_token_file":
        token = tmp_path / "token"
        token.write_text("a.jwt.token")
        monkeypatch.setenv("WANDB_IDENTITY_TOKEN_FILE", str(token))
    elif how == "api_key":
        monkeypatch.setenv("WANDB_API_KEY", "c" * 40)
    assert resolve_mode("auto") == ("offline" if how == "none" else "online")


def test_the_latest_checkpoint_is_logged_as_an_artifact_offline(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from ablate.tracking.wandb_sink import WandbSink

    for k, v in no_login_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("WANDB_MODE", "offline")
    (tmp_path / "checkpoints").mkdir()
    for step in (2, 4):
        (tmp_path / "checkpoints" / f"step_{step:08d}.pt").write_bytes(b"weights %d" % step)
    cfg = OmegaConf.create({"mode": "offline", "project": "ablate", "entity": None, "job_type": "train",
                            "init_timeout": 15.0, "log_checkpoint": True})
    sink = WandbSink(cfg, tmp_path, "v seed=0", {"norm": "layernorm"}, [], None, resume_id="ckpttest")
    sink.start(RunInfo())
    sink.finish(RunRecord("completed", step=4))
    run = read_finished(tmp_path)
    assert [(a["type"], a["files"], a["metadata"]) for a in run.artifacts] == [
        ("model", ["step_00000004.pt"], {"step": 4})]
    assert "step-4" in run.artifacts[0]["aliases"]
