"""Stand-in Stage Bank rows and banks, example rows, a micro policy config and Data Factory builds."""

import hashlib
import time
from collections import Counter

from bat_jax.sandbox.tools import STOP, Action
from bat_jax.sandbox.types import SandboxState
from bat_jax.stage_bank.row import (EvidenceSpec, Message, Provenance, RLRow, RubricSpec, SFTRow, StateRef,
                                    Transformation)

H = "ab" * 32

# --- Stage Bank rows (test_bank, test_pools, test_gin_configs, test_sweep) ------------------------------------


def make_rows(bank, n, *, start=0, tracks=("vqa", "segmentation"), foci=("S1", "S3", "E2E")):
    """`n` RL rows with states stored in `bank` (tasks `start` … `start + n - 1`; focus, track, outcome and
    reward kind cycle)."""
    rows = []
    for i in range(start, start + n):
        state = SandboxState({"task.md": f"fictional task {i}".encode()})
        ref = bank.put_state(state)
        rows.append(RLRow(ref, foci[i % len(foci)], f"Do step for task {i}.", (RubricSpec("a", "item a"),), (),
                          "skill", Provenance(f"src-{i}", H, tracks[i % len(tracks)],
                                              ("success", "recovery", "failure")[i % 3]),
                          ("rubric", "task_metric")[i % 2]))
    return rows


TRACKS = ("classification", "detection", "enhancement", "report", "segmentation", "synthesis", "vqa")
OUTCOMES = ("success", "recovery", "failure")


def make_bank(per_focus=400, foci=None):
    """`per_focus` RL rows per focus (default: the imaging suite's S1–S5 and E2E), states not stored."""
    from bat_jax.benchmarks.imaging.stages import STAGES

    rows = []
    for focus in foci if foci is not None else STAGES.foci:
        for i in range(per_focus):
            digest = hashlib.sha256(f"{focus}-{i}".encode()).hexdigest()
            rows.append(RLRow(StateRef(digest, f"states/{digest}.tar"), focus, "p", (RubricSpec("a", "b"),), (),
                              "k", Provenance(f"{focus}-src-{i}", H, TRACKS[i % 7], OUTCOMES[(i // 7) % 3])))
    return rows


#: RL rows per focus (S1–S5, E2E) of the tiny Stage Bank the tiny run files train on (README: 126 RL rows).
TINY_BANK_ROWS_PER_FOCUS = 21


def assert_rounds_fit_the_tiny_bank(context: str) -> None:
    """With the parsed gin config, every round the run could route (any target stage) draws its
    `grpo_steps_per_round` batches from pools of the tiny bank's sizes (as `experiment.run` builds them,
    `round_rows.mode_pools`: GRPO-E2E keeps the E2E pool only) without an error."""
    import gin

    from bat_jax.bicurl.experiment import BiCuRLConfig
    from bat_jax.bicurl.round_rows import mode_pools
    from bat_jax.stage_bank.pools import PoolConfig, build_round_view
    from bat_jax.benchmarks.imaging.stages import STAGES

    run = BiCuRLConfig(**gin.get_bindings("bat_jax.bicurl.experiment.BiCuRLConfig"))
    rows, pools = mode_pools(make_bank(per_focus=TINY_BANK_ROWS_PER_FOCUS), run.mode,
                             PoolConfig(**gin.get_bindings("bat_jax.stage_bank.pools.PoolConfig")))
    for stage in STAGES.ids:
        try:
            build_round_view(rows, stage, round_index=1, n_batches=run.grpo_steps_per_round, config=pools)
        except ValueError as e:
            raise AssertionError(f"{context}: a round targeting {stage} cannot be drawn: {e}") from None

# --- example rows (test_stage_bank_row, test_row_parse) ------------------------------------------------------

#: The example rows' start state.
EXAMPLE_STATE = SandboxState(files={"task.md": b"Segment the fictional liver.", "data/x.txt": b"1"}, env={"SEED": "1"})


def example_provenance(outcome="success", track="segmentation"):
    return Provenance("seg-fict-0007", H, track, outcome, (Transformation("stage_slice", "cd" * 32, {"t": 3}),))


def example_rl_row(**kw):
    """An S3 RL row of a fictional segmentation task (`kw` replaces fields)."""
    args = dict(state=StateRef.from_state(EXAMPLE_STATE, f"states/{EXAMPLE_STATE.digest()}.tar"), focus="S3",
                prompt="Validate the model on the fictional split.",
                rubric=(RubricSpec("s3.dice", "Reports Dice on the validation split"),),
                evidence=(EvidenceSpec("s3.receipt", "receipt", {"pattern": "dice"}),),
                skill="Validate: run the model on held-in cases first.", provenance=example_provenance(),
                reward_source="rubric")
    args.update(kw)
    return RLRow(**args)


def example_sft_row(**kw):
    """An S1 SFT row: system, user, one execute_code call and its result, then the target (`kw` replaces fields)."""
    args = dict(context=(Message("system", "You are an agent."), Message("user", "Plan the task."),
                         Message("assistant", action=Action("", "execute_code", {"language": "bash", "code": "ls"})),
                         Message("tool", "task.md\n[exit code 0]")),
                target=Action("Plan: 1) load 2) train", STOP), focus="S1", provenance=example_provenance())
    args.update(kw)
    return SFTRow(**args)


# --- a micro policy (test_policy, test_prompts, test_sft_data) -------------------------------------------------

#: `PolicyConfig.tiny` of a micro Qwen3.5 (2 layers, hidden 32) on the shipped tokenizer.
MICRO_POLICY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                "linear_num_key_heads": 1, "linear_num_value_heads": 2}


def tabular_micro_bindings(bank_dir, tracks) -> list[str]:
    """tabular_tiny.gin shortened to one round of one GRPO step: micro policy, local sandboxes, the families `tracks`
    of the 'mixed' variant, 2-turn episodes (test_tabular_benchmark, test_experiment_judge)."""
    micro = {**MICRO_POLICY, "max_position_embeddings": 8192}
    return [f"policy.PolicyConfig.tiny = {micro}", "experiment.BiCuRLConfig.rounds = 1",
            "experiment.BiCuRLConfig.grpo_steps_per_round = 1", "experiment.BiCuRLConfig.backend = 'local'",
            "factory.FactoryConfig.backend = 'local'", f"factory.FactoryConfig.bank_dir = '{bank_dir}'",
            f"factory.FactoryConfig.tracks = {tuple(tracks)}", "factory.FactoryConfig.outcomes = ('mixed',)",
            "sft.SFTConfig.total_steps = 2", "sft.SFTConfig.global_batch_size = 2",
            "pools.PoolConfig.batch_size = 4", "sampling.SamplingConfig.group_size = 2",
            "agent_loop.AgentLoopConfig.max_assistant_turns = 2",
            "agent_loop.AgentLoopConfig.max_response_tokens = 64",
            "agent_loop.AgentLoopConfig.max_tokens_per_turn = 32",
            "dynamic_sampling.DynamicSamplingConfig.enabled = False", "kl.PolicyShiftConfig.num_prompts = 2",
            "kl.PolicyShiftConfig.batch_size = 2", "evaluation.EvalConfig.max_turns = 2",
            "evaluation.EvalConfig.final_repeats = 1", "evaluation.EvalConfig.variants = ('mixed',)"]


# --- Data Factory builds (test_factory_loop, test_bank_feed) ---------------------------------------------------


def fake_build(config, benchmark, progress=True, *, grid, hold_lock=True, delay_s=0.0, crash_after=0):
    """A stand-in for `build_bank`: one RL row per source (its focus, track, outcome, seed), admitted as one version
    after `delay_s`; raises once the bank holds `crash_after` versions (0: never)."""
    from bat_jax.stage_bank.bank import StageBank
    from bat_jax.stage_bank.factory import BuildReport

    bank = StageBank(config.bank_dir)
    if crash_after and bank.latest() >= crash_after:
        raise RuntimeError("teacher endpoint went away")
    time.sleep(delay_s)
    rows = []
    for src in grid:
        ref = bank.put_state(SandboxState({"task.md": f"task {src.track} seed {src.task_seed}".encode()}))
        rows.append(RLRow(ref, src.focus, f"Do {src.focus} of task {src.task_seed}.", (RubricSpec("a", "item a"),), (),
                          "skill", Provenance(f"src-{src.task_seed}-{src.index}", H, src.track, src.outcome), "rubric"))
    version = bank.admit(rows, note="fake factory")
    return BuildReport(config.bank_dir, version=version, sources_total=len(grid), sources_accepted=len(grid),
                       rl_rows=len(rows), admitted_rl=len(rows), rl_by_focus=dict(Counter(r.focus for r in rows)))


def slow_build(*args, **kwargs):
    return fake_build(*args, delay_s=0.3, **kwargs)


def crashing_build(*args, **kwargs):
    return fake_build(*args, crash_after=1, **kwargs)
