"""Ray rollout workers (bat_jax/bicurl/ray_workers.py): how episodes are spread, and (slow) two workers on a
local Ray cluster with the local sandbox backend return the same trajectories and rewards as the in-process
agent loop given the same rows, seed, weights and per-call episodes."""

import dataclasses

import numpy as np
import pytest

from bat_jax.rollout.agent_loop import AgentLoopConfig
from bat_jax.rollout.sampling import SamplingConfig
from bat_jax.bicurl.ray_workers import RayRolloutConfig, assign_episodes

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16)


def test_assign_episodes_spreads_the_k_rollouts_of_a_state():
    shares = assign_episodes(num_requests=2, episodes_per_state=4, num_workers=3)
    assert shares == [[(0, 0), (0, 3), (1, 2)], [(0, 1), (1, 0), (1, 3)], [(0, 2), (1, 1)]]
    assert assign_episodes(1, 2, 4) == [[(0, 0)], [(0, 1)], [], []]
    with pytest.raises(ValueError, match="num_workers >= 1"):
        RayRolloutConfig(num_workers=0)


def test_run_episodes_spreads_the_given_episodes_and_keeps_their_order(monkeypatch):
    """A host's share of a batch goes over the workers by position and comes back in its order.

    Positions 3-7 of 8 episodes (as `multihost.scored_rollouts` hands them) over 2 stand-in workers: position p to
    worker p mod 2, each episode run with its own (i, k) and the batch seed, each handed over once; `run` is the
    whole batch through it.
    """
    import sys
    import types

    from bat_jax.bicurl.ray_workers import RayRollouts

    class Ref:
        def __init__(self, value):
            self.value = value

    fake = types.SimpleNamespace(get=lambda ref: ref.value, wait=lambda refs, num_returns: (refs[-1:], refs[:-1]))
    monkeypatch.setitem(sys.modules, "ray", fake)

    class Worker:
        def __init__(self, name):
            self.name, self.calls = name, []
            self.run = types.SimpleNamespace(remote=self._run)

        def _run(self, episodes, seed):
            self.calls.append([(i, k) for _, i, k in episodes])
            return Ref([f"{request}/{i}.{k}@{seed} on {self.name}" for request, i, k in episodes])

    workers = [Worker("w0"), Worker("w1")]
    rollouts = RayRollouts(workers, AgentLoopConfig(sampling=SamplingConfig(group_size=2), progress=False))
    episodes = [(r, i, k) for i, r in enumerate("abcd") for k in range(2)][3:]
    handed = {}
    got = rollouts.run_episodes(episodes, seed=9, on_trajectory=handed.__setitem__)
    assert got == ["b/1.1@9 on w0", "c/2.0@9 on w1", "c/2.1@9 on w0", "d/3.0@9 on w1", "d/3.1@9 on w0"]
    assert handed == dict(enumerate(got))
    assert workers[0].calls == [[(1, 1), (2, 1), (3, 1)]] and workers[1].calls == [[(2, 0), (3, 0)]]
    whole = rollouts.run(["a", "b"], seed=4)
    assert whole == ["a/0.0@4 on w0", "a/0.1@4 on w1", "b/1.0@4 on w0", "b/1.1@4 on w1"]
    assert [c for w in workers for c in w.calls[1:]] == [[(0, 0), (1, 0)], [(0, 1), (1, 1)]]
    assert [[tuple(x) for x in share] for share in assign_episodes(2, 2, 2)] == [[(0, 0), (1, 0)], [(0, 1), (1, 1)]]


def _same(a, b) -> None:
    """Two trajectories are the same record (receipt timestamps aside)."""
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if field.name == "receipts":
            strip = lambda r: dataclasses.replace(r, started_at=0.0, finished_at=0.0)  # noqa: E731
            x, y = tuple(map(strip, x)), tuple(map(strip, y))
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y, err_msg=field.name)
        else:
            assert x == y, field.name


@pytest.mark.slow
def test_two_ray_workers_match_the_in_process_loop():
    ray = pytest.importorskip("ray")
    from bat_jax.policy import PolicyConfig, build_policy
    from bat_jax.prompts import PromptFormat, rl_request
    from bat_jax.bicurl.engines import EngineConfig
    from bat_jax.bicurl.ray_workers import RayRollouts, WorkerSpec, host_params, install_params
    from bat_jax.stage_bank.row import Provenance, RLRow, RubricSpec, StateRef, Transformation
    from bat_jax.benchmarks.imaging import heldout
    from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
    from bat_jax.benchmarks.imaging.registry import get_track
    from bat_jax.bicurl.reward import rollout_reward

    imaging = ImagingBenchmark()

    rows, starts = [], []
    for seed, focus in ((3, "S1"), (4, "S2")):
        task = heldout.training_task(get_track("vqa"), seed, "success", 0)
        state = task.state()
        syn = Transformation("task_synthesis", "ab" * 32, {"seed": seed, "variant": "success", "template": 0})
        provenance = Provenance("src-1", "cd" * 32, "vqa", "success", (syn,))
        rows.append(RLRow(StateRef.from_state(state, f"states/{state.digest()}.tar"), focus, "do the stage",
                          (RubricSpec("x", "y"),), (), "skill", provenance))
        starts.append(state)
    compact = PromptFormat.of(imaging, "compact")
    requests = [rl_request(row, st, f"st-{i}", compact) for i, (row, st) in enumerate(zip(rows, starts))]
    # lockstep: the engine calls of a share are then the same in the worker and the reference, so the logprobs are
    # equal bit for bit (the continuous schedule batches by timing: the same ids, logprobs up to round-off)
    agent = AgentLoopConfig(sampling=SamplingConfig(group_size=4),
                            max_assistant_turns=2, max_tokens_per_turn=8, max_context_tokens=2048,
                            progress=False, schedule="lockstep")
    spec = WorkerSpec(PolicyConfig(architecture="qwen3", tiny=TINY, prompt_style="compact"), agent, "local",
                      EngineConfig(max_batch=8))
    learner = build_policy(dataclasses.replace(spec.policy, seed=1))  # the weights the workers must take

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rollouts = RayRollouts.start(spec, RayRolloutConfig(num_workers=2, cpus_per_worker=1, start_timeout_s=300,
                                                                worker_env={"JAX_PLATFORMS": "cpu"}))
        assert rollouts.engine.update_weights(learner.model) == 1
        handed = {}
        got = rollouts.run(requests, seed=7, on_trajectory=handed.__setitem__)  # as each worker's share is back
        rollouts.close()
    finally:
        ray.shutdown()

    ref_policy = spec.build_policy()
    loop = spec.build_loop(ref_policy)
    assert install_params(ref_policy, loop.engine, host_params(learner.model)) == 1
    per_call = {}
    for share in assign_episodes(len(requests), agent.sampling.group_size, 2):  # the workers' episodes per call
        per_call.update(zip(share, loop.run_episodes([(requests[i], i, k) for i, k in share], seed=7)))
    want = [per_call[(i, k)] for i in range(len(requests)) for k in range(agent.sampling.group_size)]

    assert [(t.state_id, t.episode) for t in got] == [(f"st-{i}", k) for i in range(2) for k in range(4)]
    assert sorted(handed) == list(range(8)) and all(handed[p] is t for p, t in enumerate(got))
    assert all(t.weight_version == 1 and t.response_tokens >= 1 and not t.infra_error for t in got)
    assert len({t.ids.tobytes() for t in got}) == len(got)  # the 8 episodes sampled differently
    for a, b in zip(got, want):
        _same(a, b)
    rewards = [rollout_reward(rows[i], t, starts[i], imaging).reward for i, t in zip([0] * 4 + [1] * 4, got)]
    assert rewards == [rollout_reward(rows[i], t, starts[i], imaging).reward
                       for i, t in zip([0] * 4 + [1] * 4, want)]
    assert all(r is not None for r in rewards)

    # one in-process call over all 8 episodes (other padding): same tokens, logprobs up to round-off
    whole = loop.run(requests, seed=7)
    for a, b in zip(got, whole):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_gin_include_selects_ray_rollouts_and_the_default_stays_in_process():
    import gin

    from bat_jax import launch
    from bat_jax.bicurl.engines import EngineConfig
    from bat_jax.bicurl.experiment import Components

    launch.parse_gin(["bicurl_tiny.gin"], [])
    assert "ray" not in gin.get_bindings("experiment.Components") and Components().ray is None
    launch.parse_gin(["bicurl_tiny.gin", "rollout/ray_local2.gin"], [])
    assert gin.get_bindings("experiment.Components")["ray"] == RayRolloutConfig(num_workers=2, cpus_per_worker=1.0)
    with pytest.raises(ValueError, match="needs engine kind 'jax'"):
        Components(engine=EngineConfig(kind="vllm"), ray=RayRolloutConfig())
    gin.clear_config()
