"""What this CPU and this llama.cpp build can safely do: whether to let llama.cpp repack weights.

At load time llama.cpp may move weights into "extra" CPU buffer types that re-lay them out for faster
matrix products: ``CPU_REPACK`` (AVX2/AVX-512 interleaved blocks) and, on Intel CPUs with AMX (Sapphire
Rapids and later, most current cloud Xeons), ``AMX``. The AMX path segfaults on the first matrix product
(``ldtilecfg`` in ggml_backend_amx_mul_mat: ggml-org/llama.cpp#20824, unfixed in the vendored 0.3.36).
llama.cpp's only switch is all or nothing (``llama_model_params.use_extra_bufts``, llama-server's
``--no-repack``), and AMX comes first in its list, so where AMX is active we turn every extra buffer off,
and keep them everywhere else.

How AMX is detected: by asking llama.cpp which extra buffer types its CPU backend offers, because that is
exactly the path a load would take (AMX kernels exist only in builds compiled for an AMX CPU, and the
buffer type exists only where the kernel granted tile permission). Where that question cannot be asked
(a build without the symbol), the CPU's flags and the build's feature list stand in: AMX on the CPU and
``AMX_INT8 = 1`` in llama.cpp's system info.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import EadError, quoted

REPACK_ENV = "EAD_REPACK"
AMX_BUG = "ggml-org/llama.cpp#20824"
_CPU_DEVICE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU
_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


@dataclass(frozen=True)
class Repack:
    """Whether llama.cpp may repack weights into its extra CPU buffer types, and why."""

    enabled: bool
    reason: str
    automatic: bool = False  # decided by this machine, not by an option or EAD_REPACK

    @property
    def word(self) -> str:
        return "on" if self.enabled else "off"


def _first_field(cpuinfo: str, *keys: str) -> str | None:
    """The value of the first line of /proc/cpuinfo's text whose key is one of ``keys``."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return None


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first processor in /proc/cpuinfo's text (x86 'flags', Arm 'Features')."""
    return frozenset((_first_field(cpuinfo, "flags", "Features") or "").split())


def cpu_model_name(cpuinfo: str) -> str | None:
    """The first processor's model name in /proc/cpuinfo's text (None where it has none: Arm's)."""
    return _first_field(cpuinfo, "model name")


def cpu_has_amx(flags: frozenset[str]) -> bool:
    """Tile registers and int8 tile products: what llama.cpp's AMX kernels use."""
    return {"amx_tile", "amx_int8"} <= flags


def parse_repack_setting(value: str, source: str) -> bool | None:
    """'on'/'off' (or 1/0, true/false, yes/no) as a bool, 'auto' or '' as None; anything else an error."""
    word = value.strip().lower()
    if word in ("", "auto"):
        return None
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise EadError(f"{source} takes on, off or auto, got {quoted(value)}", exit_code=2)


def decide_repack(
    requested: bool | None,
    *,
    env: str | None,
    buffer_types: Sequence[str] | None,
    flags: frozenset[str],
    system_info: str,
) -> Repack:
    """The decision, from what the user asked (option, then ``EAD_REPACK``) and what the machine offers.

    ``buffer_types``: the names of llama.cpp's extra CPU buffer types here, or None where they could not
    be asked; ``flags``: the CPU's; ``system_info``: llama.cpp's feature line (``AMX_INT8 = 1``)."""
    if requested is not None:
        return Repack(requested, "--repack" if requested else "--no-repack")
    from_env = parse_repack_setting(env or "", REPACK_ENV)
    if from_env is not None:
        return Repack(from_env, f"{REPACK_ENV}={env}")
    if buffer_types is not None:
        if any(name.upper().startswith("AMX") for name in buffer_types):
            return Repack(False, f"llama.cpp's AMX weight buffer is active and crashes ({AMX_BUG})", True)
        offered = ", ".join(buffer_types) or "none"
        return Repack(True, f"no AMX buffer here (llama.cpp's extra buffers: {offered})", True)
    if cpu_has_amx(flags) and "AMX_INT8 = 1" in system_info:
        return Repack(False, f"this CPU has AMX and llama.cpp was built with AMX kernels ({AMX_BUG})", True)
    return Repack(True, "no AMX kernels for this CPU in this llama.cpp build", True)


def extra_buffer_types() -> tuple[str, ...] | None:
    """The names of the extra buffer types llama.cpp's CPU backend offers on this machine (e.g.
    ``('AMX', 'CPU_REPACK')``), or None where this build does not say."""
    import llama_cpp

    library = llama_cpp.llama_cpp._lib  # libllama: dlsym also searches the ggml libraries it links
    try:
        by_type = library.ggml_backend_dev_by_type
        backend_reg = library.ggml_backend_dev_backend_reg
        proc_address = library.ggml_backend_reg_get_proc_address
        buffer_name = library.ggml_backend_buft_name
    except AttributeError:
        return None
    by_type.argtypes, by_type.restype = [ctypes.c_int], ctypes.c_void_p
    backend_reg.argtypes, backend_reg.restype = [ctypes.c_void_p], ctypes.c_void_p
    proc_address.argtypes, proc_address.restype = [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p
    buffer_name.argtypes, buffer_name.restype = [ctypes.c_void_p], ctypes.c_char_p
    device = by_type(_CPU_DEVICE)
    if not device:
        return None
    address = proc_address(backend_reg(device), b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return None
    get_extra = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)
    array = get_extra(device)
    names: list[str] = []
    index = 0
    while array and array[index]:
        names.append(buffer_name(array[index]).decode("utf-8", errors="replace"))
        index += 1
    return tuple(names)


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def this_cpu() -> tuple[str, frozenset[str]]:
    """This machine's CPU model name (else its architecture) and flags, read from /proc/cpuinfo once per
    process: for results, messages and the smoke decode's key."""
    cpuinfo = _read_cpuinfo()
    name = cpu_model_name(cpuinfo) or platform.processor() or platform.machine() or "unknown CPU"
    return name, cpu_flags(cpuinfo)


def machine_record(repack: Repack) -> dict[str, Any]:
    """The machine a timing was taken on, for results files: the CPU's model name, its logical CPUs and
    whether llama.cpp repacked the weights. Relative costs differ a lot between CPUs (an AMD EPYC's
    batches gain far less over its decode than an AMX Xeon's), so a ratio is only read beside these."""
    return {"cpu": this_cpu()[0], "cpus": os.cpu_count(), "repack": repack.word}


def machine_words(machine: Any) -> str | None:
    """A ``machine_record`` as a table's caption says it; None for anything else (an edited file's)."""
    if not isinstance(machine, dict) or not {"cpu", "cpus", "repack"} <= machine.keys():
        return None
    return f"{machine['cpu']}, {machine['cpus']} CPUs, weight repacking {machine['repack']}"


@functools.lru_cache(maxsize=1)
def _machine() -> tuple[tuple[str, ...] | None, frozenset[str], str]:
    """What decides the default, asked once per process: llama.cpp's buffer types, CPU flags, features."""
    import llama_cpp

    system_info = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
    return extra_buffer_types(), this_cpu()[1], system_info


def repack_choice(requested: bool | None = None) -> Repack:
    """The decision for this process: ``requested`` (an option), else ``EAD_REPACK``, else this machine's."""
    if requested is not None:
        return decide_repack(requested, env=None, buffer_types=None, flags=frozenset(), system_info="")
    buffer_types, flags, system_info = _machine()
    return decide_repack(
        None, env=os.environ.get(REPACK_ENV), buffer_types=buffer_types, flags=flags, system_info=system_info
    )


def server_repack_args(choice: Repack) -> list[str]:
    """llama-server's flag for the same decision (it repacks by default)."""
    return [] if choice.enabled else ["--no-repack"]
