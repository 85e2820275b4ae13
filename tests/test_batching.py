"""Padding and the three length-bucket rules (`learn/batching.py`), against hand-computed sizes."""

import numpy as np
import pytest

from bat_jax.learn.batching import grpo_bucket, length_bucket, pad_batch, sft_bucket


def test_pad_batch_pads_rows_and_length():
    rows = [{"input_ids": np.array([1, 2, 3], np.int32), "w": np.float32(0.5)},
            {"input_ids": np.array([4], np.int32), "w": np.float32(1.0)}]
    out = pad_batch(rows, multiple=4)
    assert out["input_ids"].shape == (4, 4) and out["w"].tolist() == [0.5, 1.0, 0.0, 0.0]
    assert out["input_ids"][1].tolist() == [4, 0, 0, 0]
    assert pad_batch(rows, multiple=1, pad_to=6)["input_ids"][0].tolist() == [1, 2, 3, 0, 0, 0]
    with pytest.raises(ValueError, match="a row of 3 tokens exceeds pad_to=2"):
        pad_batch(rows, multiple=1, pad_to=2)
    with pytest.raises(ValueError, match="no rows"):
        pad_batch([], multiple=1)


def test_default_bucket_is_a_power_of_two_then_multiples_of_the_step():
    assert [length_bucket(n) for n in (1, 2, 3, 5, 100, 4096, 4097, 12288, 12289)] == \
        [2, 2, 4, 8, 128, 4096, 8192, 12288, 16384]


def test_sft_bucket_climbs_the_ladder_capped_at_max_seq_len():
    # 256 → 384 (×1.5) → 512 (×4/3) → 768 → 1024 → 1536 → 2048 → 3072 → 4096
    assert [sft_bucket(n, 4096) for n in (1, 256, 257, 385, 513, 769, 1025, 1537, 2049, 3073)] == \
        [256, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
    assert sft_bucket(3000, 3048) == 3048  # the ladder's 3072 is past max_seq_len
    with pytest.raises(ValueError, match="an SFT row of 5000 tokens exceeds max_seq_len=4096"):
        sft_bucket(5000, 4096)


def test_grpo_bucket_is_the_ladder_capped_at_the_context_or_the_longest_rollout():
    assert [grpo_bucket(n, 12288) for n in (10, 300, 700, 5000, 7000, 12000)] == [256, 384, 768, 6144, 8192, 12288]
    assert grpo_bucket(12300, 12288) == 12300  # a rollout past the context: padded to itself, no error
    assert grpo_bucket(3000, 2048) == 3000
