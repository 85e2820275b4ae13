"""What the JAX sampler on a mesh holds per device (bat_jax/rollout/mesh_sampler.py `plan_memory`), against
hand-computed bytes of the tiny hybrid model on the 8 fake CPU devices."""

import jax
import pytest

from bat_jax.rollout import mesh_sampler as ms
from bat_jax.rollout.jax_sampler import JaxSampler

from doubles import tiny_model

MiB = 1 << 20


@pytest.mark.parametrize("tensor", [1, 2])
def test_per_device_weights_and_rollout_cache(tensor):
    model = tiny_model("qwen3_5")  # vocab 256, hidden 64; layer 0 DeltaNet, layer 1 attention (2 KV heads x 16)
    sampler = JaxSampler(model, max_context=1024, mesh=ms.SamplerMeshConfig(tensor=tensor))
    plan = sampler.memory_plan(rows=32)
    data = 8 // tensor
    assert (plan.devices, plan.data, plan.tensor, plan.rows_per_device, plan.max_len) == (8, data, tensor,
                                                                                          32 // data, 1024)
    # one row of 1,024 slots: K and V [2 heads, 1024, 16] fp32 (heads split over tensor), slot mask 1,024 bools,
    # DeltaNet conv [3, 2*2*16 + 4*16 = 128] fp32 (channels split) and state [4, 16, 16] fp32 (heads split)
    kv = 2 * 2 * 1024 * 16 * 4 // tensor
    conv, state = 3 * 128 * 4 // tensor, 4 * 16 * 16 * 4 // tensor
    assert plan.per_rollout == kv + 1024 + conv + state
    params = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(sampler._state))
    if tensor == 1:
        assert plan.weights == params  # a full copy per device
    else:
        assert params // 2 < plan.weights < params  # heads / mlp / vocab halves; norms replicated
    assert plan.budget is None and plan.rollouts_fit is None  # CPU: no allocator statistics
    assert "budget unknown" in plan.describe()


def test_refuses_a_budget_without_room_for_one_rollout():
    plan = ms.SamplerMemoryPlan(devices=8, data=8, tensor=1, weights=17_900 * MiB, per_rollout=400 * MiB,
                                rows_per_device=4, max_len=12_288, budget=18_000 * MiB)
    with pytest.raises(ValueError, match="not one full-length rollout fits per device"):
        ms.check_memory(plan)
    ok = ms.check_memory(ms.SamplerMemoryPlan(**{**plan.__dict__, "budget": 20_000 * MiB}))
    assert ok.rollouts_fit == (20_000 - 17_900) // 400 == 5 and "5 fit at once" in ok.describe()
