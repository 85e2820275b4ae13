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
