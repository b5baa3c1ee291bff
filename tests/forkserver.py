"""A warm interpreter for run_ablate's subprocesses (tests/conftest.py): a "zygote" process that
has imported torch, torch._dynamo, Hydra, OmegaConf, Typer and cli.main once, and installed the
test-side composition memo (tests/composition_memo.py, as conftest.py does in the worker), and
forks each `python -m cli.main ...` from there, so a command pays a fork instead of ~5 CPU-s of
imports, and derives its compositions as a command run in the worker's process does.

Not a test file. The worker side (run, stop) talks to the zygote over a Unix socket: each request
is one connection carrying the command's stdout/stderr pipes (SCM_RIGHTS) and {args, cwd, env};
the zygote answers the child's pid, then its wait status once it has reaped it. Anything the
zygote cannot do exactly as a fresh interpreter would (an environment variable that an imported
module read at import, a thread in the zygote) makes run() return None: the caller then runs the
plain subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAIN = str(ROOT / "cli" / "main.py")  # sys.argv[0] of `python -m cli.main`
HEADER = 8  # bytes: the length of the JSON request that follows
# Read at start-up by the interpreter or by C libraries (locale, OpenMP, BLAS, CUDA), unseen by
# the record of what the zygote's imports read (_imported): a command whose environment differs
# from the zygote's in one of these gets a fresh interpreter. PYTHONPATH is applied per command.
STARTUP_ENV = re.compile(r"^(PYTHON(?!PATH$)|LC_|LANG(UAGE)?$|OMP_|GOMP_|KMP_|MKL_|OPENBLAS_|CUDA_|NVIDIA_|TQDM_)")
# Read at import only by sysconfig, for the user base (~/.local), which a virtual environment
# without the system's site-packages never puts on sys.path: a test's own HOME still holds.
IMPORT_READS_IGNORED = {"HOME"}


# ---- the zygote -----------------------------------------------------------------------------


def _imported() -> dict:
    """Import what every command imports (never initialising CUDA, running no op: no thread
    pool exists to be lost in a fork), recording the environment variables these imports read
    (their values are baked into torch's configs) and the ones they set (torch's Inductor cache
    directory): {"read": [...], "set": {...}}."""
    environ = type(os.environ)
    getitem, before, read = environ.__getitem__, dict(os.environ), set()

    def recorded(self, key):
        caller = sys._getframe(1).f_code
        if caller.co_name != "__iter__":  # a lookup, not a walk over every variable (tqdm's)
            read.add(key)
        return getitem(self, key)

    environ.__getitem__ = recorded
    try:
        import hydra  # noqa: F401
        import omegaconf  # noqa: F401
        import torch  # noqa: F401
        import torch._dynamo  # noqa: F401 - what torch.optim imports on the first Optimizer
        import typer  # noqa: F401

        import cli.main  # noqa: F401 - imports nothing of ablate that reads the environment at import
        import composition_memo  # this file's folder, tests/, is sys.path[0]

        composition_memo.install()  # reads ABLATE_TEST_MEMO: a command that sets it otherwise is not forked
    finally:
        environ.__getitem__ = getitem
    return {"read": sorted(read - IMPORT_READS_IGNORED),
            "set": {k: v for k, v in os.environ.items() if before.get(k) != v}}


def _serve(path: str) -> None:
    """Accept requests until stdin (a pipe from the worker) closes; reap each child and report."""
    imported = _imported()
    base_path = sys.path[1:]  # sys.path[0] is this file's folder; the zygote has no PYTHONPATH
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    os.write(1, b"ready " + json.dumps(imported).encode() + b"\n")
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its request's connection)
    while True:
        ready = select.select([0, listener, *children], [], [])[0]
        if 0 in ready and not os.read(0, 1):
            break
        if listener in ready:
            conn = listener.accept()[0]
            child = _fork_request(conn, base_path)
            if child is not None:
                children[os.pidfd_open(child)] = (child, conn)
        for pidfd in [fd for fd in ready if fd in children]:
            _report(*children.pop(pidfd))
            os.close(pidfd)
    for pid, conn in children.values():  # left running at session end: nobody waits for them
        _kill_group(pid)
        _report(pid, conn)


def _report(pid: int, conn: socket.socket) -> None:
    """Reap the child (its CPU time joins this process's children's, and so the worker's) and
    send its wait status."""
    _, status, usage = os.wait4(pid, 0)
    with conn, contextlib.suppress(OSError):
        conn.sendall(json.dumps({"status": status, "cpu": usage.ru_utime + usage.ru_stime}).encode() + b"\n")


def _fork_request(conn: socket.socket, base_path: list[str]) -> int | None:
    """Fork the request's command; refused (the worker runs it itself) where the fork would not
    be safe: a second thread (Python's or a native one) would be missing, locked, in the child."""
    try:
        request, fds = _receive(conn)
    except (OSError, ValueError):  # the worker went away mid-request
        conn.close()
        return None
    pid = None
    if threading.active_count() == 1 and len(os.listdir("/proc/self/task")) == 1:
        pid = os.fork()
        if pid == 0:
            try:
                _child(request, *fds, base_path)
            finally:
                os._exit(70)  # never back into the serving loop, whatever happened
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):  # the worker has gone: the child's status goes nowhere
        conn.sendall(json.dumps({"pid": pid} if pid else {"refused": "a second thread"}).encode() + b"\n")
    if pid is None:
        conn.close()
    return pid


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, HEADER, 2)
    try:
        if len(fds) != 2:
            raise ValueError("a request carries the command's stdout and stderr")
        head += _recv_exactly(conn, HEADER - len(head))
        return json.loads(_recv_exactly(conn, int(head))), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise OSError("the request ended early")
        data += chunk
    return data


def _child(request: dict, out_fd: int, err_fd: int, base_path: list[str]) -> None:
    """Become `python -m cli.main *args` in `cwd` with `env`, and exit with its code. Its own
    session: like a shell's job, a signal to its process group reaches its own processes only,
    never the zygote or a command that another thread runs at the same time."""
    os.setsid()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as close_fds: nothing of the zygote's server
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    extra = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = list(dict.fromkeys([os.getcwd(), *extra, *base_path]))  # as -m sets it up
    import importlib

    importlib.invalidate_caches()
    sys.argv = [MAIN, *request["args"]]
    os._exit(_finish(_run_main()))


def _run_main() -> int | BaseException:
    """cli/main.py run as __main__ (as -m runs it: the cli.main the zygote imported is set aside),
    its exit code as the interpreter makes it, or the exception it raised."""
    import runpy

    sys.modules.pop("cli.main", None)
    vars(sys.modules["cli"]).pop("main", None)
    try:
        runpy.run_module("cli.main", run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException as e:  # noqa: BLE001 - printed as the interpreter prints it
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # the zygote's own frames were not there in a fresh process
        sys.excepthook(type(e), e, tb)
        return e


def _finish(outcome: int | BaseException) -> int:
    """What the interpreter does at exit: wait for non-daemon threads, run atexit handlers, flush
    (a reader gone: 120); an uncaught Ctrl-C ends the process by SIGINT."""
    import atexit

    threading._shutdown()
    atexit._run_exitfuncs()
    code = 1 if isinstance(outcome, BaseException) else outcome
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120
    if isinstance(outcome, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _kill_group(pid: int) -> None:
    """SIGKILL the child's process group (the one it leads: setsid is its first call), or the
    child alone if it has not called setsid yet."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# ---- the worker's side ----------------------------------------------------------------------


class _Zygote:
    lock = threading.Lock()
    proc: subprocess.Popen | None = None
    path = ""
    env: dict = {}  # its environment when it imported
    read: frozenset = frozenset()  # what its imports read of that environment
    set: dict = {}  # what they set in it
    failed = False  # it could not start: the plain subprocess from then on
    children_cpu = 0.0  # CPU-s of the commands it ran (user + system), as it reaped them


def _started() -> _Zygote | None:
    """The zygote of this process, started on first use; None where it cannot serve."""
    with _Zygote.lock:
        if _Zygote.proc is None and not _Zygote.failed:
            _start()
        ok = _Zygote.proc is not None and _Zygote.proc.poll() is None
        return _Zygote if ok else None


def _start() -> None:
    if not hasattr(os, "pidfd_open"):  # Linux only (pidfds, /proc): elsewhere the plain subprocess
        _Zygote.failed = True
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")  # fork-safe: no CUDA, one thread
    path = os.path.join(tempfile.mkdtemp(prefix="ablate-zygote-"), "socket")
    try:
        proc = subprocess.Popen([sys.executable, __file__, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env, cwd=ROOT, start_new_session=True)
    except OSError:
        proc = None
    ready = proc.stdout.readline() if proc and select.select([proc.stdout], [], [], 120)[0] else b""
    if not ready.startswith(b"ready "):  # it failed to start, import or listen: never again
        if proc is not None:
            proc.kill()
            proc.wait()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        _Zygote.failed = True
        return
    imported = json.loads(ready[len(b"ready "):])
    _Zygote.proc, _Zygote.path, _Zygote.env = proc, path, env
    _Zygote.read, _Zygote.set = frozenset(imported["read"]), imported["set"]


def _command_env(env: dict) -> dict | None:
    """The environment the command gets in the zygote's child, where its imports are already
    done: None where the imports would have read something else in it (a fresh interpreter
    then). A variable the imports set, the child gets as they would have set it."""
    for key in {*env, *_Zygote.env}:
        as_imported = env.get(key) == _Zygote.env.get(key) or (key in _Zygote.set and env.get(key) == _Zygote.set[key])
        if (key in _Zygote.read or STARTUP_ENV.match(key)) and not as_imported:
            return None
    return {**env, **{k: v for k, v in _Zygote.set.items() if env.get(k) == _Zygote.env.get(k)}}


def stop() -> None:
    """End the zygote (EOF on its stdin) and wait for it, so that its and its children's CPU time
    are counted in this process's children's."""
    with _Zygote.lock:
        proc, _Zygote.proc = _Zygote.proc, None
    if proc is not None:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        Path(_Zygote.path).unlink(missing_ok=True)
        Path(_Zygote.path).parent.rmdir()


def run(cmd: list[str], args: tuple[str, ...], cwd: Path, env: dict,
        timeout: float) -> subprocess.CompletedProcess | None:
    """subprocess.run(cmd, cwd, env, capture_output=True, text=True, timeout)'s result for
    `python -m cli.main *args`, forked from the zygote; None where the zygote cannot run it
    exactly as a fresh interpreter would (the caller runs the subprocess then)."""
    zygote = _started()
    env = _command_env(env) if zygote is not None else None
    if env is None:
        return None
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(zygote.path)
        body = json.dumps({"args": list(args), "cwd": str(cwd), "env": env}).encode()
        socket.send_fds(sock, [b"%0*d" % (HEADER, len(body))], [out_w, err_w])
        sock.sendall(body)
    except OSError:
        sock.close()
        for fd in (out_r, err_r):
            os.close(fd)
        return None
    finally:
        os.close(out_w)
        os.close(err_w)
    return _collect(cmd, sock, out_r, err_r, timeout)


def _collect(cmd: list[str], sock: socket.socket, out_r: int, err_r: int,
             timeout: float) -> subprocess.CompletedProcess | None:
    """Read stdout and stderr to their end and the child's status, as communicate() does; past
    `timeout` (or on any exception, Ctrl-C included) the child is killed, as subprocess.run does."""
    deadline = time.monotonic() + timeout
    with _Reader(sock, out_r, err_r) as reader:
        try:
            while not reader.done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(cmd, timeout, output=bytes(reader.out), stderr=bytes(reader.err))
                reader.read(left)
                if reader.refused:
                    return None
        except BaseException:
            if reader.pid is not None and reader.status is None:
                _kill_group(reader.pid)
                reader.wait_status(30)
            raise
    if reader.pid is None:  # the zygote ended before it forked: the command has not run
        return None
    if reader.status is None:
        raise RuntimeError(f"the zygote ended before reporting how `{' '.join(cmd)}` exited")
    text = [reader.text(b) for b in (reader.out, reader.err)]
    return subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(reader.status), *text)


class _Reader:
    """The command's two pipes and its request's connection, read as they become readable."""

    def __init__(self, sock: socket.socket, out_r: int, err_r: int):
        self.sock, self.out, self.err, self.lines = sock, bytearray(), bytearray(), b""
        self.pid = self.status = self.refused = None
        self.sel = selectors.DefaultSelector()
        self.sel.register(out_r, selectors.EVENT_READ, self.out)
        self.sel.register(err_r, selectors.EVENT_READ, self.err)
        self.sel.register(sock, selectors.EVENT_READ, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for key in list(self.sel.get_map().values()):
            self.sel.unregister(key.fileobj)
            key.fileobj.close() if key.fileobj is self.sock else os.close(key.fileobj)
        self.sel.close()

    def done(self) -> bool:
        return not self.sel.get_map()  # every pipe at its end, the connection closed

    def read(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            data = key.fileobj.recv(65536) if key.fileobj is self.sock else os.read(key.fd, 65536)
            if not data:
                self.sel.unregister(key.fileobj)
                key.fileobj.close() if key.fileobj is self.sock else os.close(key.fd)
            elif key.data is None:
                self._message(data)
            else:
                key.data.extend(data)

    def _message(self, data: bytes) -> None:
        *done, self.lines = (self.lines + data).split(b"\n")
        for line in done:
            msg = json.loads(line)
            self.pid = msg.get("pid", self.pid)
            self.status = msg.get("status", self.status)
            _Zygote.children_cpu += msg.get("cpu", 0.0)
            self.refused = msg.get("refused", self.refused)

    def wait_status(self, timeout: float) -> None:
        """After a kill: the status arrives once the zygote has reaped the child (pipes aside)."""
        deadline = time.monotonic() + timeout
        while self.status is None and self.sock.fileno() != -1 and time.monotonic() < deadline:
            if not select.select([self.sock], [], [], deadline - time.monotonic())[0]:
                break
            data = self.sock.recv(65536)
            if not data:
                break
            self._message(data)

    @staticmethod
    def text(data: bytes) -> str:
        """As subprocess's text mode reads a pipe: the locale's encoding, universal newlines."""
        import locale

        encoding = "utf-8" if sys.flags.utf8_mode else locale.getpreferredencoding(False)
        return bytes(data).decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    _serve(sys.argv[1])
