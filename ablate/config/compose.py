"""Compose a config outside a Hydra job (for pre-flight checks, `inspect`, `bench`, tests).

`compose_config` refuses secrets, unresolvable interpolations and invalid configs; `preflight`
checks what depends on the machine rather than the config (output directory, a run directory's
owner, data files, device); `prepare_checked` tokenizes the corpus into the cache and checks it
holds a batch. So bad input is refused with one line before Hydra makes a directory or writes a file.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any, Optional

from ablate.errors import ConfigError, DataError, RunDirError


@functools.lru_cache(maxsize=1)
def schema_keys() -> tuple[str, ...]:
    """Every dotted key of the typed schema (for "did you mean" suggestions). Built once: the
    schema is fixed at import (plugins' options add settings, which setting_keys reads)."""
    from omegaconf import OmegaConf

    from ablate.config.schema import AblateConfig

    return tuple(_flat(OmegaConf.to_container(OmegaConf.structured(AblateConfig)), "").keys())


def unknown_key_message(key: str, node: Optional[type] = None) -> str:
    """`model.n_layer` -> did you mean model.n_layers? The wrong part is matched against its
    siblings only (`model.foo` is not close to `model.d_ff` because both start `model.`); with
    none close, the valid keys there are listed. node: the dataclass of the node holding the key
    (an option's own schema: `norm.foo` with norm=dyt lists its settings too)."""
    import dataclasses
    import difflib

    from ablate.config.schema import setting_owners

    holder, _, leaf = key.rpartition(".")
    node_keys = {f.name for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else set()
    owners = setting_owners(key)
    if owners and leaf not in node_keys:
        return (f"unknown config key '{key}': a setting of {' or '.join(owners)} only; choose that "
                "option or drop the key")
    leaves = [k.lstrip(".") for k in schema_keys()] + [f"{holder}.{k}" for k in node_keys if holder]
    nodes = {k.rsplit(".", i)[0] for k in leaves for i in range(1, k.count(".") + 1)}
    parts = key.split(".")
    depth = 0  # the first part that names nothing: the one to correct
    while depth < len(parts) - 1 and ".".join(parts[:depth + 1]) in nodes:
        depth += 1
    parent = ".".join(parts[:depth])
    siblings = sorted({k[len(parent) + 1 if parent else 0:].split(".")[0]
                       for k in leaves if not parent or k.startswith(parent + ".")})
    close = difflib.get_close_matches(parts[depth], siblings, n=1, cutoff=0.6)
    if close:
        fixed = ".".join(parts[:depth] + close + parts[depth + 1:])  # trian.steps -> train.steps
        fixed = fixed if fixed in nodes or fixed in leaves else ".".join(parts[:depth] + close)
        return f"unknown config key '{key}' (did you mean {fixed}?)"
    where = f"{parent} has" if parent else "the top-level keys are"
    return f"unknown config key '{key}' (none is close; {where}: {', '.join(siblings)})"


def hydra_message(e: Exception) -> str:
    """Hydra's multi-line composition error as one line (keeping the list of valid options);
    a wrong key or type is reported by the key, with the reason OmegaConf gives."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    cause = e.__cause__
    preset = re.match(r"In '([\w-]+)/([\w-]+)': ConfigKeyError", str(e))
    if preset and isinstance(e.__context__, ConfigKeyError):
        # a preset sets a setting of an option the command line replaced (arch=mistral attn=mla)
        from ablate.config.schema import setting_owners

        key, choice = e.__context__.full_key, f"{preset[1]}={preset[2]}"
        owners = setting_owners(key)
        if owners:
            return (f"{choice} sets {key}, a setting of {' or '.join(owners)} only: keep "
                    f"{' or '.join(owners)} with {choice}, or choose a preset that does not set {key}")
        return f"{choice} sets {key}: {unknown_key_message(key, getattr(e.__context__, 'object_type', None))}"
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
            return unknown_key_message(cause.full_key, getattr(cause, "object_type", None))
        reason = str(cause).splitlines()[0].strip()
        return f"{cause.full_key}: {reason}"
    text = str(e).split("Config search path")[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) > 1 and lines[1].startswith("Available options"):
        return f"{lines[0]}. {lines[1]} {', '.join(lines[2:])}"
    return " ".join(lines)


def check_known_keys(cfg: Any) -> None:
    """`+train.stpes=10` appends a key Hydra accepts and nothing reads: refuse it."""
    from omegaconf import OmegaConf

    from ablate.config.schema import setting_keys

    known = set(schema_keys()) | {f".{k}" for k in setting_keys(cfg)}
    for key in _flat(OmegaConf.to_container(cfg, resolve=False), ""):
        if key not in known and not any(key.startswith(k + ".") for k in known):
            parent = key.lstrip(".").rpartition(".")[0]
            node = OmegaConf.get_type(OmegaConf.select(cfg, parent)) if parent else None
            raise ConfigError(unknown_key_message(key.lstrip("."), node))


SECRET_MESSAGE = ("credentials are not accepted in the config (they would be written to the run's "
                  "files); set WANDB_API_KEY or run `wandb login` instead")
_ENV_REF = re.compile(r"\$\{\s*(?:oc\.env|env)\s*:\s*([^,}\s]+)")  # ${oc.env:NAME[,default]}


def check_no_secrets(overrides: list[str]) -> None:
    """A credential given as an override would be copied into config.yaml, .hydra/ and the
    W&B config, so it is refused (before Hydra parses it: its errors echo the value); so is an
    interpolation of a secret-looking environment variable (`${oc.env:WANDB_API_KEY}`)."""
    from ablate.tracking.wandb_sink import is_secret_key

    env_key = os.environ.get("WANDB_API_KEY") or ""
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        leaf = key.rsplit(".", 1)[-1].lower()
        if is_secret_key(leaf) or (len(env_key) >= 8 and env_key in o) or \
                any(is_secret_key(name) for name in _ENV_REF.findall(o)):
            raise ConfigError(f"'{key}': {SECRET_MESSAGE}")


def check_quoted(overrides: list[str]) -> None:
    """Hydra reads a value holding '=' only quoted, and says just "mismatched input '='" when it
    is not: a run directory's name holds its overrides (`..._norm=rmsnorm`), so a directory pasted
    from a run's banner fails so. Say how to quote it, and that `ablate resume` takes it as it is."""
    from ablate.run.directory import resume_command

    for o in overrides:
        key, _, value = o.partition("=")
        if "=" not in value or value[:1] in ("'", '"') or "${" in value:
            continue
        key = key.lstrip("+~")
        again = {"hydra.run.dir": "run", "hydra.sweep.dir": "sweep"}.get(key)
        resume = f"; to continue that {again}, `{resume_command(value)}` takes it as it is" if again else ""
        raise ConfigError(f"{o}: Hydra reads a value with '=' only in quotes: write "
                          f"'{key}=\"{value}\"' (the outer quotes for the shell){resume}")


def _without_hydra_refs(node: Any) -> Any:
    """`${hydra:...}` resolves only inside a Hydra job: blank it out to resolve the rest."""
    if isinstance(node, dict):
        return {k: _without_hydra_refs(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_without_hydra_refs(v) for v in node]
    return "" if isinstance(node, str) and "${hydra:" in node else node


def check_resolvable(cfg: Any) -> None:
    """Resolve every interpolation now, so `${oc.env:UNSET}` is one line naming the key (not
    Hydra's 100-line error after composing), and refuse a resolved value holding the W&B key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    raw = _without_hydra_refs(OmegaConf.to_container(cfg, resolve=False))
    try:
        resolved = OmegaConf.to_container(OmegaConf.create(raw), resolve=True)
    except OmegaConfBaseException as e:
        reason = str(e).splitlines()[0].split("resolving interpolation: ")[-1].strip().strip('"')
        raise ConfigError(f"{getattr(e, 'full_key', None) or '?'}: cannot resolve its interpolation "
                          f"({reason}); set it to a value or define what it refers to") from None
    env_key = os.environ.get("WANDB_API_KEY") or ""
    if len(env_key) >= 8:
        for key, value in _flat(resolved, "").items():
            for v in value if isinstance(value, list) else [value]:
                if env_key in str(v):  # reached through another variable or a default
                    raise ConfigError(f"'{key.lstrip('.')}' resolves to the WANDB_API_KEY value: "
                                      f"{SECRET_MESSAGE}")


def load_plugins(overrides: list[str]) -> None:
    """Import the plugin modules that `plugins=[...]` names (and entry points) before composing:
    their options join the axis registries and their conf dirs Hydra's search path (through
    hydra_plugins/ablate_sweeper/ablate_searchpath.py, which reads ablate.plugins)."""
    from ablate.plugins import load_from_overrides

    load_from_overrides(overrides)


def compose_config(overrides: list[str], validate: bool = True) -> Any:
    """ablate's config with `overrides`, composed by Hydra's compose API (without the hydra
    node) and checked: one ConfigError line for what a run would refuse."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ablate.config.axes import CONF_DIR
    from ablate.config.schema import register_configs
    from ablate.config.schema import validate as check

    check_no_secrets(list(overrides))
    check_quoted(list(overrides))
    load_plugins(list(overrides))
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(hydra_message(e)) from None
    finally:
        GlobalHydra.instance().clear()
    check_known_keys(cfg)
    check_resolvable(cfg)
    if validate:
        check(cfg)
    return cfg


# ---- pre-flight: the machine, not the config ---------------------------------------------------
def explicit_run_dir(overrides: list[str]) -> Optional[Path]:
    """The value of a literal `hydra.run.dir=...` override (None if absent or interpolated)."""
    for o in reversed(overrides):
        key, _, value = o.lstrip("+").partition("=")
        if key == "hydra.run.dir" and value and "${" not in value:
            return Path(os.path.expanduser(value.strip("'\"")))
    return None


def check_writable(target: Path, what: str) -> None:
    """`target` (which may not exist yet) can be created and written: its nearest existing
    ancestor is a writable directory, and no component on the way is a file."""
    p = Path(os.path.abspath(target))
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    if not p.is_dir():
        raise RunDirError(f"{what} {target} cannot be created: {p} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise RunDirError(f"{what} {target} is not writable (no write permission on {p})")
    import tempfile

    try:  # what the permission bits do not say: /proc, a read-only mount, root's access()
        os.rmdir(tempfile.mkdtemp(prefix=".ablate-probe-", dir=p))
    except OSError as e:
        raise RunDirError(f"{what} {target} cannot be created: {p} takes no new directory "
                          f"({e.strerror})") from None


def check_data(data_cfg: Any) -> None:
    """Local data files exist and are not all empty (deeper problems surface while tokenizing)."""
    if data_cfg.name != "text_files":
        return
    from ablate.data.sources import text_files

    files = text_files(data_cfg.paths)  # DataError naming a missing path or an unsupported type
    for f in files:
        if not os.access(f, os.R_OK):
            raise DataError(f"data file not readable: {f}")
    if sum(f.stat().st_size for f in files) == 0:
        raise DataError(f"data.paths: the corpus is empty ({len(files)} file(s), 0 bytes)")


def check_device(name: str) -> None:
    if name not in ("auto", "cpu", "mps") and not re.fullmatch(r"cuda(:\d+)?", name):
        raise ConfigError(f"train.device must be auto, cpu, cuda, cuda:N or mps, got '{name}'")
    if not name.startswith("cuda"):
        return
    import torch  # only when a GPU was asked for

    if not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but no CUDA device is available; use train.device=auto or cpu")
    index = int(name.split(":", 1)[1]) if ":" in name else 0
    if index >= torch.cuda.device_count():
        raise ConfigError(f"train.device={name} but only {torch.cuda.device_count()} CUDA device(s) are visible")


def _flat(node: Any, prefix: str) -> dict:
    if isinstance(node, dict):
        return {k: v for key, sub in node.items() for k, v in _flat(sub, f"{prefix}.{key}").items()}
    return {prefix: node}


def preflight(cfg: Any, overrides: list[str]) -> None:
    """Refuse what would fail after Hydra made the run directory; raises AblateError."""
    from ablate.run.directory import RunLock

    run_dir = explicit_run_dir(overrides)
    if run_dir is not None:
        RunLock(run_dir).check_free()
        check_writable(run_dir, "run directory")
        if cfg.train.resume == "auto":
            from ablate.train.checkpoint import check_resumable

            check_resumable(run_dir)
        from ablate.run.lifecycle import check_reentry

        check_reentry(run_dir, cfg)  # the one re-entry rule: refuses before Hydra writes anything
    else:
        check_writable(Path(os.path.expanduser(str(cfg.out_dir))), "out_dir")
    check_device(str(cfg.train.device))
    check_data(cfg.data)
    from ablate.data.cache import preflight as data_preflight

    data_preflight(cfg.data, cfg.tokenizer.name)  # e.g. a hub dataset, offline and not cached


def prepare_checked(cfg: Any):
    """Tokenize the data into the cache unless it is there (the write is atomic and locked) and
    check that the training split holds one batch, so a corpus problem (no text field, invalid
    JSON, not UTF-8, too small) is one line before Hydra makes a run directory. Cheap when
    cached (reads meta.json). Returns the TokenData; raises DataError."""
    from ablate.data.cache import check_one_batch, prepare
    from ablate.data.tokenizers import build_tokenizer

    data, _ = prepare(cfg.data, build_tokenizer(cfg.tokenizer.name), progress=bool(cfg.train.progress))
    check_one_batch(data.meta["tokens"]["train"], cfg.train.batch_size, cfg.train.seq_len)
    return data
