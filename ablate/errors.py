"""Errors a user can fix. The CLI prints them as one line (no traceback) and exits non-zero."""


class AblateError(Exception):
    """Base class: a problem with the user's input or environment, reported in one line."""

    exit_code = 2


class ConfigError(AblateError):
    """An invalid option or combination of options, caught before any training."""


class DataError(AblateError):
    """A missing, empty or unreadable data source, or an unusable tokenizer."""


class CheckpointError(AblateError):
    """A checkpoint that cannot be used."""


class RunDirError(AblateError):
    """The run directory cannot be used (unwritable, or owned by another process)."""
