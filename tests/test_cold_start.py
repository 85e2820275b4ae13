"""The SFT cold start's sequences and the round-0 evaluation file (bicurl/cold_start.py)."""

import json

import numpy as np
import pytest

from bat_jax.benchmark.scoring import Cell, aggregate
from bat_jax.bicurl.cold_start import (ROUND0_FILE, load_round0, rehearse, round0_items, round0_matches, save_round0,
                                      sft_examples)
from bat_jax.bicurl.evaluation import EvalConfig, suite_jobs
from bat_jax.learn.sft import SFTConfig
from bat_jax.policy import PolicyConfig, build_policy
from bat_jax.prompts import PromptFormat
from bat_jax.sandbox.tools import Action
from bat_jax.stage_bank.row import Message, Provenance, SFTRow
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.stages import STAGES

MICRO = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
         "linear_num_key_heads": 1, "linear_num_value_heads": 2}


def _cell(track: str, value: float | None) -> Cell:
    return Cell(track, 0, {s: value for s in STAGES.ids}, value)


def test_round0_is_written_once_and_read_back_with_its_items(tmp_path):
    """Tracks a (all 0.2) and b (all 0.4): Overall per track (Task + Agentic) / 2 = 0.2 and 0.4, mean 0.3."""
    evaluation = save_round0(tmp_path, aggregate([_cell("a", 0.2), _cell("b", 0.4)], STAGES))
    assert evaluation.overall == pytest.approx(0.3)
    assert evaluation.track_scores == pytest.approx({"a": 0.2, "b": 0.4})
    assert load_round0(tmp_path) == evaluation
    assert round0_items(tmp_path) == {}  # no cell recorded item decisions
    record = json.loads((tmp_path / ROUND0_FILE).read_text())
    (tmp_path / ROUND0_FILE).write_text(json.dumps({k: v for k, v in record.items() if k != "items"}))
    assert round0_items(tmp_path) is None  # a run that did not record them


def test_an_unscored_round0_stays_unscored(tmp_path):
    evaluation = save_round0(tmp_path, aggregate([_cell("a", None)], STAGES))
    assert evaluation.overall is None and load_round0(tmp_path).overall is None


def test_round0_names_the_jobs_it_played_and_another_controller_evaluation_does_not_match(tmp_path):
    """An SFT cold start copied into a run with 4 controller repeats or another seed (`launch.sweep --init_from`)
    must not serve as that run's round 0: its 3 tracks x 1 repeat are not the run's 3 x 4 cells."""
    bench = ImagingBenchmark()
    tracks = ("classification", "detection", "segmentation")
    base = EvalConfig(tracks=tracks, repeats=1, purpose="controller")
    jobs = suite_jobs(base, bench)
    save_round0(tmp_path, aggregate([_cell(t, 0.2) for t in tracks], STAGES), jobs)
    record = json.loads((tmp_path / ROUND0_FILE).read_text())
    assert record["jobs"]["count"] == 3 and len(record["jobs"]["sha256"]) == 64
    assert not any(j.task.task_id in json.dumps(record) for j in jobs)  # held-out task ids stay in the evaluator
    assert round0_matches(tmp_path, suite_jobs(base, bench))
    four = suite_jobs(EvalConfig(tracks=tracks, repeats=4, purpose="controller"), bench)
    assert len(four) == 12 and not round0_matches(tmp_path, four)
    assert not round0_matches(tmp_path, suite_jobs(EvalConfig(tracks=tracks, repeats=1, seed=1,
                                                                  purpose="controller"), bench))
    # a file written before jobs were recorded: its scored cells' (track, repeat) keys decide
    (tmp_path / ROUND0_FILE).write_text(json.dumps({k: v for k, v in record.items() if k != "jobs"}))
    assert round0_matches(tmp_path, jobs) and not round0_matches(tmp_path, four)


@pytest.fixture(scope="module")
def policy():
    return build_policy(PolicyConfig(tiny=MICRO))


def _row() -> SFTRow:
    first = Action("Read the brief first.", "execute_code", {"language": "bash", "code": "cat task.md"})
    target = Action("Inventory the manifest.", "execute_code", {"language": "bash", "code": "head -n 3 cases.csv"})
    return SFTRow(context=(Message("system", "teacher system prompt"), Message("user", "# Task tr-1\nbrief text"),
                           Message("assistant", action=first), Message("tool", "case_id,file\n")),
                  target=target, focus="S1", provenance=Provenance("src-1", "0" * 64, "classification", "success"))


def test_row_targets_give_one_sequence_per_row_with_one_target_and_none_fit_fails(policy):
    prompt = PromptFormat.of(ImagingBenchmark(), policy.prompt_style)
    examples = sft_examples([_row(), _row()], policy, prompt, SFTConfig(max_seq_len=4096), "row", 512)
    assert len(examples) == 2
    for e in examples:  # the loss mask turns on once: the one target action (+ end of turn)
        assert int(np.sum(np.diff(e["loss_mask"], prepend=0) == 1)) == 1
    from bat_jax.errors import ConfigValueError

    with pytest.raises(ConfigValueError) as e:
        sft_examples([_row()], policy, prompt, SFTConfig(max_seq_len=8), "row", 512)
    assert str(e.value) == ("no SFT row of the Stage Bank's 1 SFT rows fits sft.SFTConfig.max_seq_len = 8; bind a "
                            "larger one")


def test_rehearsal_reports_the_teacher_nll_and_at_lr_0_keeps_the_parameters(policy):
    """`rehearse`: lr 0 leaves every parameter as it was, and the NLL it reports is the row's token-mean NLL under
    them (from the model's full logits); three steps at lr 1e-2 on the one row lower it."""
    import jax

    from bat_jax.learn.batching import pad_batch
    from bat_jax.learn.learner import Learner
    from bat_jax.learn.optim import OptimizerConfig
    from bat_jax.learn.sft import sft_token_nll
    from bat_jax.models.mesh import MeshConfig

    learner = Learner(build_policy(PolicyConfig(tiny=MICRO)).model, MeshConfig(data=1, fsdp=1, tensor=1))
    prompt = PromptFormat.of(ImagingBenchmark(), policy.prompt_style)
    (example,) = sft_examples([_row()], policy, prompt, SFTConfig(max_seq_len=4096), "row", 512)
    batch = pad_batch([example], multiple=1, pad_to=len(example["input_ids"]))
    batch = {k: jax.numpy.asarray(v) for k, v in batch.items()}
    tokens, mask = sft_token_nll(learner.apply_fn(learner.params, batch["input_ids"], batch["attention_mask"]), batch)
    want = float(tokens.sum() / mask.sum())
    before = jax.tree.map(np.asarray, learner.params)

    def config(lr, steps):
        return SFTConfig(optimizer=OptimizerConfig(learning_rate=lr, schedule="constant", warmup_ratio=0.0),
                         global_batch_size=2, total_steps=steps, max_seq_len=4096)

    n, nll = rehearse(learner, policy, prompt, [_row()], config(0.0, 2), "row", 0, 512)
    assert n == 1 and nll == pytest.approx(want, rel=1e-4) and want > 1.0
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), learner.params, before)
    _, nll = rehearse(learner, policy, prompt, [_row()], config(1e-2, 3), "row", 0, 512)
    assert nll < want - 0.1  # the third step's batch, after two steps on the same row
