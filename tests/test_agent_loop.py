"""Tests of the multi-turn agent loop (rollout/agent_loop.py): limits and truncation, observations from parse
and sandbox errors, unscored infrastructure failures, concurrency with real local sandboxes and the real
chat template, and (slow) the JAX sampler in the loop with the learner reproducing the recorded logprobs."""

import dataclasses

import numpy as np
import pytest

from bat_jax.models.chat import render_action
from bat_jax.rollout import trajectory as tj
from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig, cut_observation
from bat_jax.rollout.sampling import SamplingConfig
from bat_jax.rollout.engine import Completion
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import Observation, SandboxState
from doubles import (ACTION, EOT, IM_START, REQUEST, FakeSandbox, RealCallEngine, ScriptedEngine, StubBuilder,
                     WordTokenizer)


def _loop(engine, config, sandbox_factory=FakeSandbox, **kw):
    tok = WordTokenizer()
    return AgentLoop(engine, lambda: StubBuilder(tok), sandbox_factory, config, extra_stop_ids=(IM_START,), **kw)


@pytest.mark.parametrize("obey_budget", [True, False])
def test_response_budget_cuts_whole_trajectory(obey_budget):
    """Budget 8 tokens over the trajectory; 3 actions of 6 tokens, observations of 4 tokens ('hi [exit code 0]'):
    action 1 and its observation are kept, action 2 is cut after 2 tokens, nothing after it."""
    engine = ScriptedEngine([ACTION] * 3, obey_budget=obey_budget)
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=1),
                             max_response_tokens=8, max_tokens_per_turn=8, progress=False)
    (traj,) = _loop(engine, config).run([REQUEST])
    assert engine.calls == [[8], [2]]
    p = traj.prompt_len
    assert p == 2  # 'skill brief'
    obs = traj.ids[p + 6:p + 10]
    assert len(traj.ids) == len(traj.loss_mask) == len(traj.logprobs) == p + 6 + 4 + 2 + 1
    np.testing.assert_array_equal(traj.ids[p:p + 6], ACTION)
    np.testing.assert_array_equal(traj.ids[p + 10:], [10, 11, EOT])  # 2 sampled tokens + end-of-turn glue
    np.testing.assert_array_equal(traj.loss_mask, [0] * p + [1] * 6 + [0] * 4 + [1] * 2 + [0])
    np.testing.assert_allclose(traj.logprobs, [0] * p + [-0.1, -0.11, -0.12, -0.13, -0.14, -0.15] + [0] * 4
                               + [-0.2, -0.21] + [0], atol=1e-6)
    assert len(obs) == 4 and traj.messages[-2]["content"] == "hi\n\n[exit code 0]"
    assert traj.finish_reason == tj.FINISH_MAX_RESPONSE_TOKENS and traj.truncated
    assert (traj.num_turns, traj.num_tool_calls, traj.response_tokens) == (2, 1, 8)
    assert traj.state_id == "row-1" and traj.stage == "S3" and traj.weight_version == 3 and traj.scored


def test_turn_and_tool_limits_parse_errors_and_observation_cut():
    # turn 1: no tool call -> parse-error observation; turn 2: a call -> observation cut to 5 chars; turn 3:
    # another call, but only 1 tool call is allowed
    engine = ScriptedEngine([[11, 11, EOT], ACTION, ACTION])
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=2),
                             max_tool_calls=1, max_observation_chars=5, progress=False)
    trajs = _loop(engine, config).run([REQUEST])
    assert [t.episode for t in trajs] == [0, 1]
    traj = trajs[0]
    assert traj.finish_reason == tj.FINISH_MAX_TOOL_CALLS and not traj.truncated
    assert (traj.num_turns, traj.num_tool_calls, traj.response_tokens) == (3, 1, 15)
    assert traj.messages[3]["content"].startswith("[tool\n...[observation truncated: ")  # parse-error text, cut
    assert traj.messages[5]["content"] == cut_observation("hi\n\n[exit code 0]", 5)
    assert traj.messages[5]["content"] == "hi\n\n[\n...[observation truncated: 12 more chars]"
    # turn limit: the third turn's call is executed, then the episode ends without an observation
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=1), max_assistant_turns=3, progress=False)
    (traj,) = _loop(ScriptedEngine([[11, 11, EOT], ACTION, ACTION]), config).run([REQUEST])
    assert traj.finish_reason == tj.FINISH_MAX_TURNS and traj.num_tool_calls == 2 and len(traj.receipts) == 2
    assert traj.messages[-1]["role"] == "assistant"
    # a stage row's request: its teacher's turns + stage_turn_slack, within max_assistant_turns; unset: no cap
    stage = dataclasses.replace(REQUEST, teacher_turns=1)
    for slack, turns in ((0, 1), (1, 2), (None, 3), (7, 3)):
        config = AgentLoopConfig(sampling=SamplingConfig(group_size=1), max_assistant_turns=3, stage_turn_slack=slack,
                                 progress=False)
        (traj,) = _loop(ScriptedEngine([ACTION] * 3), config).run([stage])
        assert (traj.finish_reason, traj.num_turns) == (tj.FINISH_MAX_TURNS, turns), slack
        (traj,) = _loop(ScriptedEngine([ACTION] * 3), config).run([REQUEST])  # no teacher turns: E2E, evaluation
        assert traj.num_turns == 3
    with pytest.raises(ValueError, match="stage_turn_slack"):
        AgentLoopConfig(stage_turn_slack=-1)
    # end_on_no_tool_call
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=1), end_on_no_tool_call=True, progress=False)
    (traj,) = _loop(ScriptedEngine([[11, 11, EOT]]), config).run([REQUEST])
    assert traj.finish_reason == tj.FINISH_NO_TOOL_CALL and traj.num_turns == 1


def test_submit_sandbox_errors_and_infra_failures():
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=3), progress=False)
    released = []  # a pool's release hook gets every sandbox back once
    trajs = _loop(ScriptedEngine([ACTION, [12, EOT]]), config, sandbox_release=released.append).run([REQUEST])
    assert len(released) == 3 and len({id(sb) for sb in released}) == 3
    traj = trajs[0]
    assert traj.finish_reason == tj.FINISH_SUBMITTED and traj.submitted == "out.txt"
    assert (traj.num_turns, traj.num_tool_calls) == (2, 2)
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=1), progress=False)
    # a sandbox call raising becomes an observation and is counted
    (traj,) = _loop(ScriptedEngine([ACTION, [12, EOT]]), config,
                    lambda s: FakeSandbox(s, fail=True)).run([REQUEST])
    assert traj.sandbox_errors == 1 and traj.finish_reason == tj.FINISH_SUBMITTED
    assert traj.messages[3]["content"] == "[sandbox error] ConnectionError: docker daemon went away"
    # a sandbox that cannot be created: unscored (null, not zero), no model call made for it

    def broken(state):
        raise RuntimeError("no image")

    engine = ScriptedEngine([ACTION])
    (traj,) = _loop(engine, config, broken).run([REQUEST])
    assert traj.finish_reason == tj.FINISH_SANDBOX_ERROR and not traj.scored and "no image" in traj.infra_error
    assert engine.calls == [] and traj.num_turns == 0
    # a turn that opens a new turn at once (<|im_start|>) cannot be an assistant turn
    (traj,) = _loop(ScriptedEngine([[IM_START]]), config).run([REQUEST])
    assert traj.finish_reason == tj.FINISH_INVALID_TURN and traj.response_tokens == 0


@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_real_template_local_sandboxes_concurrent(schedule):
    """2 rows x K=2 episodes with the tiny tokenizer's Qwen3.5 template and LocalSandbox: write a file, then
    submit it. Token in/token out: sampled ids appear verbatim with mask 1 and their logprobs. Lockstep makes
    one model call per turn over all 4 episodes; continuous calls the model on whatever episodes are ready."""
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.models.tokenizer import load_tiny_tokenizer
    from bat_jax.sandbox.local import LocalSandbox

    tok = load_tiny_tokenizer()
    eot, im_start = tok.convert_tokens_to_ids(["<|im_end|>", "<|im_start|>"])
    write = Action("I write the result.", "execute_code", {"language": "bash", "code": "echo 42 > out.txt"})
    submit = Action("Done.", "submit", {"path": "out.txt"})
    turns = [tok.encode(render_action(a, "qwen3_5"), add_special_tokens=False) + [eot] for a in (write, submit)]

    class TurnEngine(ScriptedEngine):
        def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
            assert params.stop_token_ids[0] == eot
            self.calls.append(list(max_new_tokens))
            out = []
            for prompt in prompts:  # system, user, generation prompt, then 2 turn openings per step
                ids = turns[(sum(1 for t in prompt if t == im_start) - 3) // 2]
                out.append(Completion(np.asarray(ids, np.int32), np.full(len(ids), -0.5, np.float32), "stop", 1))
            return out

    requests = [dataclasses.replace(REQUEST, state_id=f"row-{i}", state=SandboxState(files={"in.txt": b"x"}))
                for i in range(2)]
    engine = TurnEngine(turns)
    loop = AgentLoop(engine, lambda: EpisodeBuilder(tok, "qwen3_5"), LocalSandbox,
                     AgentLoopConfig(sampling=SamplingConfig(group_size=2), progress=False, schedule=schedule))
    trajs = loop.run(requests, seed=7)
    if schedule == "lockstep":
        assert len(engine.calls) == 2 and len(engine.calls[0]) == 4  # one batched model call per turn
    else:
        assert sum(map(len, engine.calls)) == 8  # 4 episodes x 2 turns, in calls of whatever was ready
    assert [(t.state_id, t.episode) for t in trajs] == [("row-0", 0), ("row-0", 1), ("row-1", 0), ("row-1", 1)]
    for traj in trajs:
        assert traj.finish_reason == tj.FINISH_SUBMITTED and traj.submitted == "out.txt"
        assert traj.artefacts == {"out.txt": b"42\n"}  # in.txt is unchanged, so not an artefact
        assert [r.tool for r in traj.receipts] == ["execute_code", "submit"]
        sampled = traj.ids[traj.loss_mask == 1].tolist()
        assert sampled == turns[0] + turns[1]
        np.testing.assert_array_equal(traj.logprobs[traj.loss_mask == 1], -0.5)
        assert np.all(traj.logprobs[traj.loss_mask == 0] == 0)
        assert traj.template["family"] == "qwen3_5"
        assert "<tool_response>\n42" not in tok.decode(traj.ids.tolist())  # echo > file prints nothing
        assert "[exit code 0]" in tok.decode(traj.ids.tolist())


@pytest.mark.slow
def test_jax_sampler_in_loop_learner_reproduces_logprobs():
    """A tiny random Qwen3.5 policy through the whole loop (parse errors become observations); a learner-style
    full forward over each trajectory's ids reproduces the recorded logprobs on every sampled token."""
    import jax.numpy as jnp
    from flax import nnx

    from bat_jax.models.configs import Qwen3_5Config
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM
    from bat_jax.models.tokenizer import TINY_VOCAB_SIZE, load_tiny_tokenizer
    from bat_jax.rollout.engine import token_logprobs
    from bat_jax.rollout.jax_sampler import JaxSampler

    tok = load_tiny_tokenizer()
    cfg = Qwen3_5Config(vocab_size=TINY_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        full_attention_interval=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                        linear_num_value_heads=4)
    model = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0))
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=2, temperature=0.6, top_p=0.8),
                             max_assistant_turns=2, max_tokens_per_turn=8, progress=False)
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    loop = AgentLoop(JaxSampler(model), lambda: EpisodeBuilder(tok, "qwen3_5"), lambda s: FakeSandbox(s), config,
                     extra_stop_ids=(im_start,))
    trajs = loop.run([REQUEST, dataclasses.replace(REQUEST, state_id="row-2")], seed=1)
    assert len(trajs) == 4
    forward = nnx.jit(lambda m, ids: m(ids))
    for traj in trajs:
        assert traj.finish_reason in (tj.FINISH_MAX_TURNS, tj.FINISH_INVALID_TURN)
        assert 1 <= traj.response_tokens <= 16
        logits = forward(model, jnp.asarray(traj.ids[None]))
        lp = np.asarray(token_logprobs(logits[0, :-1], jnp.asarray(traj.ids[1:]), 0.6, 0.8, 0))
        sampled = traj.loss_mask[1:] == 1
        np.testing.assert_allclose(lp[sampled], traj.logprobs[1:][sampled], atol=1e-4)
    # episodes of one row differ (independent seeds)
    assert trajs[0].ids.tolist() != trajs[1].ids.tolist()


class _Flood(FakeSandbox):
    """Prints `chars` supplementary private-use characters per call (each several tokens of a byte-level BPE)."""

    chars = 2048

    def execute_code(self, language, code, timeout_s=None):
        self.calls.append(code)
        return Observation("\U000f0000" * self.chars, "", 0, 0.01)



@pytest.mark.parametrize("limit", [3072, 12288])
def test_no_trajectory_outgrows_the_context_however_many_tokens_an_observation_encodes_to(limit):
    """2,048 supplementary private-use characters pass the 2,048-character cut but encode to ~8,000 tokens: the
    observation that would pass `max_context_tokens` ends the episode (scored, the agent's failure) with the
    trajectory as it was before it, so no rollout is longer than the context the learner is compiled for."""
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.models.tokenizer import load_tiny_tokenizer

    tok = load_tiny_tokenizer()
    builder = EpisodeBuilder(tok, "qwen3_5")
    flood = builder.codec.encode_text("\U000f0000" * 2048)
    assert len(flood) > 6000  # the measure: ~4 tokens per character
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=2),
                             max_assistant_turns=6, max_context_tokens=limit, progress=False)
    trajs = AgentLoop(RealCallEngine(builder), lambda: EpisodeBuilder(tok, "qwen3_5"), _Flood, config).run([REQUEST])
    for t in trajs:
        assert len(t.ids) <= limit and t.finish_reason == tj.FINISH_MAX_CONTEXT and not t.infra_error
        assert len(t.ids) == len(t.loss_mask) == len(t.logprobs)
        # the observation that did not fit is not in the trajectory: it ends with the last sampled turn's glue
        assert t.messages[-1]["role"] == "assistant" and t.loss_mask[-2] == 1
    # under 3,072 the first observation already does not fit (no observation in the trajectory); under 12,288
    # exactly one fits (8,000+ tokens) and the second does not
    assert [sum(m["role"] == "tool" for m in t.messages) for t in trajs] == [int(limit == 12288)] * 2


def test_trailing_glue_past_the_context_is_dropped_and_sampled_tokens_never_are():
    """A turn the context limit cut gets an end-of-turn as glue (mask 0): the trajectory is cut back to the
    limit, never losing a sampled token."""
    tok = WordTokenizer()
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=1),
                             max_context_tokens=6, max_tokens_per_turn=50, progress=False)
    (t,) = AgentLoop(ScriptedEngine([[11, 11, 11, 11, 11, 11, 11, EOT]]), lambda: StubBuilder(tok), FakeSandbox,
                     config).run([REQUEST])
    assert t.finish_reason == tj.FINISH_MAX_CONTEXT and len(t.ids) == 6 and t.loss_mask.tolist()[-1] == 1
