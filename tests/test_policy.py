"""SFT-row rendering of the policy adapter: the prompt is the context in the chat template, the loss falls
exactly on the one target action + end of turn, and observations are cut as the agent loop cuts them."""

import numpy as np
import pytest

from bat_jax.policy import AGENT_SYSTEM_PROMPT, PolicyConfig, build_policy, render_sft_row
from bat_jax.rollout.agent_loop import cut_observation
from bat_jax.stage_bank.row import Action, Message, Provenance, SFTRow

MICRO = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
         "linear_num_key_heads": 1, "linear_num_value_heads": 2}
OBSERVATION = "case_id,file\n" + "".join(f"case{i:03d},images/case{i:03d}.png\n" for i in range(60))


@pytest.fixture(scope="module")
def policy():
    return build_policy(PolicyConfig(tiny=MICRO))


def _row() -> SFTRow:
    first = Action("Read the brief first.", "execute_code", {"language": "bash", "code": "cat task.md"})
    target = Action("Inventory the manifest.", "execute_code", {"language": "bash", "code": "head -n 3 data/cases.csv"})
    return SFTRow(context=(Message("system", "teacher system prompt"), Message("user", "# Task tr-1\nbrief text"),
                           Message("assistant", action=first), Message("tool", OBSERVATION)),
                  target=target, focus="S1",
                  provenance=Provenance("src-1", "0" * 64, "classification", "success"))


def _decode(policy, example, mask_value):
    ids = example["input_ids"][(example["attention_mask"] == 1) & (example["loss_mask"] == mask_value)]
    return policy.tokenizer.decode(ids.tolist())


def test_loss_mask_covers_exactly_the_target_action_and_end_of_turn(policy):
    example = render_sft_row(_row(), policy, max_seq_len=2048)
    assert {k: v.shape for k, v in example.items()} == {k: (2048,) for k in ("input_ids", "attention_mask",
                                                                            "loss_mask")}
    assert example["input_ids"].dtype == np.int32
    target = _decode(policy, example, 1)
    assert target.startswith("Inventory the manifest.") and target.endswith("<|im_end|>")
    assert "head -n 3 data/cases.csv" in target and "cat task.md" not in target
    prompt = _decode(policy, example, 0)
    # the agent's own system prompt replaces the teacher's; the first user turn and the prior action stay
    assert AGENT_SYSTEM_PROMPT in prompt and "teacher system prompt" not in prompt
    assert "brief text" in prompt and "cat task.md" in prompt and "case059" in prompt


def test_observations_are_cut_like_the_agent_loop_cuts_them(policy):
    full = render_sft_row(_row(), policy, max_seq_len=2048)
    cut = render_sft_row(_row(), policy, max_seq_len=2048, max_observation_chars=100)
    prompt = _decode(policy, cut, 0)
    assert cut_observation(OBSERVATION, 100) in prompt
    assert f"[observation truncated: {len(OBSERVATION) - 100} more chars]" in prompt and "case059" not in prompt
    assert _decode(policy, cut, 1) == _decode(policy, full, 1)  # the target is never cut
    assert cut["attention_mask"].sum() < full["attention_mask"].sum()


def test_a_row_longer_than_max_seq_len_is_skipped_not_truncated(policy):
    n = int(render_sft_row(_row(), policy, max_seq_len=2048)["attention_mask"].sum())
    assert render_sft_row(_row(), policy, max_seq_len=n) is not None
    assert render_sft_row(_row(), policy, max_seq_len=n - 1) is None


def test_the_tiny_qwen3_policy_renders_with_the_shipped_tokenizers_template():
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.models.qwen3 import Qwen3ForCausalLM

    dense = {k: v for k, v in MICRO.items() if not k.startswith("linear_")}
    qwen3 = build_policy(PolicyConfig(family="qwen3", tiny=dense))
    assert isinstance(qwen3.model, Qwen3ForCausalLM) and qwen3.family == "qwen3_5"
    builder = EpisodeBuilder(qwen3.tokenizer, qwen3.family)  # raised TemplateMismatchError with family 'qwen3'
    builder.start([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    from bat_jax.models.chat import get_family

    assert qwen3.tokenizer.decode(builder.build().ids.tolist()).endswith(get_family("qwen3_5").generation_prompt)
