"""What the CPU this runs on can do, read from the machine (never assumed): its model and vendor, and
its matrix extensions (AMX tiles, AVX512-BF16 and -FP16, AVX-VNNI), which decide whether bfloat16
compute is fast here. Machines of one workplace differ (Intel Xeon with AMX, AMD EPYC with or
without AVX512-BF16), so a setting that pays on one is chosen per machine from these facts."""

from __future__ import annotations

import platform
from functools import cache

# the /proc/cpuinfo flags that speed up low-precision matrix products
MATRIX_FLAGS = ("amx_bf16", "amx_fp16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_fp16", "avx512_vnni",
                "avx_vnni")
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # bfloat16 products in hardware


@cache
def cpu_facts(cpuinfo: str = "/proc/cpuinfo") -> dict[str, object]:
    """{"model", "vendor", "matrix_extensions": the MATRIX_FLAGS the first processor lists} (on a
    system without /proc/cpuinfo: the platform's processor name, no extensions)."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name") or platform.processor() or platform.machine(),
            "vendor": fields.get("vendor_id", ""), "matrix_extensions": [f for f in MATRIX_FLAGS if f in flags]}


def fast_bf16(facts: dict[str, object] | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AMX-BF16 or AVX512-BF16)."""
    extensions = (facts or cpu_facts())["matrix_extensions"]
    return any(flag in extensions for flag in BF16_FLAGS)
