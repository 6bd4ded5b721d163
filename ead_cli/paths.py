"""Where ead keeps things: its config (calibrated taus, depth profiles) and its cache (models, a built
llama-server, depth's low-rank factors), and whether it can save there. One place, so no module imports
another just for a path."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import EadError


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


def check_can_save(path: Path, what: str) -> None:
    """Make the folder ``path`` goes in and write a scratch file there: tried before minutes of work (a
    calibration) that a file in the folder's way or a folder it cannot write would throw away."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path.parent).close()
    except OSError as error:
        raise cannot_save(path, what, error) from None


def cannot_save(path: Path, what: str, error: OSError) -> EadError:
    """One line naming what is in the way: mkdir's "File exists" is a file where a folder should be."""
    if isinstance(error, FileExistsError):
        reason = f"{error.filename} is not a folder"
    elif error.filename and error.filename != str(path):
        reason = f"{error.strerror} ({error.filename})"
    else:
        reason = str(error.strerror)
    return EadError(f"cannot save {what} to {path}: {reason}")


def save_json(path: Path, data: Any, what: str, *, indent: int) -> Path:
    """``data`` written whole to a temporary name beside ``path``, then renamed over it: a failed write
    leaves the old file as it was and no temporary, and is one line naming ``what`` could not be saved."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8"
        ) as out:
            temporary = Path(out.name)
            json.dump(data, out, indent=indent)
            out.write("\n")
        os.replace(temporary, path)
    except OSError as error:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        raise cannot_save(path, what, error) from None
    return path
