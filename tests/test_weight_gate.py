"""A weight sync with engine calls in flight (bat_jax/rollout/weight_gate.py): the sync waits for the call in
flight, a call arriving during the sync waits for it, and every completion carries the one version it ran on."""

import threading
import time

import numpy as np

from bat_jax.rollout.engine import Completion, SamplingParams
from bat_jax.rollout.weight_gate import WeightGate


class SlowEngine:
    """Each call blocks until `release` is set; its rows record the version installed when the call began and when
    it ended (an engine swapped mid-call would report two)."""

    def __init__(self):
        self.weight_version, self.release, self.started = 0, threading.Event(), threading.Event()
        self.calls = []

    def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
        began = self.weight_version
        self.started.set()
        self.release.wait(5)
        self.calls.append((began, self.weight_version))
        return [Completion(np.array([1], np.int32), np.array([-0.5], np.float32), "stop", began) for _ in prompts]

    def update_weights(self, params):
        self.weight_version += 1
        return self.weight_version


def test_a_sync_waits_for_the_call_in_flight_and_holds_new_calls_until_it_is_done():
    inner = SlowEngine()
    gate = WeightGate(inner)
    out = {}
    first = threading.Thread(target=lambda: out.setdefault("first", gate.generate([[1]], SamplingParams())))
    first.start()
    assert inner.started.wait(5)
    sync = threading.Thread(target=lambda: out.setdefault("version", gate.update_weights(None)))
    sync.start()
    time.sleep(0.1)
    assert inner.weight_version == 0 and "version" not in out  # the sync waits for the turn in flight
    inner.started.clear()
    second = threading.Thread(target=lambda: out.setdefault("second", gate.generate([[2]], SamplingParams())))
    second.start()
    time.sleep(0.1)
    assert not inner.started.is_set()  # a call arriving while the sync waits does not start
    inner.release.set()
    for t in (first, sync, second):
        t.join(5)
    assert out["version"] == 1 and gate.syncs_waited == 1
    assert inner.calls == [(0, 0), (1, 1)]  # no call saw its weights change under it
    assert out["first"][0].weight_version == 0 and out["second"][0].weight_version == 1
    assert gate.weight_version == 1 and gate.calls is inner.calls  # anything else is the inner engine's


def test_a_sync_without_calls_in_flight_does_not_wait():
    inner = SlowEngine()
    inner.release.set()
    gate = WeightGate(inner)
    assert gate.generate([[1]], SamplingParams())[0].weight_version == 0
    assert gate.update_weights(None) == 1 and gate.syncs_waited == 0


def test_an_episode_continues_across_syncs_and_each_turn_keeps_its_version():
    """on_sync='continue' in the agent loop: a learner sync during each tool call; the episode's next turn samples on
    the new weights, and the trajectory records 3, 4, 5 (`staleness.judge_group` then aborts it under 'abort')."""
    from bat_jax.learn.staleness import StalenessConfig, judge_group
    from bat_jax.rollout.agent_loop import AgentLoopConfig
    from bat_jax.rollout.sampling import SamplingConfig

    from doubles import ACTION, REQUEST, FakeSandbox, ScriptedEngine
    from doubles import scripted_agent_loop as _loop

    class Versioned(ScriptedEngine):
        def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
            out = super().generate(prompts, params, max_new_tokens=max_new_tokens, seeds=seeds)
            return [Completion(c.token_ids, c.logprobs, c.finish_reason, self.weight_version) for c in out]

        def update_weights(self, params):
            self.weight_version += 1
            return self.weight_version

    gate = WeightGate(Versioned([ACTION] * 3))

    class SyncingSandbox(FakeSandbox):
        def execute_code(self, language, code, timeout_s=None):
            gate.update_weights(None)  # the learner syncs while the tool call runs
            return super().execute_code(language, code, timeout_s)

    config = AgentLoopConfig(sampling=SamplingConfig(group_size=1), max_assistant_turns=3, progress=False)
    (traj,) = _loop(gate, config, sandbox_factory=SyncingSandbox).run([REQUEST])
    assert traj.turn_versions == (3, 4, 5) and traj.weight_version == 5 and traj.began_version == 3
    verdicts = [judge_group([traj.turn_versions], [traj.weight_version], [False], 6,
                            StalenessConfig(max_staleness=3, on_sync=mode)).action for mode in ("continue", "abort")]
    assert verdicts == ["train", "aborted"]


def test_an_engine_that_swaps_between_decode_steps_is_not_waited_for():
    class Swapping(SlowEngine):
        swaps_in_flight = True

        def update_weights(self, params, *, in_flight=False):
            self.in_flight = in_flight
            return super().update_weights(params)

    inner = Swapping()
    gate = WeightGate(inner)
    call = threading.Thread(target=lambda: gate.generate([[1]], SamplingParams()))
    call.start()
    assert inner.started.wait(5)
    assert gate.update_weights(None) == 1 and inner.in_flight  # returned while the call is still in flight
    assert call.is_alive() and gate.syncs_waited == 0
    inner.release.set()
    call.join(5)
    assert inner.calls == [(0, 1)]  # the call began on 0 and ended on 1: the engine's own in-flight swap
