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
