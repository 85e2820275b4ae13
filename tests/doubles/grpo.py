"""Reward rows and rollouts, and the GRPO block's learner and scorer stand-ins."""

import json
import types

import numpy as np

from bat_jax.rollout.trajectory import Trajectory
from bat_jax.sandbox.types import Receipt
from bat_jax.stage_bank.row import Provenance, RLRow, RubricSpec, StateRef, Transformation

# --- reward rows and rollouts (test_reward, test_reward_integrity_inputs) -------------------------------------

def reward_row(seed, focus, variant="success", track="vqa"):
    """The RL row of training task `seed` of `track` at `focus` (provenance: its synthesis transformation)."""
    from bat_jax.benchmarks.imaging import heldout
    from bat_jax.benchmarks.imaging.registry import get_track

    syn = Transformation("task_synthesis", "ab" * 32, {"seed": seed, "variant": variant, "template": 0})
    state = heldout.training_task(get_track(track), seed, variant, 0).state()
    return RLRow(StateRef.from_state(state, f"states/{state.digest()}.tar"), focus, "do the stage",
                 (RubricSpec("x", "y"),), (), "skill", Provenance(f"src-{seed}", "cd" * 32, track, variant, (syn,)))


def reward_trajectory(task, focus, k):
    """Rollout k: reads the brief (and the manifest when k is odd); writes a plan naming the method when k % 3;
    rollout 2 submits the answer key's first case (E2E task metric above 0)."""
    L = task.layout
    receipts = [Receipt(0, "execute_code", "bash", "cat task.md", 0, "", "", 0.0, 1.0, False, task.brief,
                        reads=("task.md",), trace_complete=True)]
    if k % 2:
        receipts.append(Receipt(1, "execute_code", "bash", f"cat {L.cases_csv}", 0, "", "", 0.0, 1.0, False,
                                task.case_ids[0], reads=(L.cases_csv,), trace_complete=True))
    artefacts = {L.plan_path: f"Run {L.method_dir}/model.py over {len(task.cases)} cases.".encode()} if k % 3 else {}
    submitted = None
    if k == 2:
        case = task.cases[0]
        artefacts[L.submission] = json.dumps({"predictions": {case.case_id: {"answer": case.target}}}).encode()
        submitted = L.submission
    ids = np.zeros(4, np.int32)
    return Trajectory("st-x", k, focus, ids, ids, np.zeros(4, np.float32), 2, "max_turns", False, 1, 2, 0,
                      receipts=tuple(receipts), artefacts=artefacts, submitted=submitted)


# --- the GRPO block's stand-ins (test_grpo_round, test_evaluation, test_redteam_round4) -----------------------

def failed_trajectory(state_id, agent_error="", infra_error=""):
    """An E2E trajectory of state `state_id` with the given agent / infrastructure error ('' for none)."""
    ids = np.zeros(4, np.int32)
    return Trajectory(state_id, 0, "E2E", ids, ids, np.zeros(4, np.float32), 2, "max_turns", False, 1, 1, 2,
                      agent_error=agent_error, infra_error=infra_error)


def patch_rollout_scoring(monkeypatch, rewards_of_rows, items_of=lambda row, reward: None):
    """Stand-ins for the GRPO block's request builder and `RolloutScorer`: every position must be handed over; the
    rewards are `rewards_of_rows(rows)`, one per rollout in position order, their rubric item decisions
    `items_of(row, reward)`. Returns the list of the benchmarks the scorers were made for (one per pool batch or
    wave)."""
    from bat_jax.bicurl import grpo_round as gr

    benchmarks = []

    class Scorer:
        def __init__(self, rows, starts, benchmark, judge, config, tasks):
            assert len(rows) == len(starts) and tasks.benchmark is benchmark
            benchmarks.append(benchmark)
            self.rows, self.got = rows, {}

        def submit(self, position, trajectory):
            self.got[position] = trajectory

        def results(self):
            assert sorted(self.got) == list(range(len(self.rows)))
            return [types.SimpleNamespace(reward=r, version="v", items=items_of(row, r))
                    for row, r in zip(self.rows, rewards_of_rows(self.rows))]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(gr, "rl_request", lambda row, start, state_id, prompt: state_id)
    monkeypatch.setattr(gr, "RolloutScorer", Scorer)
    return benchmarks


class FakeLearner:
    """Logprobs of the sampled tokens: −0.5 − 0.1 · params (params = optimizer steps taken); records each pass."""
    mesh = types.SimpleNamespace(devices=np.zeros((1,)))
    params = 0

    def __init__(self):
        self.calls, self.seen, self.config = [], [], None

    def grpo_block(self, config, optimizer, total_steps, num_micro_batches):
        self.config = config
        return self.step, types.SimpleNamespace(params=0)

    def step(self, state, host):
        self.seen.append({k: np.asarray(v).copy() for k, v in host.items()})
        return types.SimpleNamespace(params=state.params + 1), {}

    def sync_model(self, params):
        return params

    def logprobs(self, params, host, config):
        self.calls.append(params)
        return np.where(np.asarray(host["loss_mask"]) > 0, -0.5 - 0.1 * params, 0.0).astype(np.float32)

    def adopt(self, state):
        self.params = state.params
