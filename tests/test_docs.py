"""Docs that stay true: the MkDocs site builds strictly, and every `ablate ...` command written
in a code block of README.md or docs/**/*.md still parses, without training.

Which lines are commands: in a shell block (```bash, sh, shell, console) every line that starts
with `ablate ` or `$ ablate `; in any other block (```text: output shown with its command) only
`$ ablate ` lines. Continuation lines (`\\`) are joined and `# comments` dropped, as a shell
would. A block right after `<!-- doc-test: skip ... -->` is left out (for a command that cannot
parse until another change lands; the comment says why).

How each command is checked (all in one subprocess, through typer's CliRunner, so the suite
pays for one start-up):
- `run`: with `--cfg job` (the composed config, checked as a run checks it);
- `sweep`: with `--dry-run` (`--cfg job` for another Hydra sweeper, which has no dry run);
- `inspect`, `axes`, `data info`, and anything with `--help`/`--version`/`--hydra-help`: as is;
- `compare`, `resume`, `export`: as is, on small run directories made once per session; the
  directories the docs name are mapped to them in PLACEHOLDERS (an unmapped one fails);
- `bench`, `data prepare`, `resume --extend` (they would time, download or train): click parses the arguments and the
  overrides (and each `--vs`) are composed and validated.
A command shown with `error: ...` on the next line must fail with exit code 2 and print that
error's beginning. A command that stops parsing fails the test, named by file and line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
SKIP_MARK = "<!-- doc-test: skip"
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")

# Directories and files the docs name, mapped to the session's fixtures (see doc_runs). Used
# only for the positional arguments of compare, resume and export.
PLACEHOLDERS = {
    # runs/short only has to differ from the sweep in train.steps (docs/compare.md)
    "RUN_DIR": "run", "runs/my-run": "run", "runs/llama": "run", "runs/short": "run",
    "SWEEP_DIR": "sweep", "runs/tour": "sweep", "runs/glu": "sweep",
    "runs/sweeps/2026-11-22_14-10-03": "sweep", "runs/sweeps/2026-11-23_10-57-04": "sweep",
    "runs/lr_qk": "sweep", "runs/ladder_pos": "sweep", "runs/ladder_2x": "sweep", "runs/ladder_pos_lr": "sweep",
    "runs/docs/glu": "sweep", "runs/docs/norm_dyt": "sweep", "runs/pos_lengths": "sweep",
    "runs/docs/moe": "sweep", "runs/docs/moe_total": "sweep", "runs/docs/moe_balance": "sweep",
    "runs/docs/moe_granularity": "moe",  # docs/moe.md names its baseline variant: written runs hold it
    "runs/docs/moe_balance_forms": "sweep", "runs/docs/moe_scope": "sweep", "runs/docs/moe_capacity": "sweep",
    "runs/docs/moe_bias_rate": "sweep",  # docs/deepseek.md
    "runs/docs/qk_norm_x_norm": "sweep", "runs/docs/act_x_pos": "sweep", "runs/equal_kv_bytes": "sweep",
    "runs/docs/window-sizes": "sweep", "runs/docs/window-patterns": "sweep",
    "runs/docs/qk_norm_x_optim": "sweep", "runs/docs/qk_norm_x_optim_lr": "sweep",
    "runs": "root",
    "OUT_DIR": "out", "hf/llama": "out",
}
# Small training settings for the fixtures (a few seconds each on two cores).
TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.max_seq_len=64",
        "train.batch_size=4", "train.seq_len=32", "train.warmup_steps=2", "train.eval_every=0",
        "train.eval_tokens=512", "train.log_every=10", "logger=none", "train.progress=false",
        "train.device=cpu"]
# Known-bad commands the checker must reject: proof that it can fail.
CANARIES = [
    ["run", "norm=rmsnrom"],                 # an option that does not exist
    ["sweep", "act=gelu,swigl"],             # the same, in a sweep
    ["bench", "--no-such-flag"],             # an option bench does not have
    ["bench", "train.lr=abc"],               # an override of the wrong type
    ["compare", "runs/does-not-exist"],      # an unmapped directory
]


@dataclass
class DocCommand:
    file: str
    line: int
    argv: list[str]            # after `ablate`
    expect_error: str = ""     # the documented `error: ...` line, when the docs show one
    skipped: bool = False


@dataclass
class Check:
    where: str
    mode: str                  # "invoke" (CliRunner) or "parse" (click + compose only)
    argv: list[str]
    expect_error: str = ""
    result: dict = field(default_factory=dict)


def extract_commands(text: str, file: str = "<doc>") -> list[DocCommand]:
    """The `ablate` commands in the code blocks of one markdown text (see the module docstring)."""
    lines = text.splitlines()
    found: list[DocCommand] = []
    in_block, lang, skipped, fence = False, "", False, ""
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if not in_block and m:
            in_block, fence, lang = True, m.group(1), m.group(2).lower()
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            skipped = before.strip().startswith(SKIP_MARK)
            i += 1
            continue
        if in_block and line.strip().startswith(fence[0] * 3) and line.strip().strip(fence[0]) == "":
            in_block = False
            i += 1
            continue
        if not in_block:
            i += 1
            continue
        stripped = line.strip()
        prompted = stripped.startswith("$ ablate ") or stripped == "$ ablate"
        if prompted or (lang in SHELL_LANGS and (stripped.startswith("ablate ") or stripped == "ablate")):
            start = i
            text_ = stripped[2:] if prompted else stripped
            while text_.endswith("\\") and i + 1 < len(lines):  # continuation lines
                i += 1
                text_ = text_[:-1] + " " + lines[i].strip()
            argv = shlex.split(text_, comments=True)[1:]
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            found.append(DocCommand(file, start + 1, argv, nxt if nxt.startswith("error:") else "",
                                    skipped))
        i += 1
    return found


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def all_doc_commands() -> list[DocCommand]:
    cmds = []
    for path in doc_files():
        cmds += extract_commands(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    return cmds


def other_sweeper(argv: list[str]) -> bool:
    return any(a.lstrip("+~").startswith("hydra/sweeper=") and not a.endswith("=ablate") for a in argv)


def plan(cmd: DocCommand, dirs: dict[str, Path], out_for) -> Check:
    """How to check one documented command without training (see the module docstring)."""
    where = f"{cmd.file}:{cmd.line}: ablate {shlex.join(cmd.argv)}"
    argv = list(cmd.argv)
    name = argv[0] if argv else ""
    if any(a in ("--help", "--version", "--hydra-help") for a in argv):
        return Check(where, "invoke", argv, cmd.expect_error)
    if name == "run":
        return Check(where, "invoke", argv if "--cfg" in argv else argv + ["--cfg", "job"],
                     cmd.expect_error)
    if name == "sweep":
        if other_sweeper(argv):  # no dry run there, and --cfg refuses swept values without -m
            return Check(where, "parse", argv, cmd.expect_error)
        if not {"--cfg", "--dry-run"} & set(argv):
            argv += ["--dry-run"]
        return Check(where, "invoke", argv, cmd.expect_error)
    if name in ("inspect", "axes") or argv[:2] == ["data", "info"]:
        return Check(where, "invoke", argv, cmd.expect_error)
    if name == "resume" and "--extend" in argv:  # it would train: parsed, not run
        return Check(where, "parse", argv, cmd.expect_error)
    if name in ("compare", "resume", "export"):
        mapped = [name]
        for a in argv[1:]:
            key = PLACEHOLDERS.get(a)
            mapped.append(str(out_for() if key == "out" else dirs[key]) if key else a)
        return Check(where, "invoke", mapped, cmd.expect_error)
    return Check(where, "parse", argv, cmd.expect_error)


# --- the checker, run as its own process: python tests/test_docs.py PLAN.json RESULTS.json ---

def _parse_only(argv: list[str]) -> tuple[int, str]:
    """click parses the arguments (unknown options, wrong types) and the overrides compose."""
    import typer

    try:  # typer vendors click from 0.2x on: its own parser and exceptions
        from typer._click.exceptions import ClickException
    except ImportError:  # an older typer on click
        from click import ClickException

    from ablate.config.compose import compose_config
    from ablate.errors import AblateError
    from cli.main import app

    group, args = typer.main.get_command(app), list(argv)
    try:
        ctx = group.context_class(group, info_name="ablate")
        while hasattr(group, "get_command"):  # a group: descend to the subcommand
            if not args:
                return 2, "no command"
            sub = group.get_command(ctx, args[0])
            if sub is None:
                return 2, f"no such command: {args[0]}"
            ctx = sub.make_context(args[0], args[1:], parent=ctx)
            # a group's context keeps the next command name apart (protected args)
            rest = getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", None) or []
            group, args = sub, list(rest) + list(ctx.args)
        overrides = [str(o) for o in (ctx.params.get("overrides") or []) + list(ctx.args)]
        if any(o.startswith("-") for o in overrides):
            return 2, f"unknown option {next(o for o in overrides if o.startswith('-'))}"
        for job in sweep_jobs(overrides):
            compose_config(job)
        for vs in ctx.params.get("vs") or []:
            compose_config(overrides + vs.split())
    except ClickException as e:
        return 2, e.format_message()
    except AblateError as e:
        return e.exit_code, str(e)
    return 0, "parsed"


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The override lists to compose for a sweep checked without Hydra's multirun: each swept
    value (`key=a,b`) once, the other swept keys at their first value. Hydra's own keys
    (`hydra/sweeper=basic`, `hydra.launcher.*`) are Hydra's to check, not the config's."""
    plain = [o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    swept = {}
    for i, o in enumerate(plain):
        key, _, value = o.partition("=")
        if "," in value and not value.startswith(("[", "{", "'", '"')):
            swept[i] = (key, value.split(","))
    base = [f"{swept[i][0]}={swept[i][1][0]}" if i in swept else o for i, o in enumerate(plain)]
    jobs = [base]
    for i, (key, values) in swept.items():
        jobs += [base[:i] + [f"{key}={v}"] + base[i + 1:] for v in values[1:]]
    return jobs


def _checker_main(plan_path: str, results_path: str) -> None:
    from hydra.core.global_hydra import GlobalHydra
    from typer.testing import CliRunner

    import composition_memo  # this file's folder, tests/, is sys.path[0]
    from cli.main import app

    composition_memo.install()  # the suite's memo, as in its other processes (tests/conftest.py)

    checks = json.loads(Path(plan_path).read_text())
    runner, cwd, env = CliRunner(), os.getcwd(), dict(os.environ)
    for check in checks:
        GlobalHydra.instance().clear()
        t0 = time.perf_counter()
        try:
            if check["mode"] == "parse":
                code, output = _parse_only(check["argv"])
            else:
                r = runner.invoke(app, check["argv"])
                code, output = r.exit_code, r.output
                if r.exception is not None and not isinstance(r.exception, SystemExit):
                    output += f"\n{type(r.exception).__name__}: {r.exception}"
        except Exception as e:  # noqa: BLE001 - reported as this command's failure
            code, output = 99, f"{type(e).__name__}: {e}"
        finally:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
        check["result"] = {"code": code, "output": output[-3000:], "s": round(time.perf_counter() - t0, 2)}
    Path(results_path).write_text(json.dumps(checks))


def run_checks(checks: list[Check], cwd: Path, tmp: Path, pythonpath: str = "") -> list[Check]:
    """Each check's result, from one checker process. A command the docs show in several places
    (the same mode and arguments, after mapping) runs once: in the same directory it can only do
    the same thing again, and a sweep's dry run costs seconds."""
    keys = [json.dumps([c.mode, c.argv]) for c in checks]
    unique = dict(zip(keys, checks))  # the checker reads only mode and argv
    plan_path, results_path = tmp / "plan.json", tmp / "results.json"
    plan_path.write_text(json.dumps([asdict(c) for c in unique.values()]))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "WANDB_MODE": "offline", "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(ROOT)) if p)}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(plan_path), str(results_path)],
                          cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1800)  # a guard against a hang: ~200 s on 2 quiet cores, 730 s at load 5
    assert proc.returncode == 0 and results_path.is_file(), f"the checker itself failed:\n{proc.stderr[-3000:]}"
    results = {json.dumps([c["mode"], c["argv"]]): c["result"] for c in json.loads(results_path.read_text())}
    return [Check(**{**asdict(c), "result": results[k]}) for k, c in zip(keys, checks)]


def failed(check: Check) -> str:
    """'' when the check went as the docs say, else why not."""
    code, output = check.result["code"], check.result["output"]
    if check.expect_error:
        head = check.expect_error[:40]
        if code != 2 or head not in output:
            return f"documented as failing with '{head}...', got exit {code}:\n{output[-1500:]}"
        return ""
    return "" if code == 0 else f"exit {code}:\n{output[-1500:]}"


# --- fixtures ---

@pytest.fixture(scope="session")
def doc_runs(tmp_path_factory) -> dict[str, Path]:
    """A 4-job sweep (norm=layernorm,rmsnorm x 2 seeds, 300 steps: docs/compare.md selects
    `--where train.steps=300`; a one-layer model on 2 x 16 tokens a step, as only its records are
    read) and a finished 6-step run (the session's shared one: copy_of_trained_run), what
    compare, resume and export are pointed at."""
    from conftest import TINY as RUN, copy_of_trained_run, run_ablate

    root = tmp_path_factory.mktemp("doc-runs")
    dirs = {"root": root, "sweep": root / "sweep", "run": root / "run"}
    copy_of_trained_run(tmp_path_factory, root, *RUN, "train.threads=1")
    p = run_ablate("sweep", "norm=layernorm,rmsnorm", "--seeds", "2", *TINY, "train.steps=300",
                   "model.n_layers=1", "train.batch_size=2", "train.seq_len=16", f"hydra.sweep.dir={dirs['sweep']}",
                   cwd=root)
    assert p.returncode == 0, p.stderr[-2000:]
    dirs["moe"] = _moe_granularity_runs(tmp_path_factory.mktemp("doc-moe-runs"))
    return dirs


def _moe_granularity_runs(root: Path) -> Path:
    """Run directories as docs/moe.md's granularity runs leave them (the fields compare reads,
    tests/compare_fixtures.py), under the variant names its `--baseline` picks from."""
    from compare_fixtures import set_config, write_run

    for i, (variant, experts, top_k) in enumerate((("arch=llama,ffn=moe", 8, 2),
                                                   ("arch=llama,ffn.experts=4,ffn.top_k=1,ffn=moe", 4, 1))):
        for seed in (0, 1):
            d = write_run(root, f"{i}_{seed}", {"ffn": "moe"}, seed, 3.0 + 0.01 * (i + seed), sweep="granularity",
                          variant=variant)
            set_config(d, "ffn.experts", experts)
            set_config(d, "ffn.top_k", top_k)
    return root


def plugin_setup(work: Path) -> None:
    """Run the shell lines of docs/extending.md's plugin examples (not their `ablate` lines) in
    `work`, so the commands that name `plugins=[my_pkg.my_norm]` find the documented plugins."""
    text = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(mkdir -p my_pkg.*?)\n```", text, re.S)
    assert blocks, "docs/extending.md lost its plugin example (the doc test builds it)"
    for block in blocks:
        subprocess.run(["bash", "-euc", "ablate() { :; }\n" + block], cwd=work, check=True)


# --- tests ---

def test_extract_commands_reads_shell_blocks_and_prompted_lines_only():
    md = "\n".join([
        "Text `ablate run inline` is not a block.",
        "```bash",
        "ablate run norm=rmsnorm   # a comment",
        "ablate sweep act=gelu,swiglu \\",
        "    --seeds 3",
        "make run",
        "```",
        "```text",
        "$ ablate compare runs/tour",
        "ablate run: train.steps=200 (seed 0)",
        "$ ablate compare runs/a runs/short",
        "error: these runs differ",
        "```",
        "<!-- doc-test: skip (does not parse yet) -->",
        "```bash",
        "ablate resume RUN_DIR --extend train.steps=9",
        "```",
    ])
    cmds = extract_commands(md)
    assert [(c.line, c.argv, c.expect_error, c.skipped) for c in cmds] == [
        (3, ["run", "norm=rmsnorm"], "", False),
        (4, ["sweep", "act=gelu,swiglu", "--seeds", "3"], "", False),
        (9, ["compare", "runs/tour"], "", False),
        (11, ["compare", "runs/a", "runs/short"], "error: these runs differ", False),
        (16, ["resume", "RUN_DIR", "--extend", "train.steps=9"], "", True),
    ]


def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (
        "mkdocs build --strict failed (pip install -e '.[docs]' if mkdocs is missing):\n"
        + proc.stderr[-3000:])
    assert (tmp_path / "site" / "reliability" / "index.html").is_file()


def test_readme_is_a_guide():
    """What a newcomer needs first: install both ways, the four tour steps, links into docs/."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    for needed in ("make run", "make test", 'pip install -e ".[hf]"', "ablate run ", "--seeds ",
                   "ablate compare ", "--plot "):
        assert needed in text, needed
    for page in re.findall(r"\]\((docs/[\w/-]+\.md)", text):
        assert (ROOT / page).is_file(), page


def test_docs_state_present_facts():
    """No sentence says what an earlier version did ("was 0.999", "issue 17's goal 2")."""
    history = [re.compile(p) for p in (r"\bwas [+\-]?\d", r"\bissue \d+", r"\bpreviously\b",
                                       r"\bearlier version", r"\bused to\b")]
    for path in doc_files():
        text = re.sub(r"<!--.*?-->", "", path.read_text(encoding="utf-8"), flags=re.S)
        for n, line in enumerate(text.splitlines(), 1):
            for pat in history:
                assert not pat.search(line), f"{path.relative_to(ROOT)}:{n}: {line.strip()}"


def test_every_documented_command_parses(doc_runs, tmp_path):
    cmds = all_doc_commands()
    assert len(cmds) >= 40, f"found only {len(cmds)} documented commands: is the extraction broken?"
    work = tmp_path / "work"
    work.mkdir()
    plugin_setup(work)
    (work / "corpus").mkdir()  # docs/data.md trains on corpus/*.txt and corpus/extra.jsonl
    (work / "corpus" / "notes.txt").write_text("Some text of one's own.\n" * 200)
    (work / "corpus" / "extra.jsonl").write_text(json.dumps({"text": "More text."}) + "\n")
    outs = iter(range(10_000))
    checks = [plan(c, doc_runs, lambda: tmp_path / f"out{next(outs)}") for c in cmds if not c.skipped]
    canaries = [Check(f"canary: ablate {shlex.join(a)}", "parse" if a[0] == "bench" else "invoke",
                      a + (["--cfg", "job"] if a[0] == "run" else ["--dry-run"] if a[0] == "sweep" else []))
                for a in CANARIES]
    results = run_checks(checks + canaries, work, tmp_path, pythonpath=str(work))
    problems = [f"{c.where}\n  {why}" for c in results[:len(checks)] if (why := failed(c))]
    assert not problems, "documented commands that no longer work:\n" + "\n".join(problems)
    for c in results[len(checks):]:
        assert c.result["code"] != 0, f"the checker accepted a bad command: {c.where}"


if __name__ == "__main__":
    _checker_main(sys.argv[1], sys.argv[2])
