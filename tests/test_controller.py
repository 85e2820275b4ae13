"""BiCuRL controller: Eq. 6 patience/KL fallback and the released code's non-inferiority gate."""

import pytest

from bat_jax.curriculum.controller import (ACCEPT, FALLBACK, HOLD, POLICY_GATE, Controller, ControllerConfig,
                                           ControllerState, Evaluation, gate_failures, NonInferiorityMargins)


def run(overalls, kls=None, config=ControllerConfig()):
    c = Controller(config)
    kls = kls or [None] * len(overalls)
    return c, [c.observe(r, f"ckpt-{r}", m, kl) for r, (m, kl) in enumerate(zip(overalls, kls), start=1)]


@pytest.mark.parametrize("scale", [0.01, 1.0])  # the 0-100 numbers and the library's 0-1 scale
def test_three_consecutive_drops_fall_back_to_round_2(scale):
    c, ds = run([s * scale for s in (30, 35, 34, 33, 32)])
    assert [d.decision for d in ds] == [ACCEPT, ACCEPT, ACCEPT, ACCEPT, FALLBACK]
    assert [d.drops for d in ds] == [0, 0, 1, 2, 0]
    assert ds[4].retained_checkpoint == "ckpt-2" and ds[4].best_checkpoint == "ckpt-2"
    assert ds[4].best_overall == pytest.approx(35 * scale) and ds[4].held
    assert "3 consecutive" in ds[4].reasons[0]
    assert c.state.previous_overall == pytest.approx(35 * scale) and c.state.drops == 0


@pytest.mark.parametrize("scale", [0.01, 1.0])
def test_counter_resets_on_a_rise(scale):
    _, ds = run([s * scale for s in (30, 29, 31, 30, 29)])
    assert all(d.decision == ACCEPT for d in ds)
    assert [d.drops for d in ds] == [0, 1, 0, 1, 2]
    assert ds[-1].retained_checkpoint == "ckpt-5" and ds[-1].best_checkpoint == "ckpt-3"


def test_kl_above_tau_falls_back_whatever_the_score():
    _, ds = run([0.30, 0.35, 0.90], kls=[None, 0.02, 0.11])
    assert ds[2].decision == FALLBACK and ds[2].retained_checkpoint == "ckpt-2"
    assert ds[2].best_checkpoint == "ckpt-2" and ds[2].reasons == ("kl 0.11 > tau 0.1",)
    _, ds = run([0.30, 0.35, 0.36], kls=[None, 0.02, 0.10])  # exactly tau is not above tau
    assert ds[2].decision == ACCEPT and ds[2].best_checkpoint == "ckpt-3"
    _, ds = run([0.30, 0.35, 0.36], kls=[None, None, 0.5], config=ControllerConfig(kl_threshold=None))
    assert ds[2].decision == ACCEPT


def test_after_fallback_drops_are_counted_against_the_best():
    _, ds = run([0.30, 0.35, 0.34, 0.33, 0.32, 0.34, 0.33, 0.32, 0.31])
    # round 5 falls back to ckpt-2 (0.35); 0.34 < 0.35 starts a new run of drops
    assert [d.drops for d in ds[4:]] == [0, 1, 2, 0, 1]
    assert [d.decision for d in ds[4:]] == [FALLBACK, ACCEPT, ACCEPT, FALLBACK, ACCEPT]
    assert ds[7].retained_checkpoint == "ckpt-2"


def test_state_roundtrip_resumes_identically():
    c, _ = run([0.30, 0.35, 0.34])
    resumed = Controller(ControllerConfig(), ControllerState.from_dict(c.state.to_dict()))
    a = c.observe(4, "ckpt-4", 0.33)
    b = resumed.observe(4, "ckpt-4", 0.33)
    assert a == b and a.drops == 2


def ev(overall, task=0.5, stages=(0.5,) * 5, tracks=None):
    return Evaluation(overall, task, dict(zip(("S1", "S2", "S3", "S4", "S5"), stages)), tracks or {"vqa": 0.5})


def test_noninferiority_gate_margins():
    m = NonInferiorityMargins()
    base = ev(0.50)
    assert gate_failures(ev(0.491), base, m) == []
    assert gate_failures(ev(0.485), base, m) == ["overall fell 0.0150 > 0.01"]
    assert gate_failures(ev(0.50, task=0.46), base, m) == ["task fell 0.0400 > 0.03"]
    assert gate_failures(ev(0.50, tracks={"vqa": 0.44}), base, m) == ["track vqa fell 0.0600 > 0.05"]
    assert gate_failures(ev(0.50, stages=(0.5, 0.5, 0.46, 0.5, 0.5)), base, m) == ["stage S3 fell 0.0400 > 0.03"]
    assert gate_failures(ev(0.50, stages=(0.35, 0.5, 0.5, 0.5, 0.5)), base, m) == []  # S1/S2: only catastrophic
    assert gate_failures(ev(0.50, stages=(0.29, 0.5, 0.5, 0.5, 0.5)), base, m) == [
        "catastrophic: stage S1 fell 0.2100 > 0.2"]


def test_gate_policy_holds_and_keeps_incumbent():
    c = Controller(ControllerConfig(policy=POLICY_GATE))
    assert c.observe(1, "a", ev(0.50)).decision == ACCEPT
    d = c.observe(2, "b", ev(0.495))  # within -0.01: accepted, becomes the incumbent
    assert d.decision == ACCEPT and d.best_checkpoint == "b"
    d = c.observe(3, "c", ev(0.60, stages=(0.5, 0.5, 0.5, 0.4, 0.5)))  # S4 fell 0.10
    assert d.decision == HOLD and d.retained_checkpoint == "b" and d.reasons == ("stage S4 fell 0.1000 > 0.03",)
    d = c.observe(4, "d", ev(0.52), kl=0.2)
    assert d.decision == HOLD and d.reasons == ("kl 0.2 > tau 0.1",)


def test_bad_config_and_inputs():
    with pytest.raises(ValueError, match="patience"):
        ControllerConfig(patience=0)
    with pytest.raises(ValueError, match="policy"):
        ControllerConfig(policy="greedy")
    c = Controller()
    with pytest.raises(ValueError, match="finite"):
        c.observe(1, "a", float("nan"))
    c.observe(1, "a", 0.3)
    with pytest.raises(ValueError, match="kl must be >= 0"):
        c.observe(2, "b", 0.3, kl=-0.1)
