"""The simulated-latency engine (rollout/simulated_engine.py): its cost model on hand-computed calls, and the
wrapper's timing with an injected clock (no real sleeps)."""

import numpy as np
import pytest

from bat_jax.rollout.engine import Completion, SamplingParams
from bat_jax.rollout.simulated_engine import SimulatedLatency, SimulatedLatencyEngine


def test_cost_model_hand_computed():
    lat = SimulatedLatency(prefill_s=0.05, decode_s_per_step=0.03)
    # one wave: prefill + 30 ms x the longest completion (10 tokens), whatever the number of rows
    assert lat.call_seconds([100], [10]) == pytest.approx(0.05 + 0.30)
    assert lat.call_seconds([100] * 32, [10] + [1] * 31) == pytest.approx(0.35)
    assert lat.call_seconds([], []) == 0.0
    # waves of 2 rows: [4, 9] and [2]: 2 prefills + (9 + 2) steps; per-token prefill on 3 x 100 tokens
    lat = SimulatedLatency(prefill_s=0.1, prefill_s_per_token=0.001, decode_s_per_step=0.02, max_batch=2)
    assert lat.call_seconds([100, 100, 100], [4, 9, 2]) == pytest.approx(2 * 0.1 + 0.3 + 11 * 0.02)
    with pytest.raises(ValueError, match="2 prompt lengths but 1"):
        lat.call_seconds([1, 2], [3])
    with pytest.raises(ValueError, match="SimulatedLatency.decode_s_per_step"):
        SimulatedLatency(decode_s_per_step=-1)


class FakeClock:
    def __init__(self):
        self.now, self.sleeps = 100.0, []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


class Inner:
    """Returns rows of the given lengths; each call advances the fake clock by `own_s` (its own compute)."""

    weight_version = 7

    def __init__(self, clock, lengths, own_s):
        self.clock, self.lengths, self.own_s = clock, lengths, own_s

    def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
        self.clock.now += self.own_s
        return [Completion(np.zeros(n, np.int32), np.zeros(n, np.float32), "stop", 7) for n in self.lengths]

    def update_weights(self, params):
        return 8


def test_wrapper_sleeps_the_modelled_cost_minus_the_inner_time():
    clock = FakeClock()
    engine = SimulatedLatencyEngine(Inner(clock, [5, 20], own_s=0.1), SimulatedLatency(0.05, 0.0, 0.03),
                                    clock=clock, sleep=clock.sleep)
    out = engine.generate([[1, 2], [3]], SamplingParams(), seeds=[0, 1])
    assert [len(c.token_ids) for c in out] == [5, 20]
    assert clock.sleeps == [pytest.approx(0.05 + 20 * 0.03 - 0.1)]  # modelled 0.65 s, inner took 0.1 s
    assert clock.now == pytest.approx(100.65)
    assert (engine.calls, engine.rows) == (1, 2)
    assert engine.modelled_s == pytest.approx(0.65) and engine.busy_s == pytest.approx(0.65)
    # an inner engine slower than the model: no sleep, the call takes the inner time
    slow = SimulatedLatencyEngine(Inner(clock, [1], own_s=2.0), clock=clock, sleep=clock.sleep)
    slow.generate([[1]], SamplingParams())
    assert len(clock.sleeps) == 1 and slow.busy_s == pytest.approx(2.0) and slow.modelled_s == pytest.approx(0.08)
    assert slow.weight_version == 7 and slow.update_weights(None) == 8


@pytest.mark.parametrize("inflight", [False, True])
def test_concurrent_calls_queue_on_one_device_and_overlap_in_flight(inflight):
    """Two threads call at once; the inner engine of each call waits (up to 0.5 s) for the other call to start.
    One device (inflight=False): the second call starts only after the first, so the waits time out; a server
    batching in flight: both calls run together. Outcomes, not times, are asserted (no modelled latency)."""
    import threading

    started = threading.Barrier(2)
    met = []

    class Waiting:
        weight_version = 0

        def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
            try:
                started.wait(timeout=0.5)
                met.append(True)
            except threading.BrokenBarrierError:
                met.append(False)
            return [Completion(np.zeros(1, np.int32), np.zeros(1, np.float32), "stop") for _ in prompts]

    engine = SimulatedLatencyEngine(Waiting(), SimulatedLatency(0.0, 0.0, 0.0, inflight=inflight))
    threads = [threading.Thread(target=engine.generate, args=([[1]], SamplingParams())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert met == ([True, True] if inflight else [False, False])
    assert (engine.calls, engine.rows) == (2, 2)
