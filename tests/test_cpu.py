"""The CPU's facts are read from /proc/cpuinfo, not assumed: its model, vendor and matrix extensions,
and whether bfloat16 products run in hardware there (two CPU families this project runs on)."""

from race_core.cpu import cpu_facts, fast_bf16

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_fp16 avx512_vnni amx_bf16 amx_tile amx_int8

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu
"""
EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx2 fma
"""


def test_the_matrix_extensions_come_from_cpuinfo(tmp_path):
    (tmp_path / "xeon").write_text(XEON)
    (tmp_path / "epyc").write_text(EPYC)
    xeon, epyc = cpu_facts(str(tmp_path / "xeon")), cpu_facts(str(tmp_path / "epyc"))
    assert xeon == {"model": "Intel(R) Xeon(R) Platinum 8480+", "vendor": "GenuineIntel",
                    "matrix_extensions": ["amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_fp16",
                                          "avx512_vnni"]}
    assert epyc == {"model": "AMD EPYC 7B13", "vendor": "AuthenticAMD", "matrix_extensions": []}
    assert fast_bf16(xeon) and not fast_bf16(epyc)
    assert cpu_facts(str(tmp_path / "missing"))["matrix_extensions"] == []
    here = cpu_facts()  # this machine: whatever it is, the same answer twice
    assert here == cpu_facts() and fast_bf16(here) == any(f in here["matrix_extensions"] for f in ("amx_bf16",
                                                                                                   "avx512_bf16"))
