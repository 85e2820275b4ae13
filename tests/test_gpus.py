"""This process's GPUs by CUDA ordinal and UUID (bat_jax/rollout/gpus.py): `nvidia-smi -L` parsed, a restricted
`CUDA_VISIBLE_DEVICES` honoured, torch's own view first; the replicas pinned by UUID. No GPU needed."""

import pytest

from bat_jax.rollout import gpus as gpus_lib


def test_gpus_by_uuid_honour_a_restricted_cuda_visible_devices():
    smi = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa0000-0000)\n"
           "  MIG 1g.10gb     Device  0: (UUID: MIG-ffff)\n"
           "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb1111-1111)\n"
           "GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-cccc2222-2222)\n"
           "GPU 3: NVIDIA H100 80GB HBM3 (UUID: GPU-dddd3333-3333)\n")
    physical = gpus_lib.parse_nvidia_smi(smi)
    assert [p[0] for p in physical] == [0, 1, 2, 3] and physical[2][2] == "GPU-cccc2222-2222"
    none = lambda: None  # noqa: E731 — no torch CUDA: the driver's list is filtered by CUDA_VISIBLE_DEVICES
    seen = gpus_lib.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, lambda: physical, none)
    assert [(g.ordinal, g.uuid) for g in seen] == [(0, "GPU-cccc2222-2222"), (1, "GPU-dddd3333-3333")]
    mixed = gpus_lib.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-dddd,1, 7,0"}, lambda: physical, none)
    assert [g.uuid for g in mixed] == ["GPU-dddd3333-3333", "GPU-bbbb1111-1111"]  # 7 names no GPU: the list ends
    assert len(gpus_lib.visible_gpus({}, lambda: physical, none)) == 4
    with pytest.raises(ValueError, match="matches 2 GPUs"):
        gpus_lib.resolve_visible(physical + [(4, "x", "GPU-dddd9999")], "GPU-dddd")
    # torch's own view wins when CUDA is available (its ordinals are the ones JAX and vLLM use)
    assert gpus_lib.visible_gpus({}, lambda: physical, lambda: [("H100", "GPU-eeee")])[0].uuid == "GPU-eeee"
    from bat_jax.rollout.vllm_replicas import pin_gpus, replica_env

    pinned = pin_gpus(2, seen)
    assert [replica_env(i, 2, pinned)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["GPU-cccc2222-2222",
                                                                                     "GPU-dddd3333-3333"]
    with pytest.raises(ValueError, match="3 replicas but only GPUs"):
        pin_gpus(3, seen)


# vLLM 0.19.1 (the CUDA-12 route's pin, pyproject's `gpu-cuda12` extra) reads each CUDA_VISIBLE_DEVICES entry with
# int(): `Platform.device_id_to_physical_device_id` in vllm/platforms/interface.py splits the variable on commas,
# takes entry `device_id` and returns int() of it, with no UUID branch. Read in vllm-project/vllm at commit
# c77619938d1c (main before 0.15); vLLM 0.20.1 still raises from that int() (interface.py line 230, traceback in
# vllm-project/vllm#41848, and the diff context of vllm-project/vllm#41850); v0.22.0 still has it and v0.24.0 resolves
# UUIDs (noonghunna/club-3090#750, which inspected both images). 0.19.1 lies between c77619938d1c and 0.20.1.
def _vllm_0_19_1_physical_id(environ, device_id):
    """vLLM 0.19.1's parsing, restated (above): the entry as an int."""
    return int(environ["CUDA_VISIBLE_DEVICES"].split(",")[device_id])


def test_replicas_pinned_in_the_form_each_routes_vllm_parses():
    """The CUDA-12 route (vLLM 0.19.1) gets the NVML index with PCI bus order, which its int() parsing reads as the
    right physical GPU (a UUID would kill it at start); the CUDA-13 route (0.33) gets the UUID."""
    from bat_jax.rollout.vllm_replicas import replica_env

    physical = [(i, "H200", f"GPU-{i:04x}aaaa-0000") for i in range(8)]
    gpus = gpus_lib.visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, lambda: physical, lambda: None)
    assert [(g.ordinal, g.index) for g in gpus] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # torch's view (CUDA available): the NVML index comes from the driver's list by UUID
    seen = gpus_lib.visible_gpus({}, lambda: physical, lambda: [("H200", "GPU-0006aaaa-0000")])
    assert (seen[0].ordinal, seen[0].index) == (0, 6)
    old = replica_env(2, 4, gpus, "0.19.1")
    assert old == {"CUDA_VISIBLE_DEVICES": "6", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "JAX_PLATFORMS": "cpu"}
    assert _vllm_0_19_1_physical_id(old, 0) == 6  # NVML index 6 = the replica's GPU
    with pytest.raises(ValueError, match="invalid literal for int"):  # what the UUID pin did to every replica
        _vllm_0_19_1_physical_id({"CUDA_VISIBLE_DEVICES": gpus[2].uuid}, 0)
    assert replica_env(2, 4, gpus, "0.22.0")["CUDA_VISIBLE_DEVICES"] == "6"
    for new in ("0.24.0", "0.33.0", "0.32.0+cpu"):
        assert replica_env(2, 4, gpus, new) == {"CUDA_VISIBLE_DEVICES": "GPU-0006aaaa-0000", "JAX_PLATFORMS": "cpu"}
    with pytest.raises(ValueError, match=r"vLLM 0.19.1 reads CUDA_VISIBLE_DEVICES as device indices.*GPU-eeee"):
        gpus_lib.pin_env(gpus_lib.Gpu(0, "GPU-eeee"), "0.19.1")  # no NVML index known


@pytest.mark.vllm
def test_installed_vllm_resolves_the_replica_pin(monkeypatch):
    """The installed vLLM's own parsing (its `Platform.device_id_to_physical_device_id` and, read from its
    platforms/cuda.py, `NvmlCudaPlatform.device_control_id_to_physical_device_id` over a stand-in NVML) maps the
    pin `replica_env` gives for this vLLM to the replica's physical GPU, and the index form too."""
    import ast
    import importlib.util
    import types
    from pathlib import Path

    pytest.importorskip("vllm")
    from vllm.platforms.interface import Platform

    from bat_jax.rollout.vllm_replicas import replica_env

    source = Path(importlib.util.find_spec("vllm").origin).parent / "platforms" / "cuda.py"
    tree = ast.parse(source.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NvmlCudaPlatform")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef)
              and n.name == "device_control_id_to_physical_device_id")
    fn.decorator_list = []  # @classmethod and its NVML context (our stand-in needs no init)
    nvml_index = {"GPU-0006aaaa-0000": 6}
    pynvml = types.SimpleNamespace(nvmlDeviceGetHandleByUUID=lambda uuid: ("handle", nvml_index[uuid]),
                                   nvmlDeviceGetIndex=lambda handle: handle[1])
    namespace = {"pynvml": pynvml}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(source), "exec"), namespace)

    class Cuda(Platform):
        device_control_env_var = "CUDA_VISIBLE_DEVICES"
        device_control_id_to_physical_device_id = classmethod(namespace[fn.name])

    gpu = gpus_lib.Gpu(2, "GPU-0006aaaa-0000", "H200", 6)
    version = gpus_lib.installed_vllm()
    for env in (replica_env(0, 1, [gpu]), replica_env(0, 1, [gpu], "0.19.1")):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env["CUDA_VISIBLE_DEVICES"])
        assert Cuda.device_id_to_physical_device_id(0) == 6, (version, env)
        assert Cuda.logical_device_id_to_visible_device_id(0) == 0
    assert replica_env(0, 1, [gpu])["CUDA_VISIBLE_DEVICES"] == "GPU-0006aaaa-0000"  # this vLLM (0.32) takes UUIDs
