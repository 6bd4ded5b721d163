"""Where ead keeps things: its config (calibrated taus, depth profiles) and its cache (models, a built
llama-server, depth's low-rank factors). One place, so no module imports another just for a path."""

from __future__ import annotations

import os
from pathlib import Path


def config_file() -> Path:
    """$EAD_CONFIG, else $XDG_CONFIG_HOME/ead-cli/calibration.json (~/.config by default)."""
    if os.environ.get("EAD_CONFIG"):
        return Path(os.environ["EAD_CONFIG"]).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config").expanduser()
    return base / "ead-cli" / "calibration.json"


def xdg_cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()


def ead_cache_dir() -> Path:
    """$EAD_CACHE, else ead-cli in the XDG cache: models, and a llama-server built for the tests."""
    root = os.environ.get("EAD_CACHE")
    return Path(root).expanduser() if root else xdg_cache_home() / "ead-cli"
