"""The CPU a record names: enough to tell two machines of one marketing name apart."""
from specbench.environment import cpu_signature, environment, identity_of_cpuinfo

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni avx512_bf16 avx512vl

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: another name the first block wins over
"""
OLD_XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni
"""


def test_family_model_and_the_speed_flags_are_read_from_the_first_processor():
    cpu = identity_of_cpuinfo(ZEN4)
    assert (cpu["name"], cpu["vendor"], cpu["family"], cpu["model"], cpu["stepping"]) == (
        "AMD EPYC", "AuthenticAMD", "25", "17", "1")
    assert cpu["flags"] == ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"]  # SPEED_FLAGS' order, no others
    signature = cpu_signature(cpu)
    assert signature.startswith("AMD EPYC (family 25 model 17; avx2 fma avx512f avx512_vnni avx512_bf16; torch ")
    assert "avx512_bf16" not in cpu_signature(identity_of_cpuinfo(OLD_XEON))  # the flag that splits bf16 speed


def test_every_record_carries_the_cpu_even_on_a_gpu_run():
    import torch
    env = environment(torch.device("cpu"))
    assert env["cpu"]["name"] and env["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()
