"""The switches that turn the suite's shortcuts off (tests/conftest.py's docstring): each one
really does, so a failure the shortcut might hide can be checked without it."""

from __future__ import annotations

import pytest

import composition_memo
import conftest
import forkserver


def _refused(*args, **kwargs):
    raise AssertionError("called with its switch off")


def test_in_process_off_runs_each_command_in_a_process_of_its_own(monkeypatch):
    monkeypatch.setenv("ABLATE_TEST_IN_PROCESS", "0")
    monkeypatch.setenv("ABLATE_TEST_ZYGOTE", "0")  # a fresh interpreter: no zygote to start for this
    monkeypatch.setattr(conftest, "in_process", _refused)
    res = conftest.run_ablate("--version")
    assert res.returncode == 0 and res.stdout.strip(), res.stderr


def test_zygote_off_starts_a_fresh_interpreter(monkeypatch):
    monkeypatch.setenv("ABLATE_TEST_ZYGOTE", "0")
    monkeypatch.setattr(forkserver, "run", _refused)
    res = conftest.run_ablate("--version", process=True)
    assert res.returncode == 0 and res.stdout.strip(), res.stderr


def test_memo_off_leaves_hydra_alone(monkeypatch):
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra

    if not composition_memo.installed():
        pytest.skip("the composition memo is off (ABLATE_TEST_MEMO=0)")
    composition_memo.uninstall()
    try:
        hydras = ConfigLoaderImpl.load_configuration, Hydra.get_mode
        monkeypatch.setenv(composition_memo.ENV, "0")
        composition_memo.install()
        assert not composition_memo.installed()
        assert (ConfigLoaderImpl.load_configuration, Hydra.get_mode) == hydras
    finally:
        monkeypatch.setenv(composition_memo.ENV, "1")
        composition_memo.install()
    assert composition_memo.installed() and ConfigLoaderImpl.load_configuration is not hydras[0]
