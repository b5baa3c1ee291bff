"""Puts the conf dirs of ablate plugins (ablate/plugins.py) on Hydra's search path, so that an
option a plugin registers (`norm=crmsnorm`) composes like a built-in one. Hydra calls this in
every process before it composes: `ablate run`/`sweep` (`@hydra.main`), torchrun ranks (which
get the same overrides as argv) and the compose API (ablate.config.compose loads the plugins of its
overrides first). Plugins are loaded from `plugins=[...]` in argv and from entry points.

No `from __future__ import annotations`: see ablate_sweeper.py."""

import sys

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class AblatePluginsSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from ablate import plugins
        from ablate.errors import AblateError

        try:
            dirs = plugins.load_from_argv()
        except AblateError as e:  # before Hydra's job machinery: one line, nothing written
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(e.exit_code) from None
        for d in dirs:
            search_path.append(provider="ablate-plugin", path=f"file://{d}")
