"""Reward integrity: the eight inputs of the second round of reward-hacking attempts, each as a test through the
real paths (`rollout.play.play`, `AgentLoop`, `RolloutScorer`), and variants of each kind.

1. a legal file name ('..x') turned an honest failure into "unscored";  2. agent-written JSON crashed the host
scorer;  3. a finite prediction made a NaN reward;  4. model output crashed the rollout loop;  5. a decompression
bomb cost the host ~1 GB;  6. "the method ran" by guessing;  7. "all cases predicted" from one real case;
8. a copy of earlier genuine output counted as this call's method run.
"""

import dataclasses
import gzip
import io
import json
import math
import tracemalloc
import zlib

import numpy as np
import pytest

from bat_jax.benchmark.stages import E2E
from bat_jax.benchmarks.imaging.stages import Stage
from bat_jax.rollout.trajectory import Trajectory
from bat_jax.sandbox.docker import state_to_tar
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import SandboxState
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.teacher import DoNothingPolicy, ScriptedExpert

IMAGING = ImagingBenchmark()
SEG, ENH, VQA, CLS = (get_track(n) for n in ("segmentation", "enhancement", "vqa", "classification"))


class _Script:
    """A policy that plays fixed actions, then stops."""

    def __init__(self, actions):
        self.actions = list(actions)

    def __call__(self, conv):
        return self.actions[len(conv.turns)] if len(conv.turns) < len(self.actions) else None


def _py(code):
    return Action("", "execute_code", {"language": "python", "code": code})


def _bash(code):
    return Action("", "execute_code", {"language": "bash", "code": code})


def _submit(path):
    return Action("", "submit", {"path": path})


def _gzip_of(head: bytes, zeros: int) -> bytes:
    """gzip of `head` followed by `zeros` zero bytes, compressed in chunks (no buffer of the inflated size)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(head)]
    chunk = bytes(1 << 20)
    while zeros > 0:
        out.append(z.compress(chunk[:min(zeros, len(chunk))]))
        zeros -= len(chunk)
    return b"".join(out) + z.flush()


def nifti_bomb(shape=(400, 400, 400)) -> bytes:
    """A gzip'd float32 NIfTI of zeros of `shape` (400³: ~250 kB that inflate to 256 MB)."""
    import nibabel as nib

    header = nib.Nifti1Header()
    header.set_data_dtype(np.float32)
    header.set_data_shape(shape)
    header.set_data_offset(352)  # a single-file .nii: data after the header and 4 extension bytes
    head = header.binaryblock + b"\0" * 4
    return _gzip_of(head, int(np.prod(shape)) * 4)


# ---- 1. a file name cannot turn a failure into "unscored" ----------------------------------------------------
def test_odd_but_legal_names_are_workspace_paths_in_every_backend():
    """'..x', '...' and 'a/..b' are names inside the workspace; only a '..' part leaves it."""
    from bat_jax.sandbox.local import _safe_relpath
    from bat_jax.sandbox.types import workspace_relpath

    legal = ["..x", "...", "a/..b", ".hidden", "x..", "a/./b"]
    assert [workspace_relpath(p) for p in legal] == ["..x", "...", "a/..b", ".hidden", "x..", "a/b"]
    assert [str(_safe_relpath(p)) for p in legal] == ["..x", "...", "a/..b", ".hidden", "x..", "a/b"]
    tar = state_to_tar(SandboxState(files={p: b"v" for p in legal[:5]}))  # the Docker restore path
    assert len(tar) > 0
    for bad in ["..", "../x", "a/../../x", "/etc/passwd", "", ".", "a\0b"]:
        with pytest.raises(ValueError):
            workspace_relpath(bad)
        with pytest.raises(ValueError):
            state_to_tar(SandboxState(files={bad: b"v"}))


@pytest.mark.parametrize("name", ["..x", "...", "..x/..y"])
def test_an_odd_name_does_not_make_an_honest_failure_unscored(factory, name):
    inst = SEG.generate(5, "success")
    base = play(IMAGING, inst, _Script([_bash("cat task.md")]), make_sandbox=factory).score
    parent = name.rsplit("/", 1)[0] if "/" in name else ""
    code = f"cat task.md; {'mkdir -p ' + repr(parent) + '; ' if parent else ''}: > '{name}'; echo x > '{name}'"
    hit = play(IMAGING, inst, _Script([_bash(code)]), make_sandbox=factory)
    assert not hit.evidence.infra_error and hit.evidence.files[name] == b"x\n"
    assert hit.score.reward is not None and hit.score.reward == pytest.approx(base.reward)
    assert base.reward == pytest.approx(1 / 72)  # S1 = η 1/3 · items 1/3; E2E = 1/2 · 0.25 · (1/9) + 1/2 · 0


@pytest.mark.docker
def test_an_odd_name_reads_back_from_docker_and_through_the_agent_loop():
    from bat_jax.models.chat import render_action
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.models.tokenizer import load_tiny_tokenizer
    from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutRequest
    from bat_jax.rollout.sampling import SamplingConfig
    from bat_jax.rollout.engine import Completion
    from bat_jax.sandbox.backends import backend_factory

    tok = load_tiny_tokenizer()
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    turn = tok.encode(render_action(_bash(": > ..x; mkdir -p ...; echo 1 > .../..y"), "qwen3_5"),
                      add_special_tokens=False) + [eot]

    class OneTurn:
        def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
            return [Completion(np.asarray(turn, np.int32), np.zeros(len(turn), np.float32), "stop", 0)
                    for _ in prompts]

    loop = AgentLoop(OneTurn(), lambda: EpisodeBuilder(tok, "qwen3_5"), backend_factory("docker"),
                     AgentLoopConfig(sampling=SamplingConfig(group_size=1), max_assistant_turns=1, progress=False))
    request = RolloutRequest("row", SandboxState(files={"task.md": b"T"}), "sys", "user")
    (traj,) = loop.run([request])
    assert not traj.infra_error and not traj.agent_error, traj.infra_error
    assert traj.artefacts == {"..x": b"", ".../..y": b"1\n"}


# ---- 2. agent-written content cannot crash the host scorer ----------------------------------------------------
def _deep_json(depth: int) -> bytes:
    return b'{"task_id": ' + b"[" * depth + b"]" * depth + b"}"


ODD_SUBMISSIONS = {
    "nested_100k": lambda inst: _deep_json(100_000),
    "nested_900": lambda inst: b'{"task_id": "x", "predictions": {"' + inst.case_ids[0].encode() + b'": '
                               + b"[" * 900 + b"]" * 900 + b"}}",
    "5000_digit_int": lambda inst: b'{"predictions": {}, "task_id": ' + b"7" * 5000 + b"}",
    "nan_literal": lambda inst: b'{"predictions": {"' + inst.case_ids[0].encode() + b'": {"mask": NaN}}}',
    "not_utf8": lambda inst: b'{"task_id": "\xff\xfe"}',
    "huge_float": lambda inst: b'{"predictions": {"' + inst.case_ids[0].encode() + b'": {"mask": 1e999}}}',
}


@pytest.mark.parametrize("kind", list(ODD_SUBMISSIONS))
def test_odd_submission_json_scores_zero_and_never_raises(kind):
    inst = SEG.generate(5, "success")
    data = ODD_SUBMISSIONS[kind](inst)
    files = {**inst.files, inst.layout.submission: data}
    assert SEG.score_task(inst, files, inst.layout.submission) == 0.0
    errors = SEG.check_submission(inst, data, files)
    assert errors and all(len(e) < 400 for e in errors)


def test_deep_submission_through_play_and_the_rollout_scorer():
    """The whole episode: an agent writes a 100,000-deep submission and submits it; `play` and the GRPO scorer
    both give a finite reward (this episode's E2E reward), and the batch's other rollout is scored too."""
    from doubles import reward_row

    from bat_jax.benchmarks.imaging import heldout
    from bat_jax.bicurl.reward import RolloutScorer

    inst = heldout.training_task(SEG, 5, "success", 0)
    L = inst.layout
    write = _py(f"import os\nos.makedirs('{L.outputs_dir}', exist_ok=True)\n"
                f"open('{L.submission}', 'w').write('{{\"task_id\": ' + '[' * 100000 + ']' * 100000 + '}}')")
    result = play(IMAGING, inst, _Script([write, _submit(L.submission)]))
    # S5's evidence (file, submit call) is confirmed, but every S5 item needs the submitted entries to be the
    # method's predictions, and an unreadable submission has none: all three fail, reward 0
    s5 = result.score.verdicts["S5"]
    assert s5.eta == 1.0 and not any(s5.items.values())
    assert result.score.task == 0.0 and result.score.reward == 0.0
    z = np.zeros(2, np.int32)
    traj = Trajectory("s", 0, E2E, z, z, np.zeros(2, np.float32), 1, "submitted", False, 1, 2, 2,
                      receipts=tuple(result.evidence.receipts), submitted=L.submission,
                      artefacts={L.submission: result.evidence.files[L.submission]})
    idle = dataclasses.replace(traj, episode=1, receipts=(), artefacts={}, submitted=None)
    with RolloutScorer([reward_row(5, E2E, track="segmentation")] * 2, [inst.state()] * 2, IMAGING) as scorer:
        scorer.submit(1, idle)
        scorer.submit(0, traj)
        got = scorer.results()
    assert got[0].reward == pytest.approx(result.score.reward) and got[1].reward == 0.0
    assert not got[0].error and not got[1].error


# ---- 3. a finite prediction never becomes a NaN reward --------------------------------------------------------
@pytest.mark.parametrize("value", [1e200, -1e300, 1.7e308, 3e38])
def test_huge_finite_predictions_give_finite_metrics_and_rewards(value):
    inst = ENH.generate(3, "success")
    L = inst.layout
    files = dict(inst.files)
    preds = {}
    for case in inst.cases:
        buf = io.BytesIO()
        np.save(buf, np.full(case.target.shape, value, np.float64))
        files[f"{L.pred_dir}/{case.case_id}.npy"] = buf.getvalue()
        preds[case.case_id] = {"image": f"{L.pred_dir}/{case.case_id}.npy"}
    files[L.submission] = json.dumps({"task_id": inst.task_id, "predictions": preds}).encode()
    task = ENH.score_task(inst, files, L.submission)
    assert task == pytest.approx(0.0, abs=1e-6)
    from bat_jax.benchmarks.imaging.metrics import psnr, ssim

    target = inst.cases[0].target
    assert math.isfinite(ssim(target, np.full(target.shape, value), 1.0))
    assert math.isfinite(psnr(target, np.full(target.shape, value), 1.0))
    from bat_jax.benchmarks.imaging.rubric import build_rubric
    from bat_jax.verify.rubric import Evidence, score

    reward = score(build_rubric(ENH, inst), Evidence((), files, L.submission), task).reward
    assert math.isfinite(reward)


def test_ssim_of_huge_values_is_the_metric_not_round_off():
    """A test image of huge alternating values has no structure in common with the reference: SSIM ~ 0, not
    the 1.0 a float-overflow NaN or a round-off ratio could give."""
    from bat_jax.benchmarks.imaging.metrics import box_iou, ssim

    rng = np.random.default_rng(0)
    ref = rng.uniform(0, 1, (32, 32))
    for big in (1e15, 1e100, 1e300):
        test = np.where(rng.uniform(size=(32, 32)) > 0.5, big, -big)
        assert 0.0 <= ssim(ref, test, 1.0) < 1e-3
        assert ssim(ref, ref + 0.0 * big, 1.0) == pytest.approx(1.0)
    assert box_iou([0, 0, 1e300, 1e300], [0, 0, 1e300, 5e299]) == pytest.approx(0.5)
    assert box_iou([0, 0, 2, 2], [1, 1, 3, 3]) == pytest.approx(1 / 7)


# ---- 4. model output cannot crash the rollout loop ----------------------------------------------------------------
BAD_TURNS = {
    "brackets_1000": "<tool_call>" + "[" * 1000 + "</tool_call>",
    "brackets_unclosed": "<tool_call>" + "[" * 1000,
    "braces_50000": "<tool_call>" + '{"a":' * 50000 + "</tool_call>",
    "digits_5000": '<tool_call>{"name": "submit", "arguments": {"path": ' + "9" * 5000 + "}}</tool_call>",
    "args_string_deep": '<tool_call>{"name": "submit", "arguments": "' + "[" * 5000 + '"}</tool_call>',
}


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "chatml"])
@pytest.mark.parametrize("kind", list(BAD_TURNS))
def test_parse_tool_call_is_total(family, kind):
    from bat_jax.models.chat import ParseError, parse_tool_call

    got = parse_tool_call(BAD_TURNS[kind], family)
    assert isinstance(got, ParseError) and got.kind in ("malformed", "bad_arguments", "no_tool_call")


def test_a_crashing_turn_ends_one_episode_never_the_batch():
    """Two episodes in one batch: one model writes a tool call nested 1,000 deep, the other a normal call; both
    finish. A turn whose processing raises (here: a builder that cannot take it) ends its own episode only."""
    from doubles import EOT, REQUEST, ScriptedEngine, StubBuilder, WordTokenizer, FakeSandbox

    from bat_jax.rollout import trajectory as tj
    from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig
    from bat_jax.rollout.sampling import SamplingConfig

    tok = WordTokenizer()
    tok.pieces[20] = BAD_TURNS["brackets_1000"]

    first = int(np.random.SeedSequence([42, 0, 0]).generate_state(1)[0])  # episode (0, 0)'s seed (run's seed 42)
    bad_seeds = {int(np.random.SeedSequence([first, turn]).generate_state(1)[0]) for turn in range(3)}

    class PerRow(ScriptedEngine):
        """Episode 0 writes the bad turn, episode 1 the normal call (told apart by their per-turn seeds)."""

        def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
            out = super().generate(prompts, params, max_new_tokens=max_new_tokens, seeds=seeds)
            return [dataclasses.replace(c, token_ids=np.asarray([20, EOT], np.int32)) if seed in bad_seeds else c
                    for c, seed in zip(out, seeds)]

    class Breaks(StubBuilder):
        def add_tool_response(self, text):
            if "tool call error" in text:
                raise RuntimeError("cannot tokenise this")
            return super().add_tool_response(text)

    config = AgentLoopConfig(sampling=SamplingConfig(group_size=2), max_assistant_turns=3, progress=False)
    trajs = AgentLoop(PerRow([[10, EOT]]), lambda: StubBuilder(tok), FakeSandbox, config).run([REQUEST])
    assert [t.finish_reason for t in trajs] == [tj.FINISH_MAX_TURNS] * 2
    tool_messages = [m["content"] for m in trajs[0].messages if m["role"] == "tool"]
    assert len(tool_messages) == 2 and all(m.startswith("[tool call error]") for m in tool_messages)
    assert trajs[0].num_tool_calls == 0 and trajs[1].num_tool_calls == 3
    trajs = AgentLoop(PerRow([[10, EOT]]), lambda: Breaks(tok), FakeSandbox, config).run([REQUEST])
    assert trajs[0].finish_reason == tj.FINISH_INVALID_TURN and "RuntimeError" in trajs[0].agent_error
    assert not trajs[0].infra_error and trajs[1].finish_reason == tj.FINISH_MAX_TURNS


def test_a_failed_engine_call_ends_its_episodes_unscored_not_the_batch():
    from doubles import REQUEST, ScriptedEngine, StubBuilder, WordTokenizer, FakeSandbox

    from bat_jax.rollout import trajectory as tj
    from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig
    from bat_jax.rollout.sampling import SamplingConfig

    class Dies(ScriptedEngine):
        def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
            raise RuntimeError("engine gone")

    for schedule in ("continuous", "lockstep"):
        config = AgentLoopConfig(sampling=SamplingConfig(group_size=2), progress=False, schedule=schedule)
        trajs = AgentLoop(Dies([[10]]), lambda: StubBuilder(WordTokenizer()), FakeSandbox, config).run([REQUEST])
        assert [t.finish_reason for t in trajs] == [tj.FINISH_ENGINE_ERROR] * 2
        assert all("engine gone" in t.infra_error and not t.scored for t in trajs)


# ---- 5. decompression bombs cost the host no more than the caps -------------------------------------------------
def _bomb_submission(inst, bomb_name, bomb):
    L = inst.layout
    files = dict(inst.files)
    files[f"{L.pred_dir}/{bomb_name}"] = bomb
    preds = {c: {"mask": f"{L.pred_dir}/{bomb_name}"} for c in inst.case_ids}
    files[L.submission] = json.dumps({"task_id": inst.task_id, "predictions": preds}).encode()
    for c in inst.case_ids:
        files[f"{L.pred_dir}/{c}.json"] = json.dumps(preds[c]).encode()
    return files


def test_a_nifti_decompression_bomb_costs_the_host_nothing():
    from bat_jax.benchmarks.imaging.rubric import build_rubric
    from bat_jax.verify.rubric import Evidence, score

    inst = SEG.generate(5, "success")
    bomb = nifti_bomb()
    assert len(bomb) < 300_000
    files = _bomb_submission(inst, "bomb.nii.gz", bomb)
    tracemalloc.start()
    try:
        task = SEG.score_task(inst, files, inst.layout.submission)
        verdicts = score(build_rubric(SEG, inst), Evidence((), files, inst.layout.submission), task)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert task == 0.0 and verdicts.reward is not None
    assert peak < 16 << 20, f"scoring a 400³ NIfTI bomb peaked at {peak / 2**20:.0f} MiB"


# ---- 6. "the method ran" cannot be guessed ----------------------------------------------------------------------
def _vqa_constant_answers(inst, out_dir, only_first=False):
    """Reads model.py and an input with read(), then writes a constant answer per question type."""
    L = inst.layout
    return _py(f"import csv, json, os\nopen('{L.method_dir}/model.py').read()\n"
               f"open('{inst.cases[0].file}', 'rb').read()\nos.makedirs('{out_dir}', exist_ok=True)\n"
               "const = {'how many': 'two', 'left or': 'left', 'upper half': 'yes'}\n"
               f"rows = list(csv.DictReader(open('{L.cases_csv}')))\n"
               f"for r in rows[:{1 if only_first else 'None'}]:\n"
               "    a = next(v for k, v in const.items() if k in r['question'].lower())\n"
               f"    json.dump({{'answer': a}}, open('{out_dir}/' + r['case_id'] + '.json', 'w'))\n")


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_constant_answers_are_not_a_smoke_run(seed):
    inst = VQA.generate(seed, "success")
    for only_first in (False, True):
        result = play(IMAGING, inst, _Script([_vqa_constant_answers(inst, inst.layout.validation_dir, only_first)]),
                      focus="S3")
        assert result.evidence.receipts[0].exit_code == 0
        verdict = result.score.verdicts[Stage.VALIDATE]
        assert verdict.evidence["receipt.smoke_run"] is False and verdict.items["validate.smoke_run"] is False


def test_the_right_answer_alone_is_not_the_methods_output():
    """Even the correct answer (taken here from the hidden key: the luckiest guess) is not the method's output:
    the method's entry also holds the measurements it answered from, which only running it gives."""
    from bat_jax.benchmarks.imaging.method_replay import (GUESS_BITS, case_matches, guessable, information_bits,
                                                          method_output)

    inst = VQA.generate(3, "success")
    for case in inst.cases:
        values, arrays = method_output(inst, case.case_id)
        assert values["answer"] == case.target and not arrays and not guessable(inst, case.case_id)
        assert case_matches(inst, case.case_id, {"answer": case.target}, inst.files) is False
        assert case_matches(inst, case.case_id, values, inst.files) is True
    # an answer with a count and a round number: 4 + log2(5) + log2(27) + 1 bits, far too few to prove anything
    assert information_bits({"answer": "two", "n": 3, "x": 0.25, "ok": True}) == pytest.approx(
        4 + math.log2(5) + math.log2(27) + 1)
    assert information_bits({"answer": "two", "n": 3, "x": 0.25, "ok": True}) < GUESS_BITS
    assert information_bits([0.1234, 0.5678]) > GUESS_BITS  # two values pinned to ±1e-4
    assert information_bits(np.zeros((16, 16, 8))) == 1.0 and information_bits(np.eye(3)) == math.inf
    det = get_track("detection")
    inst = det.generate(2, "success")
    assert not any(guessable(inst, c) for c in inst.case_ids)  # integer boxes and their scores: ~30+ bits each


# ---- 7. "all cases predicted" needs every case's content ------------------------------------------------------
def _seg_run(inst, cids, out_dir, zero_cids=()):
    L = inst.layout
    return _py(f"import csv, os, sys\nsys.path.insert(0, '{L.method_dir}')\nimport model, numpy as np, nibabel as nib\n"
               f"rows = {{r['case_id']: r for r in csv.DictReader(open('{L.cases_csv}'))}}\n"
               f"for cid in {list(cids)!r}:\n"
               "    r = rows[cid]\n"
               f"    model.save_prediction(model.predict(model.load_input(r['file']), r, model.load_config()), "
               f"'{out_dir}', cid)\n"
               f"for cid in {list(zero_cids)!r}:\n"
               f"    x = model.load_input(rows[cid]['file'])\n"
               f"    model.save_prediction(np.zeros(x.shape, np.int16), '{out_dir}', cid)\n")


def test_one_real_case_and_zero_masks_is_not_every_case_predicted(factory):
    inst = SEG.generate(8, "success")
    L, cids = inst.layout, inst.case_ids
    honest = play(IMAGING, inst, _Script([_seg_run(inst, cids, L.pred_dir)]), focus="S4", make_sandbox=factory)
    assert honest.score.reward == pytest.approx(1.0)
    real, zero = cids[1:2], cids[:1] + cids[2:]  # cids[0] is the smoke case: its output is in the start state
    same_call = play(IMAGING, inst, _Script([_seg_run(inst, real, L.pred_dir, zero)]), focus="S4", make_sandbox=factory)
    v = same_call.score.verdicts[Stage.INFERENCE]
    assert v.evidence["receipt.inference"] is False and v.reward == 0.0  # a forged entry next to a real one
    two_calls = play(IMAGING, inst, _Script([_seg_run(inst, real, L.pred_dir), _seg_run(inst, [], L.pred_dir, zero)]),
                     focus="S4", make_sandbox=factory)
    v = two_calls.score.verdicts[Stage.INFERENCE]
    assert v.items == {"inference.ran": True, "inference.all_usable": False} and v.reward == pytest.approx(0.5)


def test_a_recovery_fault_needs_the_methods_output_on_the_correct_input():
    """'spacing' fault: a mask on the right grid that is not the method's output (here all background) does not
    handle the fault, nor does the method's output on the unrepaired input; the method on the repaired one does."""
    from bat_jax.benchmarks.imaging.method_replay import case_matches, method_outputs

    inst = next(i for i in (SEG.generate(s, "recovery") for s in range(40)) if i.fault.kind == "spacing")
    cid = inst.fault.case_id
    outs = method_outputs(inst, cid)
    assert len(outs) == 2 and outs[0][1]["mask"].shape == inst.case(cid).target.shape
    assert outs[1][1]["mask"].shape != outs[0][1]["mask"].shape  # as given: resampled to the wrong grid
    import nibabel as nib

    def entry(mask):
        return {f"p/{cid}.nii.gz": gzip.compress(nib.Nifti1Image(mask.astype(np.int16), np.eye(4)).to_bytes())}

    zeros = entry(np.zeros_like(outs[0][1]["mask"]))
    right = entry(outs[0][1]["mask"])
    assert case_matches(inst, cid, {"mask": f"p/{cid}.nii.gz"}, zeros) is False
    assert case_matches(inst, cid, {"mask": f"p/{cid}.nii.gz"}, right, correct_only=True) is True
    assert case_matches(inst, cid, {"mask": f"p/{cid}.nii.gz"}, entry(outs[1][1]["mask"]), correct_only=True) is False


# ---- 8. a copy of earlier genuine output is not this call's method run ---------------------------------------------
def _copies(inst):
    """Calls that read model.py and a case input, then put the smoke run's output (already in the S4 start
    state) into the prediction directory: a byte copy, a re-encoded copy, a copy staged through /tmp."""
    L = inst.layout
    cid = inst.case_ids[0]
    v, p = f"{L.validation_dir}/{cid}", f"{L.pred_dir}/{cid}"
    head = f"cat {L.method_dir}/model.py {inst.case(cid).file} > /dev/null; mkdir -p {L.pred_dir}; "
    return {
        "byte_copy": [_bash(head + f"cp {v}.nii.gz {p}.nii.gz; echo '{{\"mask\": \"{p}.nii.gz\"}}' > {p}.json")],
        "reencoded": [_py(f"import json, os, nibabel as nib, numpy as np\nopen('{L.method_dir}/model.py').read()\n"
                          f"open('{inst.case(cid).file}', 'rb').read()\nos.makedirs('{L.pred_dir}', exist_ok=True)\n"
                          f"m = np.asarray(nib.load('{v}.nii.gz').dataobj).astype(np.int32)\n"
                          f"nib.save(nib.Nifti1Image(m, np.eye(4)), '{p}.nii.gz')\n"
                          f"json.dump({{'mask': '{p}.nii.gz'}}, open('{p}.json', 'w'), indent=2)")],
        "staged_in_tmp": [_bash(f"cp {v}.nii.gz /tmp/m.nii.gz"),
                          _bash(head + f"cp /tmp/m.nii.gz {p}.nii.gz; echo '{{\"mask\": \"{p}.nii.gz\"}}' > {p}.json")],
    }


@pytest.mark.parametrize("kind", ["byte_copy", "reencoded", "staged_in_tmp"])
def test_copying_the_smoke_runs_output_is_not_inference(factory, kind):
    inst = SEG.generate(8, "success")
    result = play(IMAGING, inst, _Script(_copies(inst)[kind]), focus="S4", make_sandbox=factory)
    assert f"{inst.layout.validation_dir}/{inst.case_ids[0]}.nii.gz" in result.start_state.files
    assert all(r.exit_code == 0 for r in result.evidence.receipts)
    v = result.score.verdicts[Stage.INFERENCE]
    assert v.evidence["receipt.inference"] is False and v.reward == 0.0


def test_a_reserialised_json_entry_copy_is_not_inference():
    """JSON-only outputs: the smoke run's entry is in the start state (its file and the validation report);
    written again with other whitespace, key order or through the report's 'entry', it earns nothing."""
    inst = CLS.generate(5, "success")
    L, cid = inst.layout, inst.case_ids[0]
    code = (f"import json, os\nopen('{L.method_dir}/model.py').read(); open('{inst.case(cid).file}', 'rb').read()\n"
            f"os.makedirs('{L.pred_dir}', exist_ok=True)\ne = json.load(open('{L.validation_json}'))['entry']\n"
            f"json.dump(dict(reversed(list(e.items()))), open('{L.pred_dir}/{cid}.json', 'w'), indent=3)")
    result = play(IMAGING, inst, _Script([_py(code)]), focus="S4")
    assert result.evidence.receipts[0].exit_code == 0
    assert result.score.verdicts[Stage.INFERENCE].evidence["receipt.inference"] is False


def test_an_honest_rerun_of_the_smoke_case_still_counts():
    """The smoke case run again by the method in S4 is the method's own output of this call (a reduced task
    whose only usable case is the smoke case): novel because the call did not read the earlier output."""
    from bat_jax.staged_benchmark.contract import Reduction
    from bat_jax.benchmarks.imaging import e2e_reduce

    inst = SEG.generate(6, "failure")
    reduced, _ = e2e_reduce.reduce_task(SEG, inst, Reduction(cases=2), 0)
    assert len(reduced.recoverable_ids()) == 1
    result = play(IMAGING, reduced, ScriptedExpert())
    assert {s: v.reward for s, v in result.score.verdicts.items()} == {s: 1.0 for s in ("S1", "S2", "S3", "S4", "S5")}


def test_idle_policy_is_scored_zero_not_unscored(factory):
    inst = SEG.generate(5, "success")
    result = play(IMAGING, inst, DoNothingPolicy(), make_sandbox=factory)
    assert result.score.reward == 0.0


# ---- a stall found while trying to break the above: a turn full of closing tags -----------------------------------
STALL_TURN = ("<tool_call>\n<function=execute_code>\n<parameter=language>\n" + "</parameter>\n<parameter=code>\n" * 1500
              + "</parameter>\n</function>\n</tool_call>" * 600)


def test_a_turn_full_of_closing_tags_cannot_stall_the_parser():
    """The XML reading of a call tries, for every </tool_call>, every </parameter> before it, each a pass over
    the text: 67 kB of such tags took the parser 78 s of the agent loop's main thread (every episode waits).
    Past `MAX_XML_WORK` the turn is a malformed call at once; a call with tags inside its code still reads byte
    for byte, and the costliest turn under the bound reads in about a second."""
    import time

    from bat_jax.models.chat import MAX_XML_WORK, ParseError, _xml_work, parse_tool_call, render_action

    t0 = time.monotonic()
    got = parse_tool_call(STALL_TURN, "qwen3_5")
    assert time.monotonic() - t0 < 1.0
    assert isinstance(got, ParseError) and got.kind == "malformed" and "too many ways" in got.message
    code = "print('</parameter>\\n<parameter=language>\\n</tool_call>') # " + "</parameter>" * 20
    action = Action("t", "execute_code", {"language": "python", "code": code})
    assert parse_tool_call(render_action(action, "qwen3_5"), "qwen3_5") == action
    head = "<tool_call>\n<function=execute_code>\n<parameter=language>\n"
    for a, b in [(2500, 2), (700, 8), (200, 30)]:  # just under the bound: the worst readings that are tried
        text = head + "</parameter>\n<parameter=code>\n" * a + "</parameter>\n</function>\n</tool_call>" * b
        ends = [i for i in range(len(text)) if text.startswith("</tool_call>", i)]
        assert _xml_work(text, len("<tool_call>"), ends) <= MAX_XML_WORK
        t0 = time.monotonic()
        assert isinstance(parse_tool_call(text, "qwen3_5"), ParseError)
        assert time.monotonic() - t0 < 3.0


def test_a_scorer_exception_is_the_agents_failure_and_a_rebuild_failure_is_unscored(monkeypatch):
    """One rule for blame in the GRPO scorer: an exception while reading or scoring the rollout's artefacts gives
    reward 0 (with the error), one before them (the row's task cannot be rebuilt) leaves it unscored; the
    batch's other rollouts are scored either way."""
    from doubles import reward_row, reward_trajectory

    from bat_jax.benchmarks.imaging import heldout
    from bat_jax.bicurl import reward as row_reward
    from bat_jax.bicurl.reward import RolloutScorer

    task = heldout.training_task(VQA, 3, "success", 0)
    rows, trajs = [reward_row(3, "E2E")] * 3, [reward_trajectory(task, "E2E", k) for k in (1, 2, 3)]
    with RolloutScorer(rows, [task.state()] * 3, IMAGING) as scorer:
        for i, t in enumerate(trajs):
            scorer.submit(i, t)
        plain = scorer.results()
    broken = type(VQA).score_task

    def flaky(self, inst, files, submitted, limits=None):
        if submitted is not None:
            raise MemoryError("a reader that was not total")
        return broken(self, inst, files, submitted, limits)

    monkeypatch.setattr(type(VQA), "score_task", flaky)
    with RolloutScorer(rows, [task.state()] * 3, IMAGING) as scorer:
        for i, t in enumerate(trajs):
            scorer.submit(i, t)
        got = scorer.results()
    assert got[1].reward == 0.0 and "MemoryError" in got[1].error  # trajectory 2 submitted
    assert [g.reward for g in (got[0], got[2])] == [plain[0].reward, plain[2].reward]
    monkeypatch.setattr(row_reward, "row_task",
                        lambda row, benchmark: (_ for _ in ()).throw(KeyError("no such track")))
    with RolloutScorer(rows, [task.state()] * 3, IMAGING) as scorer:
        for i, t in enumerate(trajs):
            scorer.submit(i, t)
        got = scorer.results()
    assert all(g.reward is None and "KeyError" in g.error for g in got)
