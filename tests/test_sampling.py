"""The run's one sampling configuration (rollout/sampling.py): validated once, the one place K and the transform are
bound, and what one binding of it reaches: the agent loop's engine calls and GRPO's logprobs (ratios start at 1)."""

import dataclasses

import gin
import numpy as np
import pytest

from bat_jax.rollout.engine import SamplingParams
from bat_jax.rollout.sampling import SamplingConfig
from doubles import ACTION, REQUEST, SAMPLER_KW, ScriptedEngine, scripted_agent_loop, tiny_model


def test_each_field_is_validated_naming_it():
    for kwargs, field in (({"group_size": 0}, "group_size"), ({"temperature": -0.1}, "temperature"),
                          ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k")):
        with pytest.raises(ValueError, match=rf"SamplingConfig\.{field} must be"):
            SamplingConfig(**kwargs)
    assert SamplingConfig() == SamplingConfig(group_size=4, temperature=0.7, top_p=1.0, top_k=0)  # paper: K 4, T 0.7


def test_params_carry_the_transform_into_one_engine_call():
    config = SamplingConfig(group_size=3, temperature=0.6, top_p=0.8, top_k=20)
    assert config.transform == (0.6, 0.8, 20)
    assert config.params(16, (2, 1)) == SamplingParams(temperature=0.6, top_p=0.8, top_k=20, max_new_tokens=16,
                                                       stop_token_ids=(2, 1))


def test_components_hand_their_one_object_to_the_agent_loop_and_grpo():
    """`Components.sampling` is the only binding: construction puts that same object into the agent loop's and
    GRPO's configs, whatever they held (no second copy that could disagree)."""
    from bat_jax.bicurl.experiment import Components
    from bat_jax.bicurl.grpo_round import GRPOBlockConfig
    from bat_jax.learn.grpo import GRPOConfig
    from bat_jax.rollout.agent_loop import AgentLoopConfig

    one = SamplingConfig(group_size=2, temperature=0.9, top_k=5)
    comps = Components(sampling=one, agent=AgentLoopConfig(max_assistant_turns=3),
                       block=GRPOBlockConfig(grpo=GRPOConfig(kl_coef=0.0)))
    assert comps.agent.sampling is one and comps.block.grpo.sampling is one
    assert (comps.agent.max_assistant_turns, comps.block.grpo.kl_coef) == (3, 0.0)  # the rest of each config kept
    # a sampling set on the loop's config alone is used, everywhere (never dropped for the default)
    stray = Components(agent=AgentLoopConfig(sampling=one))
    assert stray.sampling is stray.agent.sampling is stray.block.grpo.sampling is one
    equal = Components(block=GRPOBlockConfig(grpo=GRPOConfig(sampling=one)), sampling=one)
    assert equal.agent.sampling is one  # equal bindings agree


def test_a_loop_sampling_that_disagrees_with_the_runs_is_refused_naming_both():
    from bat_jax.bicurl.experiment import Components
    from bat_jax.errors import ConfigValueError
    from bat_jax.rollout.agent_loop import AgentLoopConfig

    with pytest.raises(ConfigValueError) as e:
        Components(sampling=SamplingConfig(group_size=2),
                   agent=AgentLoopConfig(sampling=SamplingConfig(temperature=0.9)))
    assert str(e.value) == (
        "the run has one K and sampling temperature, bound on sampling.SamplingConfig; these disagree: "
        "sampling.SamplingConfig = SamplingConfig(group_size=2, temperature=0.7, top_p=1.0, top_k=0); "
        "agent_loop.AgentLoopConfig.sampling = SamplingConfig(group_size=4, temperature=0.9, top_p=1.0, top_k=0)")


def test_one_temperature_binding_reaches_the_loops_engine_calls_and_grpos_logprobs():
    """`sampling.SamplingConfig.temperature = 0.9` over the tiny default: the agent loop asks its engine for T 0.9
    and K = 2 episodes per row; a JAX sampler given the loop's own SamplingParams draws tokens whose learner
    logprobs under the run's GRPOConfig equal the sampled ones (ratios 1), where GRPO's default T 0.7 would not."""
    from bat_jax import launch
    from bat_jax.bicurl import experiment
    from bat_jax.learn import grpo
    from bat_jax.learn.learner import Learner
    from bat_jax.models.mesh import MeshConfig
    from bat_jax.rollout.jax_sampler import JaxSampler

    try:
        launch.parse_gin(["bicurl_tiny.gin"], ["sampling.SamplingConfig.temperature = 0.9",
                                               "sampling.SamplingConfig.group_size = 2"])
        comps = gin.get_configurable(experiment.Components)()
    finally:
        gin.clear_config(clear_constants=True)
    assert comps.sampling == SamplingConfig(group_size=2, temperature=0.9)

    class Recording(ScriptedEngine):
        def generate(self, prompts, params, **kw):
            self.params = getattr(self, "params", []) + [params]
            return super().generate(prompts, params, **kw)

    engine = Recording([ACTION])
    agent = dataclasses.replace(comps.agent, max_assistant_turns=1, max_tokens_per_turn=8, progress=False)
    trajectories = scripted_agent_loop(engine, agent).run([REQUEST], seed=0)
    assert len(trajectories) == 2  # K from the one binding
    assert {(p.temperature, p.top_p, p.top_k) for p in engine.params} == {(0.9, 1.0, 0)}

    model = tiny_model("qwen3")
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    params = dataclasses.replace(engine.params[0], stop_token_ids=(), seed=3)  # no early stop: 8 tokens a row
    out = JaxSampler(model, **SAMPLER_KW).generate(prompts, params)
    ids = np.asarray([p + c.token_ids.tolist() for p, c in zip(prompts, out)], np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    sampled = np.stack([c.logprobs for c in out])
    learner = Learner(model, MeshConfig(data=1, fsdp=1, tensor=1))
    recomputed = learner.logprobs(learner.params, batch, comps.block.grpo)[:, 4:]
    np.testing.assert_allclose(np.exp(recomputed - sampled), 1.0, atol=1e-4)  # the first ratios: exactly 1
    at_default = learner.logprobs(learner.params, batch, grpo.GRPOConfig())[:, 4:]
    assert np.abs(at_default - sampled).max() > 1e-2  # a second, unbound temperature would have broken them
