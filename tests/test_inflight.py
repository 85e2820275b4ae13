"""InflightDriver (bat_jax/rollout/inflight.py) on a fake step-driven engine: calls from several threads share the
running batch, a call returns when its own requests finish (not with the slowest of the batch), outputs come in
item order, an engine error fails every call in flight and the driver serves again afterwards, and `exclusive`
refuses while requests run. The real engine (vLLM) is in tests/test_vllm_engine.py."""

import threading

import pytest

from bat_jax.rollout.inflight import InflightDriver


class StepEngine:
    """A request is an int n: it finishes n steps after it joined; its output is (n, the step it finished on).
    Records the running requests at every step; `fail_at` makes that step raise."""

    def __init__(self, fail_at: int = -1, gate: threading.Event | None = None, pause_at: int = -1):
        self.running: dict[str, list[int]] = {}  # id -> [steps left, n]
        self.batches: list[set[str]] = []
        self.fail_at, self.gate, self.pause_at = fail_at, gate, pause_at
        self.paused, self.resume = threading.Event(), threading.Event()
        self.aborted: list[str] = []
        self.added: list[str] = []
        self.finished: list[str] = []

    def add(self, request_id, n):
        self.added.append(request_id)
        self.running[request_id] = [n, n]

    def step(self):
        if self.gate is not None:
            self.gate.wait(5)
        if len(self.batches) == self.pause_at:  # before this step: wait for the test
            self.paused.set()
            self.resume.wait(5)
        if len(self.batches) == self.fail_at:
            self.batches.append(set())
            raise ValueError("device lost")
        self.batches.append(set(self.running))
        done = []
        for request_id, left in list(self.running.items()):
            left[0] -= 1
            if left[0] == 0:
                done.append((request_id, (left[1], len(self.batches))))
                self.finished.append(request_id)
                del self.running[request_id]
        return done

    def abort(self, ids):
        self.aborted += ids
        for i in ids:
            self.running.pop(i, None)


def _driver(engine):
    return InflightDriver(engine.add, engine.step, engine.abort, name="fake")


def test_a_short_call_returns_while_a_long_one_runs_in_the_same_batch():
    """A long call (rows of 40 and 3 steps) runs; during its third step a short call (2 and 1 steps) comes: its
    rows join at step 4 beside the long call's 40-step row, and it returns after step 5 while that row goes on to
    step 40."""
    engine = StepEngine(pause_at=2)
    results, returned_after = {}, {}

    short_returned = threading.Event()

    def call(name, items):
        results[name] = driver.run(items)
        returned_after[name] = len(engine.batches)
        if name == "short":
            short_returned.set()

    real_step = engine.step

    def step():  # from step 10 on, the engine waits until the short call has returned
        if len(engine.batches) >= 9:
            assert short_returned.wait(5)
        return real_step()

    driver = InflightDriver(engine.add, step, engine.abort, name="fake")

    long = threading.Thread(target=call, args=("long", [40, 3]))
    long.start()
    assert engine.paused.wait(5)  # in step 3
    short = threading.Thread(target=call, args=("short", [2, 1]))
    short.start()
    while driver.in_flight() < 4:  # 2 running + 2 queued
        pass
    engine.resume.set()
    for t in (long, short):
        t.join(10)
    driver.close()
    assert results["long"] == [(40, 40), (3, 3)] and results["short"] == [(2, 5), (1, 4)]  # item order
    assert [len(b) for b in engine.batches[:5]] == [2, 2, 2, 3, 2]  # step 4: the 40-step row and the short two
    assert returned_after["short"] <= 9 and returned_after["long"] == 40  # returned long before the 40-step row


def test_an_engine_error_fails_every_call_in_flight_and_the_driver_serves_again():
    gate = threading.Event()
    engine = StepEngine(fail_at=1, gate=gate)
    driver = _driver(engine)
    errors = []

    def call(items):
        try:
            driver.run(items)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=([5],)), threading.Thread(target=call, args=([1, 7],))]
    for t in threads:
        t.start()
    while driver.in_flight() < 3:
        pass
    gate.set()
    for t in threads:
        t.join(10)
    assert len(errors) == 2
    assert all("engine step failed: ValueError: device lost" in str(e) and isinstance(e.__cause__, ValueError)
               for e in errors)
    # every row left in the engine was dropped (the 1-step row may have finished first, if it joined step 1)
    assert sorted(engine.aborted) == sorted(set(engine.added) - set(engine.finished)) and len(engine.added) == 3
    assert driver.in_flight() == 0
    assert driver.run([2]) == [(2, 4)]  # new calls are served (joined after the failed step 2: done at step 4)
    driver.close()
    with pytest.raises(RuntimeError, match="fake: the in-flight driver is closed"):
        driver.run([1])


def test_exclusive_refuses_while_requests_run():
    gate = threading.Event()
    engine = StepEngine(gate=gate)
    driver = _driver(engine)
    t = threading.Thread(target=driver.run, args=([3],))
    t.start()
    while driver.in_flight() == 0:
        pass
    with pytest.raises(RuntimeError, match="fake: update_weights while 1 requests are in flight"):
        with driver.exclusive("update_weights"):
            pass
    gate.set()
    t.join(10)
    with driver.exclusive("update_weights"):  # idle: the engine is the caller's
        assert driver.in_flight() == 0
    assert driver.run([]) == [] and driver.run([1]) == [(1, 4)]
    driver.close()


def test_outputs_of_unknown_requests_are_an_error():
    driver = InflightDriver(lambda request_id, item: None, lambda: [("not-mine", 0)], name="fake")
    with pytest.raises(RuntimeError, match=r"requests it was not given: \['not-mine'\]"):
        driver.run([1])
    driver.close()
