"""The AMX crash (ggml-org/llama.cpp#20824) never reached: the repack decision on described CPUs, its
effect on llama.cpp's load parameters and on the llama-servers ead starts, and the smoke decode that
turns a crash in a child process into one paragraph. Runs on whatever CPU CI has."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest
from test_cli import assert_one_line_error, ead, pair_args

from ead_cli import hardware, smoke
from ead_cli.bench import native
from ead_cli.errors import EadError
from ead_cli.hardware import Repack, cpu_flags, decide_repack, repack_choice
from ead_cli.remote import built_server
from ead_cli.runner import Runner, model_params

SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8
processor\t: 1
flags\t\t: fpu
"""
EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512_vnni avx512_bf16 avx_vnni
"""
GRAVITON = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid sve
"""
AMX_BUILD = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | REPACK = 1 | "
PLAIN_BUILD = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | REPACK = 1 | "


def test_cpu_flags_are_read_from_the_first_processor_on_x86_and_arm() -> None:
    intel = cpu_flags(SAPPHIRE_RAPIDS)
    assert {"amx_tile", "amx_int8", "avx512f"} <= intel
    assert hardware.cpu_has_amx(intel)
    assert not hardware.cpu_has_amx(cpu_flags(EPYC))
    assert "sve" in cpu_flags(GRAVITON) and not hardware.cpu_has_amx(cpu_flags(GRAVITON))
    assert cpu_flags("") == frozenset()
    assert hardware.cpu_model_name(SAPPHIRE_RAPIDS) == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    assert hardware.cpu_model_name(EPYC) == "AMD EPYC"
    assert hardware.cpu_model_name(GRAVITON) is None  # Arm's /proc/cpuinfo names no model
    assert not hardware.cpu_has_amx(frozenset({"amx_bf16"}))  # no tiles of int8: not llama.cpp's kernels


def decide(requested: bool | None = None, env: str | None = None, **machine) -> Repack:
    return decide_repack(requested, env=env, **machine)


AMX_MACHINE = {
    "buffer_types": ("AMX", "CPU_REPACK"),
    "flags": cpu_flags(SAPPHIRE_RAPIDS),
    "system_info": AMX_BUILD,
}
EPYC_MACHINE = {"buffer_types": ("CPU_REPACK",), "flags": cpu_flags(EPYC), "system_info": PLAIN_BUILD}


def test_an_active_amx_buffer_turns_repacking_off_and_says_why() -> None:
    choice = decide(**AMX_MACHINE)
    assert (choice.enabled, choice.automatic) == (False, True)
    assert "AMX" in choice.reason and "ggml-org/llama.cpp#20824" in choice.reason


def test_without_an_amx_buffer_repacking_stays_on() -> None:
    choice = decide(**EPYC_MACHINE)
    assert (choice.enabled, choice.automatic) == (True, True)
    assert "CPU_REPACK" in choice.reason
    # An AMX CPU whose llama.cpp was compiled without AMX kernels offers no AMX buffer: nothing to avoid.
    assert decide(**{**AMX_MACHINE, "buffer_types": ("CPU_REPACK",), "system_info": PLAIN_BUILD}).enabled
    assert decide(**{**EPYC_MACHINE, "buffer_types": ()}).reason.endswith("(llama.cpp's extra buffers: none)")


def test_where_llama_cpp_cannot_be_asked_the_cpu_flags_and_build_features_decide() -> None:
    unasked = {"buffer_types": None}
    assert not decide(**{**AMX_MACHINE, **unasked}).enabled
    assert decide(**{**AMX_MACHINE, **unasked, "system_info": PLAIN_BUILD}).enabled  # no AMX kernels built
    assert decide(**{**EPYC_MACHINE, **unasked, "system_info": AMX_BUILD}).enabled  # CPU without AMX
    assert decide(buffer_types=None, flags=cpu_flags(GRAVITON), system_info="CPU : NEON = 1 | ").enabled


def test_the_option_wins_over_the_environment_which_wins_over_the_machine() -> None:
    assert decide(True, env="off", **AMX_MACHINE) == Repack(True, "--repack")
    assert decide(False, env="on", **EPYC_MACHINE) == Repack(False, "--no-repack")
    assert decide(env="on", **AMX_MACHINE) == Repack(True, "EAD_REPACK=on")
    assert decide(env="0", **EPYC_MACHINE) == Repack(False, "EAD_REPACK=0")
    assert decide(env="auto", **AMX_MACHINE) == decide(**AMX_MACHINE)
    assert decide(env="", **EPYC_MACHINE) == decide(**EPYC_MACHINE)
    with pytest.raises(EadError, match="EAD_REPACK takes on, off or auto, got 'sometimes'") as error:
        decide(env="sometimes", **EPYC_MACHINE)
    assert error.value.exit_code == 2


def test_this_machine_is_asked_through_llama_cpps_own_buffer_list(monkeypatch) -> None:
    names = hardware.extra_buffer_types()
    assert names is not None, "this llama.cpp build should list its CPU extra buffer types"
    system_info = llama_cpp.llama_print_system_info().decode()
    assert ("CPU_REPACK" in names) == ("REPACK = 1" in system_info)
    monkeypatch.delenv("EAD_REPACK", raising=False)
    choice = repack_choice()
    assert choice.automatic and choice.enabled == (not any(name.startswith("AMX") for name in names))


def test_the_decision_sets_llama_cpps_load_parameters() -> None:
    assert model_params(0, Repack(True, "t")).use_extra_bufts is True
    assert model_params(0, Repack(False, "t")).use_extra_bufts is False
    assert model_params(-1, Repack(True, "t")).n_gpu_layers == 0x7FFFFFFF
    assert model_params(3, Repack(False, "t")).n_gpu_layers == 3


def test_a_runner_loads_with_the_option_or_the_environment(tiny_small: Path, monkeypatch) -> None:
    with Runner(tiny_small, name="s", n_ctx=64, n_threads=1, repack=False) as runner:
        assert runner.repack == Repack(False, "--no-repack")
        tokens = runner.tokenize("hello", add_special=True)
        assert runner.sync(tokens, prompt_len=len(tokens), own_tail=False).shape == (runner.n_vocab,)
    monkeypatch.setenv("EAD_REPACK", "off")
    with Runner(tiny_small, name="s", n_ctx=64, n_threads=1) as runner:
        assert runner.repack == Repack(False, "EAD_REPACK=off")
    monkeypatch.setenv("EAD_REPACK", "on")
    with Runner(tiny_small, name="s", n_ctx=64, n_threads=1) as runner:
        assert runner.repack.enabled


def test_generate_takes_no_repack_and_refuses_a_bad_environment_value(tiny_pair) -> None:
    help_text = ead("generate", "--help", env={"COLUMNS": "200"}).stdout.decode()
    assert "--repack" in help_text and "--no-repack" in help_text and "EAD_REPACK=on|off|auto" in help_text
    args = [*pair_args(tiny_pair), "--max-tokens", "4", "--temp", "0", "hello"]
    plain, without = ead("generate", *args), ead("generate", "--no-repack", *args)
    assert plain.returncode == without.returncode == 0, without.stderr
    assert without.stdout == plain.stdout  # the same weights, laid out otherwise: the same greedy text
    bad = {"EAD_REPACK": "maybe"}
    assert_one_line_error(ead("generate", *args, env=bad), 2, "EAD_REPACK takes on, off or auto, got 'maybe'")
    for command in ("chat", "serve"):  # refused at their start, as generate refuses it
        assert_one_line_error(ead(command, *pair_args(tiny_pair), env=bad), 2, "EAD_REPACK takes on, off")
    for word in ("auto", " OFF ", ""):  # the machine's decision, or off, in any case and with spaces
        assert ead("generate", *args, env={"EAD_REPACK": word}).stdout == plain.stdout, word


def test_a_command_says_nothing_of_the_machines_repack_decision(tiny_pair, tmp_path: Path) -> None:
    """Where this machine turns repacking off (an active AMX buffer), a note before every answer had also
    stood as a second line beside each one-line error of a bad input, including a model file's first use
    here (its smoke decode): the set-up's check, ``bench speed`` and the results files say it instead."""
    env = {"EAD_CACHE": str(tmp_path / "cache")}  # every file new to the smoke check
    args = [*pair_args(tiny_pair), "--mode", "ead", "--max-tokens", "2", "--temp", "0", "hello"]
    first, again = ead("generate", *args, env=env), ead("generate", *args, env=env)
    assert first.returncode == again.returncode == 0, first.stderr
    assert first.stderr == again.stderr == b"", first.stderr
    refused = ead("generate", *pair_args(tiny_pair), "-ctk", "q8_0", "hello", env=env)  # the tiny heads: 16
    assert_one_line_error(refused, 2, "a q8_0 K cache stores blocks of 32 values")
    cut = tmp_path / "cut.gguf"  # a new file, checked first here, that then fails to load: the error alone
    cut.write_bytes(tiny_pair[1].read_bytes()[:4096])
    failed = ead("generate", "--small", str(tiny_pair[0]), "--large", str(cut), "hello", env=env)
    assert_one_line_error(failed, 1, "could not load", "cut.gguf")


@pytest.mark.skipif(not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh")
@pytest.mark.parametrize("choice", [Repack(False, "test"), Repack(True, "test")])
def test_the_llama_servers_ead_starts_take_the_same_decision(tiny_small: Path, tmp_path: Path, choice):
    log = tmp_path / "server.log"
    with native.llama_server(tiny_small, ["-c", "256", "-t", "1"], log, repack=choice) as server:
        assert ("--no-repack" in server.process.args) == (not choice.enabled)
        assert server.process.poll() is None  # this build accepts the flag and serves
    assert hardware.server_repack_args(choice) == ([] if choice.enabled else ["--no-repack"])


# ------------------------------------------------------------------------------------------ smoke decode


def crash_command(signal_number: int) -> list[str]:
    """A child that dies by the signal at once: not through Python's own SIGINT handler (a
    KeyboardInterrupt raised later, or not at all where the disposition inherited is to ignore it)."""
    kill = f"signal.signal({signal_number}, signal.SIG_DFL); os.kill(os.getpid(), {signal_number})"
    return [sys.executable, "-c", f"import os, signal; {kill}"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("EAD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_child_killed_by_a_signal_becomes_one_paragraph(tiny_small: Path, cache: Path) -> None:
    on = Repack(True, "no AMX buffer here")
    with pytest.raises(EadError) as error:
        smoke.check_model(tiny_small, repack=on, command=crash_command(signal.SIGSEGV))
    message = str(error.value)
    assert "\n" not in message  # one paragraph, printed as one `error:` line
    assert message.startswith(
        f"llama.cpp crashed (SIGSEGV) while decoding a few test tokens of {tiny_small.name}"
    )
    assert "ggml-org/llama.cpp#20824" in message and "--no-repack" in message and "EAD_REPACK=off" in message
    assert "https://github.com/ggml-org/llama.cpp/issues" in message and "lscpu" in message
    assert not (cache / "smoke").exists()  # a crash is never remembered as a pass
    off = Repack(False, "--no-repack")
    with pytest.raises(EadError, match=r"\(SIGBUS\).*repacking was already off \(--no-repack\)"):
        smoke.check_model(tiny_small, repack=off, command=crash_command(signal.SIGBUS))
    with pytest.raises(EadError, match=r"\(SIGILL\).*compiled for another CPU.*--force-reinstall"):
        smoke.check_model(tiny_small, repack=on, command=crash_command(signal.SIGILL))


def test_a_child_that_fails_without_crashing_or_is_interrupted_is_left_to_the_real_load(
    tiny_small: Path, cache: Path
) -> None:
    on = Repack(True, "t")
    assert smoke.check_model(tiny_small, repack=on, command=[sys.executable, "-c", "raise SystemExit(3)"])
    assert smoke.check_model(tiny_small, repack=on, command=crash_command(signal.SIGINT))  # Ctrl-C, no crash
    assert not (cache / "smoke").exists()


def test_a_real_child_decodes_once_then_the_marker_answers(tiny_small: Path, cache: Path) -> None:
    on = Repack(True, "t")
    assert smoke.check_model(tiny_small, repack=on, threads=1) is True
    assert smoke.check_model(tiny_small, repack=on, threads=1) is False  # remembered: no child
    assert smoke.check_model(tiny_small, repack=Repack(False, "t"), threads=1) is True  # another setting
    assert len(list((cache / "smoke").iterdir())) == 2


def test_a_new_marker_drops_the_markers_of_deleted_model_files(
    tiny_small: Path, tiny_large: Path, cache: Path, tmp_path: Path
) -> None:
    """Each test session's tiny models had left a marker in the real cache (741 of them here): a marker
    whose file is gone goes when the next one is written; a live file's marker stays."""
    on = Repack(True, "t")
    gone = tmp_path / "gone.gguf"
    shutil.copy(tiny_small, gone)
    assert smoke.check_model(gone, repack=on, threads=1) is True
    assert smoke.check_model(tiny_small, repack=on, threads=1) is True
    gone.unlink()
    (cache / "smoke" / "unreadable").write_bytes(b"\xff\xfe")  # not a marker ead wrote: left alone
    assert smoke.check_model(tiny_large, repack=on, threads=1) is True
    kept = sorted(marker.read_text() for marker in (cache / "smoke").iterdir() if marker.name != "unreadable")
    assert kept == sorted(f"{path}\n" for path in (tiny_small, tiny_large))
    assert (cache / "smoke" / "unreadable").exists()
    assert smoke.check_model(tiny_small, repack=on, threads=1) is False  # still remembered


def test_a_cache_that_cannot_be_written_leaves_the_pass_unremembered(tiny_small: Path, cache: Path) -> None:
    """A file where the smoke folder goes (as a read-only ~/.cache would) had ended a passed check in a
    FileExistsError traceback, in setup.sh and in every command's first load."""
    cache.mkdir()
    (cache / "smoke").write_text("")
    on = Repack(True, "t")
    assert smoke.check_model(tiny_small, repack=on, threads=1) is True
    assert smoke.check_model(tiny_small, repack=on, threads=1) is True  # checked again: nowhere to remember


def test_generate_explains_a_llama_cpp_crash_in_one_paragraph(tiny_pair, tmp_path: Path) -> None:
    """A real crash, simulated for real: the smoke child (and only it) kills itself with SIGSEGV on
    start, through a sitecustomize on its path, as llama.cpp's AMX kernel would on its first product."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, signal, sys\nif '--child' in sys.argv:\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), "EAD_REPACK": "on"}
    env["EAD_CACHE"] = str(tmp_path / "cache")
    result = ead("generate", *pair_args(tiny_pair), "--max-tokens", "2", "hello", env=env)
    line = assert_one_line_error(result, 1, "llama.cpp crashed (SIGSEGV)", "large.gguf", "--no-repack")
    assert "ead had it on (EAD_REPACK=on)" in line


@pytest.mark.real
def test_the_demo_pair_generates_in_a_fresh_process_and_the_smoke_module_passes(real_pair) -> None:
    result = ead("generate", "--max-tokens", "8", "--temp", "0", "--threads", "1", "def add(a, b):")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    check = subprocess.run([sys.executable, "-m", "ead_cli.smoke"], capture_output=True, timeout=600)
    assert check.returncode == 0, check.stderr
    assert b"Traceback" not in check.stderr
