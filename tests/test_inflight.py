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
    assert driver.run([]) == [] and driver.run([1]) == [(1, 4)]
    driver.close()


def test_calls_wait_while_a_caller_holds_the_engine():
    """Inside `exclusive` the driver takes no request: a call made meanwhile waits and runs after it; a second
    `exclusive` is refused (not waited for); `in_flight` answers inside it (no lock held across the body)."""
    engine = StepEngine()
    driver = _driver(engine)
    out = []
    with driver.exclusive("update_weights"):
        t = threading.Thread(target=lambda: out.append(driver.run([2])))
        t.start()
        while driver.in_flight() == 0:
            pass
        t.join(0.2)
        assert t.is_alive() and engine.batches == []  # queued, not stepped
        with pytest.raises(RuntimeError, match="fake: score while another caller holds the engine"):
            with driver.exclusive("score"):
                pass
    t.join(10)
    assert out == [[(2, 2)]]
    driver.close()


def test_the_engine_stays_refused_until_failed_requests_are_aborted():
    """After a failed step the driver aborts the requests before it lets them go: an `exclusive` tried from the
    abort itself (the moment another thread could ask) is refused; outputs the engine still returns for aborted
    requests later are dropped, not blamed on the next call."""
    gate = threading.Event()
    engine = StepEngine(fail_at=1, gate=gate)
    seen = []

    def abort(ids):  # an engine whose abort does nothing: the requests stay in it
        try:
            with driver.exclusive("update_weights"):
                seen.append("granted")
        except RuntimeError as exc:
            seen.append(str(exc))

    driver = InflightDriver(engine.add, engine.step, abort, name="fake")
    gate.set()
    with pytest.raises(RuntimeError, match="device lost"):
        driver.run([3])
    assert seen == ["fake: update_weights while 1 requests are in flight; wait for the running calls to return first"]
    assert driver.run([5]) == [(5, 7)]  # the stale 3-step row finished meanwhile (step 4): dropped, not an error
    driver.close()


@pytest.mark.parametrize("bad", ["malformed output", "abort raises too"])
def test_a_broken_driver_thread_leaves_no_caller_waiting(bad):
    """A step output that is not (id, output) pairs breaks `_deliver`; an abort that raises `KeyboardInterrupt`
    would end the thread: either way every caller gets an error and a later call is served."""
    engine = StepEngine()
    broken = {"on": True}

    def step():
        out = engine.step()
        return [("x",)] if broken["on"] else out

    def abort(ids):
        if bad == "abort raises too":
            raise KeyboardInterrupt
    driver = InflightDriver(engine.add, step, abort, name="fake")
    with pytest.raises(RuntimeError, match="fake: engine step failed"):
        driver.run([2])
    broken["on"] = False
    assert [n for n, _ in driver.run([1])] == [1]
    driver.close()


def test_outputs_of_unknown_requests_are_an_error():
    driver = InflightDriver(lambda request_id, item: None, lambda: [("not-mine", 0)], name="fake")
    with pytest.raises(RuntimeError, match=r"requests it was not given: \['not-mine'\]"):
        driver.run([1])
    driver.close()
