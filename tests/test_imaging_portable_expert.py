"""The portable scripted expert (bat_jax/benchmarks/imaging/portable_expert.py): one set of action texts, full marks on
every track.

The tiny default's teacher must be learnable by heart by a tiny model: every action except the submit path is
the same text whatever the task, track, layout or outcome, and the expert still earns every stage's full
reward on seed-drawn training layouts and on the held-out suite's layout, E2E and from a stage boundary the
literal expert's prefix produced. Plays use the local (non-isolated) backend; the factory builds one Docker
source in test_factory's style.
"""

import dataclasses

import pytest

from bat_jax.benchmarks.imaging.stages import STAGES, Stage
from bat_jax.sandbox.types import Observation
from bat_jax.stage_bank.bank import StageBank
from bat_jax.stage_bank.factory import FactoryConfig, build_bank, check_recipe, recipe
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.brief import VARIED_TEMPLATES
from bat_jax.staged_benchmark.episode import Conversation, Turn
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.heldout import heldout_suite, training_task
from bat_jax.benchmarks.imaging.portable_expert import NEXT, SCRIPT, SUBMIT_THOUGHT, THOUGHTS, PortableExpert
from bat_jax.benchmarks.imaging.registry import TRACKS

CODES = [code for _, _, code in SCRIPT]
IMAGING = ImagingBenchmark()


def _actions(result):
    return [(t.stage, t.action.tool, t.action.thought, dict(t.action.arguments)) for t in result.episode.turns]


def _assert_full_marks_with_the_fixed_script(result, inst):
    rewards = result.score.stage_rewards()
    assert rewards == {s: 1.0 for s in STAGES.ids}, (inst.task_id, rewards)
    actions = _actions(result)
    assert [a[3].get("code") for a in actions[:-1]] == CODES
    assert [a[0] for a in actions] == [s for s, _, _ in SCRIPT] + [Stage.SUBMIT]
    assert actions[-1][1:] == ("submit", SUBMIT_THOUGHT, {"path": inst.layout.submission})
    assert result.evidence.submitted == inst.layout.submission
    # each step's output opens with the step after it, and the next action's thought names that step
    turns = result.episode.turns
    firsts = [t.observation.stdout.split("\n", 1)[0] for t in turns[:-1]]
    assert firsts == [NEXT[s] for s, _, _ in SCRIPT]
    assert [a[2] for a in actions] == [THOUGHTS[s] for s, _, _ in SCRIPT] + [SUBMIT_THOUGHT]
    assert [f.split(": ", 1)[1] for f in firsts] == [a[2][len("Next: "):-1] for a in actions[1:]]


@pytest.mark.parametrize("track", list(TRACKS))
def test_same_actions_full_marks_on_a_varied_training_task_and_the_heldout_layout(track):
    train = training_task(TRACKS[track], 31, "recovery", template=VARIED_TEMPLATES[0])
    held = heldout_suite(1, ("failure",), tracks=(track,))[0]
    assert train.layout != held.layout
    for inst in (train, held):
        _assert_full_marks_with_the_fixed_script(play(IMAGING, inst, PortableExpert()), inst)
    # the task metric: every usable case predicted with the provided method (the failure variant loses one)
    assert play(IMAGING, train, PortableExpert()).score.task > 0.9


@pytest.mark.parametrize("focus", [s for s in STAGES.ids[1:]])
def test_a_stage_from_the_literal_experts_boundary_gets_full_marks(focus):
    """Stage rows and the evaluator start later stages from the literal expert's prefix (rollout.play.play)."""
    inst = training_task(TRACKS["segmentation"], 8, "recovery", template=VARIED_TEMPLATES[1])
    result = play(IMAGING, inst, PortableExpert(), focus=focus)
    assert result.score.reward == 1.0
    expected = [code for stage, _, code in SCRIPT if stage == focus]
    assert [t.action.arguments.get("code") for t in result.episode.turns if t.action.tool == "execute_code"] == expected


def test_no_submit_call_when_coverage_is_incomplete():
    """The expert calls submit only after its S5 check printed complete coverage."""
    expert = PortableExpert()
    conv = Conversation("Task id: x\n", "S5", IMAGING.row_skill("S5"), STAGES)
    first = expert(conv)
    assert first.arguments["code"] == CODES[-1]
    conv.turns.append(Turn(0, Stage.SUBMIT, first, Observation(
        stdout='{"complete": false, "submission": "o/s.json"}\n', stderr="", exit_code=0, duration_s=0.1)))
    assert expert(conv) is None


def test_factory_builds_a_portable_bank_and_refuses_to_mix_recipes(tmp_path):
    cfg = FactoryConfig(bank_dir=str(tmp_path / "bank"), tracks=("detection",), foci=("E2E", "S3"),
                        outcomes=("recovery",), workers=2, teacher="portable")
    varied = ImagingBenchmark(layouts="varied")
    report = build_bank(cfg, varied, progress=False)
    assert report.rejected == {} and report.sources_accepted == 2
    # 6 responses per full trajectory (S1..S5 + submit); the S3 source adds its 1-response stage rollout, the E2E
    # source its 6-response surrogate rollout
    assert report.sft_rows == 6 + 1 + 6 + 6
    bank = StageBank(cfg.bank_dir)
    targets = {r.target.arguments.get("code") for r in bank.read().sft_rows if r.target.tool == "execute_code"}
    assert targets == set(CODES)
    assert recipe(cfg, varied) == "benchmark=imaging teacher=portable/v2 layouts=varied"
    assert recipe(cfg, varied) in bank.note(1)
    check_recipe(bank, cfg, varied)  # same recipe: accepted
    with pytest.raises(ValueError, match=r"bank.*built with benchmark=imaging teacher=portable/v2 layouts=varied; "
                                         r"this run asks for benchmark=imaging teacher=scripted layouts=varied"):
        check_recipe(bank, dataclasses.replace(cfg, teacher="scripted"), varied)
    with pytest.raises(ValueError, match=r"this run asks for benchmark=imaging teacher=portable/v2 layouts=fixed"):
        check_recipe(bank, cfg, ImagingBenchmark(layouts="fixed"))
