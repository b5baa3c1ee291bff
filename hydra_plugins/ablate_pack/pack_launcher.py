"""submitit launchers that run several sweep jobs in one array task, all at once, so small
models share a GPU allocation (`ablate sweep --jobs-per-gpu K launcher=slurm`). hydra-submitit-
launcher submits one array task per job; these submit one task per group of `jobs_per_task`
jobs. The task starts each job of its group as its own process (pack_worker: the same call
hydra-submitit-launcher makes in a task, so each job is a normal run directory in the sweep
directory), waits for all of them and returns their JobReturns in order.

Preemption: SLURM's USR2 (and USR1, TERM, INT) reaching the task is passed on to every job, each
of which checkpoints and stops as `preempted`; then submitit's own handler requeues the task,
and each job of the group resumes from its checkpoint (a finished one returns its outcome).
The sweeper switches to these classes itself when a group holds more than one job (each is the
`packed_target` of its launcher's description, ablate/sweep/launchers.py); `jobs_per_task` is not
a submitit parameter.

No `from __future__ import annotations`: see hydra_plugins/ablate_sweeper/ablate_sweeper.py."""

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, List, Sequence

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import (
        BaseSubmititLauncher, LocalLauncher, SlurmLauncher)
except ImportError:  # hydra-submitit-launcher is not installed: launcher=slurm says so itself
    BaseSubmititLauncher = None

FORWARDED = (signal.SIGUSR2, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


class PackedTask:
    """One array task: its jobs (the arguments of BaseSubmititLauncher.__call__ for each), each in
    its own process at once. Picklable (submitit pickles it into the task); `checkpoint` makes
    submitit requeue the same group after a preemption."""

    def __init__(self, launcher: Any):
        self.launcher = launcher

    def __call__(self, jobs: List[tuple]) -> List[Any]:
        import cloudpickle

        received: List[int] = []
        originals = {s: signal.getsignal(s) for s in FORWARDED}
        procs: List[subprocess.Popen] = []

        def forward(signum, frame):  # every job checkpoints and stops; the task requeues after
            received.append(signum)
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signum)

        with tempfile.TemporaryDirectory(prefix="ablate-pack-") as tmp:
            outs = []
            for i, args in enumerate(jobs):
                inp, out = Path(tmp) / f"{i}.in.pkl", Path(tmp) / f"{i}.out.pkl"
                inp.write_bytes(cloudpickle.dumps((self.launcher, args)))
                outs.append(out)
            # the jobs import this checkout's code, whatever the task's working directory
            root = str(Path(__file__).resolve().parents[2])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [root] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
            for s in FORWARDED:
                signal.signal(s, forward)
            try:
                for i, out in enumerate(outs):
                    procs.append(subprocess.Popen(
                        [sys.executable, "-u", "-m", "hydra_plugins.ablate_pack.pack_worker",
                         str(Path(tmp) / f"{i}.in.pkl"), str(out)], env=env))
                for p in procs:
                    while True:
                        try:
                            p.wait()
                            break
                        except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                            continue
            finally:
                for s, handler in originals.items():
                    signal.signal(s, handler)
            returns = [cloudpickle.loads(out.read_bytes()) if out.exists() else None for out in outs]
        if received and any(_preempted(r) for r in returns):
            # as a lone job does (ablate.train.distributed.request_requeue): submitit's own
            # preemption handler calls checkpoint() below, requeues the task and exits
            import submitit

            usr = submitit.JobEnvironment._usr_sig()
            handler = originals.get(usr, signal.getsignal(usr))
            if callable(handler):
                handler(usr, None)
        return returns  # None: that job's process died without a result (its directory says why)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def _preempted(ret: Any) -> bool:
    try:
        value = ret.return_value  # re-raises a failed job's exception
    except BaseException:  # noqa: BLE001 - a failed job is not requeued
        return False
    from ablate.run.record import RunRecord
    from ablate.names import Status

    return isinstance(value, RunRecord) and value.status == Status.PREEMPTED


def groups_of(items: Sequence[Any], size: int) -> List[list]:
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


if BaseSubmititLauncher is not None:

    class _Packed:
        """launch() as BaseSubmititLauncher's, with one array task per `jobs_per_task` jobs."""

        def __init__(self, jobs_per_task: int = 1, **params: Any) -> None:
            super().__init__(**params)  # type: ignore[call-arg]
            self.jobs_per_task = max(1, int(jobs_per_task))

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
            import submitit
            from hydra.core.singleton import Singleton
            from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
            from omegaconf import OmegaConf

            params = dict(self.params)
            init = {"folder": params.pop("submitit_folder")}
            if "max_num_timeout" in params:
                init[f"{self._EXECUTOR}_max_num_timeout"] = params.pop("max_num_timeout")
            executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init)
            base = set(OmegaConf.structured(BaseQueueConf).keys())
            executor.update_parameters(**{k if k in base else f"{self._EXECUTOR}_{k}": v
                                          for k, v in params.items()})
            Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
            state = Singleton.get_state()
            jobs = [(list(o), "hydra.sweep.dir", initial_job_idx + i, f"job_id_for_{initial_job_idx + i}",
                     state) for i, o in enumerate(job_overrides)]
            tasks = executor.map_array(PackedTask(self), groups_of(jobs, self.jobs_per_task))
            return [r for t in tasks for r in t.results()[0]]

    class PackedLocalLauncher(_Packed, LocalLauncher):
        pass

    class PackedSlurmLauncher(_Packed, SlurmLauncher):
        pass
