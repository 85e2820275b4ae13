"""Credit is tied to the episode's own work at every stage: S5's items pay only for submitted entries that are the
method's predictions (the start state's or this episode's, compared by content with the host's replay), and a case
the task declares unrecoverable never scores above declaring it failed."""

import dataclasses
import json

import pytest

from bat_jax.benchmark.stages import E2E
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import TRACKS, get_track

IMAGING = ImagingBenchmark()


def _with_submission(evidence, path: str, sub: dict):
    files = dict(evidence.files)
    files[path] = json.dumps(sub).encode()
    return dataclasses.replace(evidence, files=files)


@pytest.fixture(scope="module", params=sorted(TRACKS))
def s5_episode(request):
    """The scripted expert's S5 episode of one task per track (from the teacher's S4 boundary state)."""
    task = get_track(request.param).generate(11, "success")
    result = play(IMAGING, task, IMAGING.teacher("scripted"), focus="S5")
    return task, result


def test_a_submission_of_one_answer_for_every_case_earns_no_s5_credit(s5_episode):
    """The constant answer (every case given the first case's entry, e.g. 'no' for every VQA question) passes the
    format checker, covers every case and is submitted, but its entries are not the method's predictions."""
    task, honest = s5_episode
    L = task.layout
    assert honest.score.reward == 1.0  # the honest S5 episode: every S5 item
    sub = json.loads(honest.evidence.files[L.submission])
    first = sub["predictions"][task.case_ids[0]]
    assert any(e != first for e in sub["predictions"].values())  # the forgery changes something
    forged = dict(sub, predictions={cid: first for cid in sub["predictions"]})
    evidence = _with_submission(honest.evidence, L.submission, forged)
    assert not get_track(task.track).check_submission(task, evidence.files[L.submission], evidence.files)
    out = IMAGING.score_episode(task, evidence, "S5")
    assert out.verdicts["S5"].eta == 1.0 and out.verdicts["S5"].items == {
        "submit.schema": False, "submit.complete": False, "submit.submitted": False}
    assert out.reward == 0.0


def test_the_honest_submission_still_earns_every_s5_item_and_a_reordered_one_too(s5_episode):
    task, honest = s5_episode
    L = task.layout
    sub = json.loads(honest.evidence.files[L.submission])
    reordered = dict(sub, predictions=dict(reversed(list(sub["predictions"].items()))))
    out = IMAGING.score_episode(task, _with_submission(honest.evidence, L.submission, reordered), "S5")
    assert out.reward == 1.0


@pytest.mark.parametrize("track", ["enhancement", "synthesis", "segmentation", "vqa", "detection"])
def test_a_made_up_answer_for_the_unrecoverable_case_scores_as_declaring_it_failed(track):
    """Copying another case's output to the case without a recoverable input (prediction directory clean) used to
    add its metric to the task score; now the case scores as failed whatever is submitted for it."""
    t = get_track(track)
    task = t.generate(11, "failure")
    honest = play(IMAGING, task, IMAGING.teacher("scripted"))
    L = task.layout
    bad = task.fault.case_id
    sub = json.loads(honest.evidence.files[L.submission])
    assert bad in sub["failed"] and bad not in sub["predictions"]
    donor = next(c for c in task.recoverable_ids() if c in sub["predictions"])
    forged = dict(sub, predictions={**sub["predictions"], bad: sub["predictions"][donor]},
                  failed={c: r for c, r in sub["failed"].items() if c != bad})
    evidence = _with_submission(honest.evidence, L.submission, forged)
    honest_task = t.score_task(task, honest.evidence.files, L.submission)
    assert t.score_task(task, evidence.files, L.submission) == honest_task
    # the unscreened metric over the forged predictions would have paid more (the escape this closes)
    preds = json.loads(evidence.files[L.submission])["predictions"]
    unscreened = t.task_metric(task, preds, evidence.files)
    assert unscreened > honest_task + 0.04 if track in ("enhancement", "synthesis", "segmentation") \
        else unscreened == honest_task  # enhancement +0.21, synthesis +0.19, segmentation +0.05 (seed 11)
    forged_score = IMAGING.score_episode(task, evidence, E2E)
    assert forged_score.task == honest_task and forged_score.reward < honest.score.reward  # S5 coverage fails too
