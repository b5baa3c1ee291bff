"""run_ablate's zygote (tests/forkserver.py): a command forked from it behaves as one run by a
fresh `python -m cli.main`: the same output and exit code, its own cwd, environment, sys.path
and process group, the interpreter's exit (threads joined, atexit), subprocess.run's timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import forkserver
from conftest import ROOT, run_ablate

# a plugin module (ablate axes plugins=[probe]) that does what PROBE names when it is imported
PROBE = """
import atexit, os, signal, sys, threading, time
what = os.environ.get("PROBE", "")
print(os.getcwd(), sys.path[0], sys.argv[0], sys.modules["__main__"].__file__, os.environ.get("PROBE_VALUE"),
      os.getpgrp() == os.getpid(), os.getpid(), sep="|", flush=True)
if what == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if what == "sleep":
    time.sleep(60)
if what == "exit-text":
    sys.exit("bye")
if what == "thread":
    atexit.register(lambda: print("atexit ran", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished", flush=True))).start()
"""


def env_for(**extra) -> dict:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", **extra}


def forked(*args: str, cwd=ROOT, env=None, timeout: float = 60) -> subprocess.CompletedProcess:
    res = forkserver.run([sys.executable, "-m", "cli.main", *args], args, cwd=cwd, env=env or env_for(),
                         timeout=timeout)
    assert res is not None, "the zygote did not run the command"
    return res


def fresh(*args: str, cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=cwd, env=env or env_for(),
                          capture_output=True, text=True, timeout=120)


def probe(tmp_path, what: str = "", timeout: float = 60, **env) -> subprocess.CompletedProcess:
    (tmp_path / "probe.py").write_text(PROBE)
    return forked("axes", "plugins=[probe]", cwd=tmp_path, timeout=timeout,
                  env=env_for(PYTHONPATH=str(tmp_path), PROBE=what, **env))


@pytest.mark.parametrize("args", [("--version",), ("no-such-command",), ("run", "bogus_key=1", "--cfg", "job")])
def test_a_forked_command_prints_and_exits_as_a_fresh_interpreter(args):
    a, b = forked(*args), fresh(*args)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


def test_a_command_runs_in_its_cwd_with_its_environment_and_path_in_its_own_process_group(tmp_path):
    res = probe(tmp_path, PROBE_VALUE="from the test")
    assert res.returncode == 0, res.stderr
    cwd, path0, argv0, main, value, own_group, _ = res.stdout.splitlines()[0].split("|")
    assert cwd == path0 == str(tmp_path)  # -m puts the working directory first on sys.path
    assert argv0 == main == str(ROOT / "cli" / "main.py")  # cli/main.py runs as __main__
    assert value == "from the test" and own_group == "True"


def test_a_command_killed_by_a_signal_has_a_negative_returncode(tmp_path):
    assert probe(tmp_path, "kill").returncode == -9


def test_sys_exit_with_text_prints_it_and_exits_1(tmp_path):
    res = probe(tmp_path, "exit-text")
    assert (res.returncode, res.stderr) == (1, "bye\n")


def test_the_command_waits_for_its_threads_and_runs_atexit_handlers(tmp_path):
    res = probe(tmp_path, "thread")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-2:] == ["thread finished", "atexit ran"]


def test_a_timeout_kills_the_command_and_raises_timeout_expired(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as info:
        probe(tmp_path, "sleep", timeout=2)
    assert time.monotonic() - t0 < 30
    pid = int(info.value.output.decode().split("|")[-1])
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)


@pytest.mark.parametrize("key", ["TORCH_LOGS", "TORCHDYNAMO_VERBOSE", "LC_ALL", "PYTHONHASHSEED"])
def test_a_variable_read_at_import_or_start_up_gets_a_fresh_interpreter(key):
    """torch's configs read these when the zygote imported torch: forking would ignore them."""
    assert forkserver.run([sys.executable, "-m", "cli.main", "--version"], ("--version",), cwd=ROOT,
                          env=env_for(**{key: "1"}), timeout=60) is None


def test_a_variable_that_importing_torch_sets_as_it_would_set_it_still_forks():
    """Compiling in the test's process sets TORCHINDUCTOR_CACHE_DIR in its environment, to what
    the zygote's import of torch set: commands after it still fork."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # cache_dir() would set it here

    res = forkserver.run([sys.executable, "-m", "cli.main", "--version"], ("--version",), cwd=ROOT,
                         env=env_for(TORCHINDUCTOR_CACHE_DIR=os.path.abspath(default_cache_dir())), timeout=60)
    assert res is not None and res.returncode == 0


def test_run_ablate_runs_a_fresh_interpreter_where_the_zygote_cannot_start(monkeypatch):
    monkeypatch.setattr(forkserver._Zygote, "proc", None)  # this worker's zygote comes back after
    monkeypatch.setattr(forkserver._Zygote, "failed", False)
    monkeypatch.setattr(forkserver, "__file__", "/nonexistent/forkserver.py")
    res = run_ablate("sample")  # a subprocess-only command
    assert forkserver._Zygote.failed
    assert (res.returncode, res.stderr) == (2, "error: missing argument 'run_dir' (usage: ablate sample --help)\n")
