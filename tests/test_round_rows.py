"""The rows a round trains on (bicurl/round_rows.py): the mode's pools, the round view with dynamic sampling's spare
rows behind the leakage preflight, and the KL probe's prompts."""

import collections

import pytest

from bat_jax.bicurl.round_rows import RoundRows, fit_probe, kl_prompts, mode_pools
from bat_jax.learn.dynamic_sampling import DynamicSamplingConfig
from bat_jax.learn.kl import PolicyShiftConfig
from bat_jax.sandbox.types import SandboxState
from bat_jax.stage_bank.bank import BankView
from bat_jax.stage_bank.leakage import HeldOutManifest, LeakageError
from bat_jax.stage_bank.pools import PoolConfig
from doubles import make_bank

ROWS = make_bank(per_focus=24)  # S1–S5 and E2E, 24 rows each
SECRET = "ho-secret-task-0042"


def _view(rows=ROWS) -> BankView:
    return BankView(version=1, rl_rows=tuple(rows), sft_rows=())


def test_bicurl_draws_every_row_and_the_e2e_baseline_the_e2e_rows_on_their_task_metric():
    rows, config = mode_pools(ROWS, "bicurl", PoolConfig())
    assert rows == list(ROWS) and config == PoolConfig()
    rows, config = mode_pools(ROWS, "grpo_e2e", PoolConfig(seed=3))
    assert len(rows) == 24 and {r.focus for r in rows} == {"E2E"}
    assert {r.reward_source for r in rows} == {"task_metric"}
    assert config == PoolConfig(seed=3, omit=("target", "mix"))


def test_a_round_view_holds_its_steps_batches_and_the_spare_rows_dynamic_sampling_may_draw():
    """2 steps of 8 rows (4 target / 2 mix / 2 E2E, the paper's ½ : ¼ : ¼); dynamic sampling's 2 extra rows per step
    give each pool 2 x 2 = 4 spare rows; without it none."""
    clean = lambda ref: SandboxState({"task.md": b"a training task"})  # noqa: E731
    on = RoundRows("bicurl", 2, PoolConfig(), DynamicSamplingConfig(enabled=True, max_extra_rows=2),
                   HeldOutManifest(task_ids=(SECRET,)), clean)
    view = on.view(_view(), "S3", round_index=1)
    assert [len(batch) for batch in view.batches] == [8, 8]
    assert [collections.Counter(item.pool for item in batch) for batch in view.batches] == [
        {"target": 4, "mix": 2, "e2e": 2}] * 2
    assert {item.row.focus for batch in view.batches for item in batch if item.pool == "target"} == {"S3"}
    assert {pool: len(items) for pool, items in view.spares.items()} == {"target": 4, "mix": 4, "e2e": 4}
    off = RoundRows("bicurl", 2, PoolConfig(), DynamicSamplingConfig(), HeldOutManifest(task_ids=(SECRET,)), clean)
    assert sum(len(items) for items in off.view(_view(), "S3", round_index=1).spares.values()) == 0
    e2e = RoundRows("grpo_e2e", 2, PoolConfig(), DynamicSamplingConfig(), HeldOutManifest(), clean)
    assert {item.row.reward_source for batch in e2e.view(_view(), "S3", 1).batches for item in batch} == {
        "task_metric"}


def test_a_held_out_marker_in_a_drawn_rows_state_refuses_the_round():
    """Every RL row's state is scanned: one state file naming a held-out task id stops the round, naming it."""
    leaky = lambda ref: SandboxState({"task.md": f"see {SECRET}".encode()})  # noqa: E731
    rows = RoundRows("bicurl", 1, PoolConfig(), DynamicSamplingConfig(), HeldOutManifest(task_ids=(SECRET,)), leaky)
    with pytest.raises(LeakageError, match="round 4 view"):
        rows.view(_view(), "S2", round_index=4)


def test_the_kl_probe_pads_the_first_prompts_of_training_rows():
    """`num_prompts` rows' first messages (the compact prompt of the row's text and skill) through the episode builder,
    right-padded; rows with the same text give the same ids."""
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.policy import PolicyConfig, build_policy
    from bat_jax.prompts import PromptFormat
    from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark

    policy = build_policy(PolicyConfig(architecture="qwen3", tiny={"hidden_size": 32, "intermediate_size": 64,
                                                                   "num_hidden_layers": 1}))
    prompt = PromptFormat.of(ImagingBenchmark(), "compact")
    rows = [r for r in ROWS if r.focus == "S1"][:2] + [r for r in ROWS if r.focus == "E2E"][:1]
    ids, mask = kl_prompts(rows, policy, prompt, PolicyShiftConfig(num_prompts=2))
    assert ids.shape == mask.shape and ids.shape[0] == 2  # the first two rows only
    messages, tools = prompt.first_messages(rows[0].prompt, rows[0].skill)
    want = list(EpisodeBuilder(policy.tokenizer, policy.chat_family).start(messages, tools))
    for row_ids, row_mask in zip(ids, mask):
        assert row_ids[: len(want)].tolist() == want and row_mask[: len(want)].all()
        assert not row_mask[len(want):].any() and not row_ids[len(want):].any()  # right padding: id 0, mask 0


def test_a_round_the_bank_cannot_fill_is_refused_at_launch_naming_the_bindings():
    """3 steps of 8 rows (4 / 2 / 2) need 12 target rows; a bank of 2 rows per focus holds 2 per target stage. With
    refill the same bank fits; a bank without E2E rows leaves the E2E pool empty, refill or not."""
    from bat_jax.errors import ConfigValueError
    from bat_jax.benchmarks.imaging.stages import STAGES

    small = _view(make_bank(per_focus=2))
    rows = RoundRows("bicurl", 3, PoolConfig(), DynamicSamplingConfig(), HeldOutManifest(), None)
    with pytest.raises(ConfigValueError) as e:
        rows.check_fits(small, STAGES.ids)
    assert str(e.value) == (
        "Stage Bank v1: a round targeting 'S1' draws pool 'target', which has 2 RL rows, but its 3 batches "
        "(experiment.BiCuRLConfig.grpo_steps_per_round) of pools.PoolConfig.batch_size = 8 need 12; bind "
        "pools.PoolConfig.refill = True (further passes over the rows) or draw fewer")
    refill = RoundRows("bicurl", 3, PoolConfig(refill=True), DynamicSamplingConfig(), HeldOutManifest(), None)
    refill.check_fits(small, STAGES.ids)
    RoundRows("bicurl", 1, PoolConfig(batch_size=4), DynamicSamplingConfig(), HeldOutManifest(), None).check_fits(
        small, STAGES.ids)  # 2 / 1 / 1 rows: fits without refill
    with pytest.raises(ConfigValueError) as e:
        refill.check_fits(_view(make_bank(per_focus=2, foci=STAGES.ids)), STAGES.ids)
    assert str(e.value) == ("Stage Bank v1: a round targeting 'S1' draws pool 'e2e', which has no RL row; build the "
                            "bank with rows of that focus (factory.FactoryConfig.foci) or bind "
                            "pools.PoolConfig.e2e = 0")


def test_the_kl_probe_shrinks_to_a_small_bank_and_says_so(capsys):
    from bat_jax.errors import ConfigValueError

    config = PolicyShiftConfig(num_prompts=32, batch_size=8)
    assert fit_probe(config, 40) is config and capsys.readouterr().out == ""
    assert fit_probe(config, 3) == PolicyShiftConfig(num_prompts=3, batch_size=8)
    assert capsys.readouterr().out == ("[bat_jax] KL probe: 3 prompts, every RL row of the bank version "
                                       "(kl.PolicyShiftConfig.num_prompts = 32 asks for more)\n")
    with pytest.raises(ConfigValueError, match=r"^the Stage Bank version has no RL row, so no KL probe prompt "):
        fit_probe(config, 0)
