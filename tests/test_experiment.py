"""The BiCuRL experiment end to end on a micro configuration (local sandbox backend), and its resume."""

import json

import pytest

from bat_jax import experiment as ex
from bat_jax.benchmark.evaluator import EvalConfig
from bat_jax.learn import grpo, kl, sft
from bat_jax.learn.optim import OptimizerConfig
from bat_jax.ledger import Ledger
from bat_jax.policy import PolicyConfig
from bat_jax.rollout.agent_loop import AgentLoopConfig
from bat_jax.stage_bank.factory import FactoryConfig
from bat_jax.stage_bank.pools import PoolConfig

MICRO_MODEL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
               "linear_num_key_heads": 1, "linear_num_value_heads": 2, "max_position_embeddings": 8192}


def _components(tmp_path):
    return ex.Components(
        policy=PolicyConfig(tiny=MICRO_MODEL),
        bank=FactoryConfig(bank_dir=str(tmp_path / "bank"), tracks=("segmentation", "vqa"), outcomes=("success",),
                           backend="local"),
        sft=sft.SFTConfig(optimizer=OptimizerConfig(learning_rate=1e-3), global_batch_size=2, total_steps=2,
                          max_seq_len=4096),
        grpo=grpo.GRPOConfig(temperature=0.7, group_size=2),
        pools=PoolConfig(batch_size=4),
        agent=AgentLoopConfig(episodes_per_state=2, max_assistant_turns=2, max_tool_calls=2, max_response_tokens=64,
                              max_tokens_per_turn=32, max_context_tokens=8192, progress=False),
        evaluation=EvalConfig(repeats=1, tracks=("segmentation",), max_turns=2),
        policy_shift=kl.PolicyShiftConfig(num_prompts=4, batch_size=2),
    )


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="mode must be one of"):
        ex.BiCuRLConfig(mode="ppo")
    with pytest.raises(ValueError, match="grpo_steps_per_round"):
        ex.BiCuRLConfig(grpo_steps_per_round=0)


@pytest.mark.slow
def test_bicurl_runs_end_to_end_and_resumes(tmp_path):
    comps = _components(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = ex.run(run_dir, ex.BiCuRLConfig(rounds=1, grpo_steps_per_round=1, backend="local"), comps)
    assert out["rounds"] == 1
    assert set(out["final"]) == {"untrained", "SFT", "BiCuRL (retained)"}
    (record,) = Ledger(run_dir / "ledger.jsonl").read()
    assert record.round == 1 and record.selected_stage in {"S1", "S2", "S3", "S4", "S5"}
    assert record.pool_counts == {"target": 2, "mix": 1, "e2e": 1}  # 1/2, 1/4, 1/4 of a batch of 4
    assert len(record.state_ids) == 4 and record.reward_version.startswith("bat_rubric/")
    assert record.decision in {"accept", "fallback"} and record.kl is not None
    for name in ("report.md", "staircase.png", "summary.json", "round0_eval.json"):
        assert (run_dir / name).is_file(), name
    assert "BiCuRL (retained)" in (run_dir / "report.md").read_text()
    # the same run directory with one more round resumes: round 1 is read back, not redone
    out2 = ex.run(run_dir, ex.BiCuRLConfig(rounds=2, grpo_steps_per_round=1, backend="local"), comps)
    records = Ledger(run_dir / "ledger.jsonl").read()
    assert [r.round for r in records] == [1, 2] and records[0] == record
    assert out2["rounds"] == 2
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2


@pytest.mark.parametrize("size", ["9b", "4b"])
def test_paper_scale_run_files_stop_naming_the_missing_checkpoint(size, tmp_path):
    from bat_jax import launch

    with pytest.raises(FileNotFoundError, match=f"/models/Qwen3.5-{size.upper()}-Instruct"):
        launch.launch([f"bicurl_{size}.gin"], run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run" / "ledger.jsonl").exists()
