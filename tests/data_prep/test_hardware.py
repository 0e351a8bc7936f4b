"""The precision decision table: native bf16 or not, explicit settings win, emulation switches."""

from __future__ import annotations

import pytest

from data_prep import hardware as hw

SAPPHIRE = hw.CpuInfo("Intel Xeon (Sapphire Rapids)", frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni"}), "x86_64")
COOPER = hw.CpuInfo("Intel Xeon (Cooper Lake)", frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}), "x86_64")
SKYLAKE = hw.CpuInfo("Intel Xeon (Skylake)", frozenset({"avx2", "avx512f"}), "x86_64")
EPYC_ZEN2 = hw.CpuInfo("AMD EPYC", frozenset({"avx2", "fma"}), "x86_64")
GRAVITON3 = hw.CpuInfo("Neoverse-V1", frozenset({"fp", "asimd", "bf16", "i8mm"}), "aarch64")
GRAVITON2 = hw.CpuInfo("Neoverse-N1", frozenset({"fp", "asimd"}), "aarch64")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for k in (hw.OVERRIDE_ENV, "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(k, raising=False)


@pytest.mark.parametrize("info, native, isa", [
    (SAPPHIRE, True, "amx"), (COOPER, True, "avx512_bf16"), (SKYLAKE, False, "avx512"),
    (EPYC_ZEN2, False, "avx2"), (GRAVITON3, True, "arm-bf16"), (GRAVITON2, False, "arm"),
])
def test_native_bf16_from_cpu_flags(info, native, isa):
    ok, why = hw.native_bf16("cpu", info)
    assert ok is native and why
    assert info.isa == isa


def test_auto_follows_the_hardware(monkeypatch):
    monkeypatch.setattr(hw, "cpu_info", lambda: SAPPHIRE)
    assert hw.resolve_dtype("auto")[0] == "bfloat16"
    assert hw.resolve_autocast("auto")[0] is True
    monkeypatch.setattr(hw, "cpu_info", lambda: EPYC_ZEN2)
    assert hw.resolve_dtype("auto")[0] == "float32"
    assert hw.resolve_autocast("auto")[0] is False
    assert "avx2" in hw.resolve_dtype("auto")[1]


@pytest.mark.parametrize("setting, want", [(True, True), ("true", True), ("TRUE", True), (False, False),
                                           ("false", False), ("0", False)])
def test_explicit_autocast_wins_over_hardware(monkeypatch, setting, want):
    for info in (SAPPHIRE, EPYC_ZEN2):
        monkeypatch.setattr(hw, "cpu_info", lambda info=info: info)
        assert hw.resolve_autocast(setting)[0] is want


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_explicit_dtype_wins_over_hardware(monkeypatch, dtype):
    for info in (SAPPHIRE, EPYC_ZEN2):
        monkeypatch.setattr(hw, "cpu_info", lambda info=info: info)
        assert hw.resolve_dtype(dtype)[0] == dtype


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="bf16_autocast"):
        hw.resolve_autocast("maybe")
    with pytest.raises(ValueError, match="dtype"):
        hw.resolve_dtype("bf16")


@pytest.mark.parametrize("env, value", [(hw.OVERRIDE_ENV, "0"), ("ATEN_CPU_CAPABILITY", "avx2"),
                                        ("ONEDNN_MAX_CPU_ISA", "AVX2"), ("ATEN_CPU_CAPABILITY", "default")])
def test_emulation_switches_make_auto_answer_no(monkeypatch, env, value):
    monkeypatch.setattr(hw, "cpu_info", lambda: SAPPHIRE)
    monkeypatch.setenv(env, value)
    ok, why = hw.native_bf16("cpu")
    assert ok is False and env in why
    assert hw.resolve_dtype("auto")[0] == "float32"
    assert hw.resolve_autocast("auto")[0] is False


def test_override_can_also_force_yes(monkeypatch):
    monkeypatch.setattr(hw, "cpu_info", lambda: EPYC_ZEN2)
    monkeypatch.setenv(hw.OVERRIDE_ENV, "1")
    assert hw.native_bf16("cpu")[0] is True


def test_onednn_avx512_cap_is_not_an_emulation(monkeypatch):
    monkeypatch.setattr(hw, "cpu_info", lambda: SAPPHIRE)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert hw.native_bf16("cpu")[0] is True



@pytest.mark.parametrize("env, capped", [
    ({}, None), ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, None), ({"ONEDNN_MAX_CPU_ISA": "ALL"}, None),
    ({hw.OVERRIDE_ENV: "0"}, None),  # the dtype switch alone leaves the kernels as they are
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "ONEDNN_MAX_CPU_ISA=AVX2"),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16"),
    ({"ATEN_CPU_CAPABILITY": "avx2"}, "ATEN_CPU_CAPABILITY=avx2"),
])
def test_amx_is_hidden_under_an_isa_cap_only(monkeypatch, env, capped):
    """Under a cap that forbids AMX, torch reports no AMX tiles (what vLLM's CPU kernels ask), so
    an emulated AVX2 run takes a real AVX2 host's kernels; without one, torch's answer stands."""
    import torch

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)  # as on an AMX host
    assert hw.amx_capped() == capped
    assert hw.hide_amx() is (capped is not None)
    assert torch.cpu._is_amx_tile_supported() is (capped is None)

def test_encoder_precision_int8_only_with_vnni(monkeypatch):
    monkeypatch.delenv(hw.ENCODER_PRECISION_ENV, raising=False)  # the rule itself, not a forced run
    monkeypatch.setattr(hw, "cpu_info", lambda: SAPPHIRE)
    assert hw.resolve_encoder_precision("auto", "onnx")[0] == "int8"
    assert hw.resolve_encoder_precision("auto", "torch")[0] == "fp32"
    monkeypatch.setattr(hw, "cpu_info", lambda: EPYC_ZEN2)
    assert hw.resolve_encoder_precision("auto", "onnx")[0] == "fp32"
    assert hw.resolve_encoder_precision("int8", "onnx")[0] == "int8"


def test_encoder_precision_on_cuda_is_fp16_whatever_the_cpu(monkeypatch):
    monkeypatch.delenv(hw.ENCODER_PRECISION_ENV, raising=False)
    for info in (SAPPHIRE, EPYC_ZEN2):
        monkeypatch.setattr(hw, "cpu_info", lambda info=info: info)
        assert hw.resolve_encoder_precision("auto", "torch", "cuda")[0] == "fp16"
        assert hw.resolve_encoder_precision("auto", "torch", "cuda:1")[0] == "fp16"
        assert hw.resolve_encoder_precision("fp32", "torch", "cuda")[0] == "fp32"


def test_encoder_precision_can_be_forced_for_auto_only(monkeypatch):
    """AGENT_RL_ENCODER_PRECISION runs the suite under another host kind's choice; explicit
    settings still win, and a value that is not a precision is refused with the allowed ones."""
    monkeypatch.setattr(hw, "cpu_info", lambda: SAPPHIRE)
    monkeypatch.setenv(hw.ENCODER_PRECISION_ENV, "fp32")
    assert hw.resolve_encoder_precision("auto", "onnx") == ("fp32", "AGENT_RL_ENCODER_PRECISION=fp32")
    assert hw.resolve_encoder_precision("int8", "onnx")[0] == "int8"
    monkeypatch.setenv(hw.ENCODER_PRECISION_ENV, "bf16")
    from data_prep.encoder import describe_encoder

    assert (describe_encoder()["backend"], describe_encoder()["precision"]) == ("torch", "bf16")
    assert describe_encoder(precision="fp32")["backend"] == "onnx"
    monkeypatch.setenv(hw.ENCODER_PRECISION_ENV, "int4")
    with pytest.raises(ValueError, match="AGENT_RL_ENCODER_PRECISION='int4': expected one of fp32, int8"):
        hw.resolve_encoder_precision("auto", "onnx")


def test_hardware_line_names_cpu_isa_and_choices(monkeypatch):
    monkeypatch.setenv(hw.OVERRIDE_ENV, "0")
    line = hw.hardware_line(engine="float32 (auto)")
    info = hw.cpu_info()
    assert line.startswith("[hardware] ") and info.model in line and f"isa={info.isa}" in line
    assert "native_bf16=no" in line and "engine=float32 (auto)" in line and "emulating=" in line
    d = hw.hardware_info(engine="float32")
    assert d["dtypes"] == {"engine": "float32"} and d["threads"] >= 1 and d["native_bf16"] is False


def test_a_line_without_torch_facts_does_not_import_torch():
    """A command whose work never loads torch (a data conversion, a BM25 server) must not pay its
    import (2-3 s of a 2-core host) for the hardware line; the line says torch=unused."""
    from fresh import run_fresh

    out = run_fresh("import sys; from data_prep.hardware import hardware_line; line = hardware_line(torch_facts=False); "
                    "assert 'torch' not in sys.modules, 'torch imported'; print(line)")
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("[hardware] cpu=") and " torch=unused native_bf16=" in line and "threads=" not in line
    assert hw.hardware_line().count(" torch=unused") == 0  # the default asks torch


def test_matmul_probe_measures_something():
    flops = hw.matmul_flops("float32", n=128, seconds=0.05)
    assert 1e6 < flops < 1e15


def test_passive_threads_sets_a_default_only(monkeypatch):
    """Idle OpenMP threads must sleep, not spin, on cores shared with a trainer (issue #15);
    a value the user set is kept."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    hw.passive_threads()
    import os

    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    hw.passive_threads()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_a_processs_memory_is_read_from_its_proc_status():
    """This process's resident memory, its peak at least that, and a growth of 64 MiB seen in it
    (touched pages); a process or key that is not there is nan, not an error mid-benchmark."""
    import math
    import subprocess
    import sys

    from data_prep.hardware import proc_status_kib

    code = ("from data_prep.hardware import proc_status_kib as k; a = k('VmRSS'); "
            "b = bytearray(64 << 20); print(a, k('VmRSS'), k('VmHWM'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    before, after, peak = map(float, out)
    assert after - before >= 60 * 1024 and peak >= after > 0
    assert math.isnan(proc_status_kib("VmRSS", 2**22 + 12345)) and math.isnan(proc_status_kib("NoSuchKey"))
