"""The BiCuRL experiment end to end on the micro configuration (tests/micro_config.py, local sandbox backend),
and its resume."""

import json
import re

import pytest

from bat_jax.bicurl import experiment as ex
from bat_jax.bicurl.engines import EngineConfig
from bat_jax.ledger import Ledger
from bat_jax.stage_bank.leakage import HeldOutManifest, preflight
from bat_jax.benchmarks.imaging.stages import STAGES

import micro_config


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="mode must be one of"):
        ex.BiCuRLConfig(mode="ppo")
    with pytest.raises(ValueError, match="grpo_steps_per_round"):
        ex.BiCuRLConfig(grpo_steps_per_round=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        ex.Components(engine=EngineConfig(kind="sglang"))


def _export_reloads_in_transformers(export_dir):
    """run_dir/export/ holds the retained policy in HF layout: transformers loads weights, config, tokenizer and
    chat template as they are, and its logits equal the JAX model's loaded from the same directory."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bat_jax.models import hf_io

    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Segment the liver."}],
                                        add_generation_prompt=True, tokenize=True)["input_ids"]
    assert tokenizer.chat_template and len(ids) > 5
    with torch.no_grad():
        model = AutoModelForCausalLM.from_pretrained(export_dir).eval()
        ref = model(torch.tensor([ids]), use_cache=False).logits.numpy()  # micro model: DeltaNet layers only
    out = np.asarray(hf_io.load_pretrained(export_dir)(np.asarray([ids], np.int32)))
    assert np.abs(out - ref).max() <= 1e-4


@pytest.mark.slow
def test_bicurl_runs_end_to_end_and_resumes(tmp_path):
    comps = micro_config.components(micro_config.seeded(tmp_path / "bank"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = ex.run(run_dir, ex.BiCuRLConfig(rounds=1, grpo_steps_per_round=1, backend="local"), comps)
    assert out["rounds"] == 1
    # the run read the seeded micro bank's 12 sources back (the suite's micro runs rely on it for their time)
    built = json.loads((tmp_path / "bank" / "work" / "build_report.json").read_text())
    assert (built["cached_sources"], built["sources_total"], built["rl_rows"]) == (12, 12, 12)
    assert set(out["final"]) == {"untrained", "SFT", "BiCuRL (retained)"}
    (record,) = Ledger(run_dir / "ledger.jsonl").read()
    assert record.round == 1 and record.selected_stage in {"S1", "S2", "S3", "S4", "S5"}
    assert record.pool_counts == {"target": 2, "mix": 1, "e2e": 1}  # 1/2, 1/4, 1/4 of a batch of 4
    assert len(record.state_ids) == 4 and record.reward_version.startswith("bat_rubric/")
    assert record.decision in {"accept", "fallback"} and record.kl is not None
    for name in ("report.md", "staircase.png", "summary.json", "round0_eval.json"):
        assert (run_dir / name).is_file(), name
    assert "BiCuRL (retained)" in (run_dir / "report.md").read_text()
    # rubric item counts of the controller evaluation and the GRPO rollouts; only aggregates leave the evaluator
    assert record.eval_item_rates() and record.grpo.item_rates() and (run_dir / "items.png").is_file()
    assert "Rubric items that fail most" in (run_dir / "report.md").read_text()
    outputs = [run_dir / name for name in ("report.md", "ledger.jsonl", "summary.json", "round0_eval.json",
                                           "tensorboard")]
    assert preflight(HeldOutManifest.load(run_dir / "heldout_manifest.json"), files=outputs).clean
    _export_reloads_in_transformers(run_dir / "export")
    # the same run directory with one more round resumes: round 1 is read back, not redone
    out2 = ex.run(run_dir, ex.BiCuRLConfig(rounds=2, grpo_steps_per_round=1, backend="local"), comps)
    records = Ledger(run_dir / "ledger.jsonl").read()
    assert [r.round for r in records] == [1, 2] and records[0] == record
    assert out2["rounds"] == 2
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2


def _summary(overall, cells):
    """A controller-evaluation Summary with `overall` on every stage and track, resting on `cells`."""
    from bat_jax.benchmark.scoring import Summary

    tracks = {t: {"overall": overall, "agentic": overall, "task": overall, "n": 1} for t, _ in cells}
    return Summary(overall, overall, overall, 0.0, 0.0, 0.0, {s: overall for s in STAGES.ids},
                   tracks if overall is not None else {}, len(cells), 0 if overall is not None else len(cells),
                   frozenset(cells) if overall is not None else frozenset())


@pytest.mark.slow
def test_the_controller_decides_unscored_and_unpaired_rounds_of_a_real_run(tmp_path, monkeypatch, capsys):
    """Round 0's evaluation is all unscored (stays None, never 0); round 1 is the first scored one (accepted); round
    2 is evaluated on other cells than the incumbent's, so the gate holds it and names them. With a rehearsal bound,
    each round takes its SFT step on every stage's rows after the GRPO block (the scripted evaluations do not depend
    on the parameters)."""
    import dataclasses

    from bat_jax.bicurl import evaluation as evaluator
    from bat_jax.curriculum.controller import ControllerConfig

    a, b = [("segmentation", 0)], [("segmentation", 1)]
    scripted = iter([_summary(None, a), _summary(0.4, a), _summary(0.5, b)])
    real_evaluate = evaluator.evaluate
    monkeypatch.setattr(evaluator, "evaluate", lambda cells, config, benchmark: next(scripted)
                        if config.purpose == "controller" else real_evaluate(cells, config, benchmark))
    comps = dataclasses.replace(micro_config.components(micro_config.seeded(tmp_path / "bank")),
                                controller=ControllerConfig(acceptance="noninferiority"))
    comps = dataclasses.replace(comps, rehearsal=dataclasses.replace(comps.sft, total_steps=1))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ex.run(run_dir, ex.BiCuRLConfig(rounds=2, grpo_steps_per_round=1, backend="local"), comps)

    round0 = json.loads((run_dir / "round0_eval.json").read_text())
    assert round0["overall"] is None and round0["stage_scores"]["S1"] is None
    first, second = Ledger(run_dir / "ledger.jsonl").read()
    assert first.routing_report["rule"] == "no_scored_stage" and first.selected_stage == "S1"
    assert (first.decision, first.retained_checkpoint, first.controller_state["best_checkpoint"]) == (
        "accept", "ckpt-1", "ckpt-1")
    assert first.controller_scores["cells"] == [["segmentation", 0]]
    assert second.decision == "hold" and second.retained_checkpoint == "ckpt-1"
    assert second.routing_report["held"] is False  # round 1 was accepted
    (reason,) = second.decision_reasons
    assert reason.startswith("unpaired") and "only the candidate has cells [('segmentation', 1)]" in reason
    assert "round 2" in (run_dir / "report.md").read_text()
    out = capsys.readouterr().out
    (cold,) = re.findall(r"SFT cold start: (\d+) sequences", out)  # the rehearsal renders the rows the same way
    rehearsals = re.findall(r"^\[bat_jax\] round (\d) rehearsal: 1 SFT steps on (\d+) sequences of every stage, "
                            r"last batch NLL \d+\.\d{3} ", out, re.M)
    assert rehearsals == [("1", cold), ("2", cold)], out[-3000:]


@pytest.mark.parametrize("size", ["9b", "4b"])
def test_paper_scale_run_files_stop_naming_the_missing_checkpoint(size, tmp_path):
    from bat_jax import launch

    with pytest.raises(FileNotFoundError, match=f"/models/Qwen3.5-{size.upper()}-Instruct"):
        launch.launch([f"bicurl_{size}.gin"], run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run" / "ledger.jsonl").exists()


def test_sft_targets_must_be_row_or_trajectory():
    assert ex.BiCuRLConfig().sft_targets == "row"  # the paper's rows: loss on one target each
    with pytest.raises(ValueError, match="sft_targets"):
        ex.BiCuRLConfig(sft_targets="all")
