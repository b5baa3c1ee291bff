"""One job of a packed array task (pack_launcher.PackedTask): `python -m
hydra_plugins.ablate_pack.pack_worker IN OUT` loads (launcher, job arguments) from IN, makes the
call hydra-submitit-launcher makes in a task (compose the job, run it in its directory) and
writes the JobReturn to OUT. A job's own failure is inside its JobReturn, as in a task."""

import os
import sys
from pathlib import Path


def main() -> None:
    import cloudpickle

    inp, out = sys.argv[1], sys.argv[2]
    launcher, args = cloudpickle.loads(Path(inp).read_bytes())
    ret = launcher(*args)
    tmp = out + ".tmp"
    Path(tmp).write_bytes(cloudpickle.dumps(ret))
    os.replace(tmp, out)  # whole or absent: the task reads an absent result as a lost job


if __name__ == "__main__":
    main()
