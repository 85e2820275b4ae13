"""launch/teacher_nll.py: the token-mean NLL of target tokens, and its table, against hand values."""

import numpy as np

from launch import teacher_nll


class ConstantLearner:
    """`Learner.logprobs` stand-in: logprob -0.5 at target positions of row 0, -1.0 of row 1, -9 elsewhere."""

    def logprobs(self, params, batch, config):
        out = np.full(batch["input_ids"].shape, -9.0, np.float32)
        out[0][batch["loss_mask"][0] == 1] = -0.5
        out[1][batch["loss_mask"][1] == 1] = -1.0
        return out


def test_nll_is_the_token_mean_over_every_target_token_and_cuts_padding():
    def example(targets, length, pad=16):
        mask = np.zeros(pad, np.int32)
        mask[:length] = 1
        loss = np.zeros(pad, np.int32)
        loss[length - targets:length] = 1
        return {"input_ids": np.arange(pad, dtype=np.int32), "attention_mask": mask, "loss_mask": loss}

    seen = []

    class Recording(ConstantLearner):
        def logprobs(self, params, batch, config):
            seen.append(batch["input_ids"].shape)
            return super().logprobs(params, batch, config)

    # 2 target tokens at 0.5 nats and 6 at 1.0: (2 * 0.5 + 6 * 1.0) / 8
    got = teacher_nll._nll(Recording(), None, [example(2, 5), example(6, 9)], None)
    assert abs(got - 7.0 / 8) < 1e-9 and seen == [(2, 9)]  # cut to the longest row (9 of 16)


def test_table_shows_each_step_against_the_sft_policy():
    result = {"stages": ["clean", "analyse"], "rows": {"clean": 4, "analyse": 3},
              "steps": {0: {"clean": 0.5, "analyse": 0.25}, 1: {"clean": 0.25, "analyse": 0.5}},
              "targets": {1: "clean"}}
    assert teacher_nll.table(result).splitlines() == [
        "| step (routed stage) | clean (4 rows) | analyse (3 rows) |",
        "| --- | --- | --- |",
        "| 0 (SFT) | 0.5000 | 0.2500 |",
        "| 1 (clean) | 0.2500 (-0.2500) | 0.5000 (+0.2500) |"]


def test_nll_on_a_real_learner_equals_the_sft_loss_per_token():
    """`_nll` through `Learner.logprobs` equals the SFT objective's own per-token NLL (`sft.sft_token_nll`) on the
    same rows: position t of the logprobs scores token t, as the loss mask marks targets."""
    import jax.numpy as jnp

    from bat_jax.learn import grpo, sft
    from bat_jax.learn.learner import Learner
    from bat_jax.models.mesh import MeshConfig
    from bat_jax.rollout.sampling import SamplingConfig
    from doubles import tiny_model

    model = tiny_model("qwen3", seed=3)
    rng = np.random.default_rng(0)
    examples = [sft.build_sft_example(rng.integers(0, 200, n).tolist(), rng.integers(0, 200, k).tolist(), 255, 32)
                for n, k in ((5, 4), (9, 7))]
    learner = Learner(model, MeshConfig(data=1, fsdp=1, tensor=1))
    got = teacher_nll._nll(learner, learner.params, examples,
                           grpo.GRPOConfig(kl_coef=0.0, sampling=SamplingConfig(temperature=1.0)))
    batch = {k: jnp.asarray(np.stack([e[k] for e in examples])) for k in ("input_ids", "attention_mask", "loss_mask")}
    nll, mask = sft.sft_token_nll(model(batch["input_ids"], batch["attention_mask"]), batch)
    want = float(nll.sum() / mask.sum())
    assert abs(got - want) < 1e-4 * want and int(mask.sum()) == 4 + 1 + 7 + 1  # targets + end of turn per row


def test_a_directory_without_a_run_file_is_one_error_line(tmp_path):
    import pytest

    with pytest.raises(SystemExit) as e:
        teacher_nll.run_components(tmp_path, "evaluate_rounds")
    assert str(e.value) == f"[evaluate_rounds] error: {tmp_path / 'config.gin'} not found: not a run directory"
