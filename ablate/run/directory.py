"""The run directory: the files a run leaves behind and the lock that makes it one process's."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Any, Optional

from ablate.errors import RunDirError

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
LOCK = "run.lock"
TRANSFER = "transfer.json"  # a sweep directory's --lr-grid or --ladder record (ablate/sweep/transfer_record.py)


def resume_command(run_dir: Path) -> str:
    """The shell command that resumes `run_dir` (`ablate resume`). The names ablate gives need
    no quotes (dir_name); a directory the user named with spaces or quotes is quoted."""
    import shlex

    return f"ablate resume {shlex.quote(str(run_dir))}"


# ---- directory names: a shell takes them as printed ----------------------------------------------
# Characters that every shell reads as themselves inside a word ('/' too, written as '_' in a name
# so that a path does not nest the directory). Anything else (quotes, brackets, globs, spaces, $,
# ~, braces) would be stripped or expanded when a printed path is pasted.
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9._+:@%/-]*")
_NOT_PLAIN = re.compile(r"[^A-Za-z0-9._+-]")
VALUE_CHARS = 40  # a longer value is named by its hash: names stay readable in a listing
NAME_CHARS = 160  # a file name stops at 255 bytes: a longer name keeps its start, the rest hashed


def short_hash(text: str) -> str:
    """`h` and the first 8 hex digits of the text's SHA-1: the same text, the same name."""
    return "h" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]


def value_name(value: str) -> str:
    """An override's value as a directory name shows it: itself when plain and short, else its
    short_hash (`data.paths=["corpus/*.txt"]` -> `data.paths=h3f9a1c2e`)."""
    if len(value) <= VALUE_CHARS and _PLAIN_VALUE.fullmatch(value):
        return value.replace("/", "_")
    return short_hash(value)


def split_items(text: str) -> list[str]:
    """`a=1,b=[x,y],c='p,q'` -> ['a=1', 'b=[x,y]', "c='p,q'"]: a comma inside brackets or quotes
    belongs to its value (Hydra's override_dirname joins the overrides with ',')."""
    items, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote and text[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    return items + [text[start:]]


def dir_name(overrides: str, limit: int = NAME_CHARS) -> str:
    """The directory name for `overrides` (`key=value,...` as Hydra's override_dirname joins them,
    or a sweep job's variant name) that a shell takes as printed: each value by value_name, any
    other character outside [A-Za-z0-9._+-] as '_'."""
    parts = []
    for item in split_items(overrides):
        key, eq, value = item.partition("=")
        parts.append(_NOT_PLAIN.sub("_", key) + (eq + value_name(value) if eq else ""))
    name = ",".join(parts)
    return name if len(name) <= limit else f"{name[:limit - 10]}_{short_hash(name)}"


def write_atomic(path: Path, text: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def owner() -> dict:
    """Who runs here: enough for a later reader to tell whether that process still lives."""
    from ablate.run.context import ProcessEnv

    return {"pid": os.getpid(), "host": socket.gethostname(), "job": ProcessEnv.read().slurm_job}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_alive(who: dict) -> Optional[bool]:
    """True/False for a process on this host; None when it ran elsewhere (cannot tell)."""
    if not who.get("pid"):
        return False
    if who.get("host") not in (None, socket.gethostname()):
        from ablate.run.context import ProcessEnv

        me = ProcessEnv.read().slurm_job
        return False if me and me == who.get("job") else None  # a requeued job replaces itself
    return pid_alive(int(who["pid"]))


def truncate_metrics(path: Path, step: int) -> int:
    """Keep the rows up to `step` (a resumed run re-logs the rest); drop a torn last line.
    Returns the number of rows removed."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            dropped += 1  # written half when the process died
            continue
        if isinstance(row, dict) and int(row.get("step", 0)) <= step:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        write_atomic(path, "".join(ln + "\n" for ln in kept))
    return dropped


class RunLock:
    """run.lock holds the owner's pid, host and SLURM job id. A lock whose process is gone is
    stale and taken over; a live one refuses a second process."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.held = False

    def holder(self) -> Optional[dict]:
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        try:
            who = json.loads(text)
            return who if isinstance(who, dict) else {"pid": int(who)}
        except ValueError:
            return {"pid": 0}  # torn write: its owner died while writing

    def _refuse_if_held(self) -> None:
        who = self.holder()
        if who is None or who.get("pid") == os.getpid() and who.get("host") == socket.gethostname():
            return
        alive = owner_alive(who)
        if alive is False:
            return
        where = f"process {who.get('pid')}" + (f" on {who['host']}" if who.get("host") else "")
        hint = "wait for it or choose another hydra.run.dir"
        if alive is None:
            hint = f"if that process is gone, delete {self.path}"
        raise RunDirError(f"run directory {self.path.parent} is in use by {where}; {hint}")

    def check_free(self) -> None:
        """Pre-flight: refuse early, before anything is written (acquire() is the real test)."""
        self._refuse_if_held()

    def acquire(self) -> None:
        # The content is written first and hard-linked into place, so the lock appears
        # atomically with its owner in it (link fails if the lock exists).
        tmp = self.path.with_name(f".{LOCK}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(owner()))
        except OSError as e:
            raise RunDirError(f"cannot write to run directory {self.path.parent}: {e.strerror}") from None
        try:
            for _ in range(2):
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    self._refuse_if_held()
                    self.path.unlink(missing_ok=True)  # stale: its owner died
                    continue
                except OSError as e:
                    raise RunDirError(f"cannot write to run directory {self.path.parent}: {e.strerror}") from None
                self.held = True
                return
        finally:
            tmp.unlink(missing_ok=True)
        raise RunDirError(f"could not take the lock {self.path}")

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

