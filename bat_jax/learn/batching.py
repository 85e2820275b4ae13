"""Batching: right-padding rows into one `[B, T]` batch and the length-bucket rules that choose T.

A bucket is the padded length of a batch: a few distinct lengths keep the number of compiled step shapes small,
and a batch of short rows does not pay for the longest context. Three rules, one per batch kind:

Details: docs/design.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def length_bucket(n: int, step: int = 4096) -> int:
    """Padded length for ``n`` tokens: the next power of two ≤ ``step``, else the next multiple of ``step``."""
    if n <= step:
        return int(2 ** int(np.ceil(np.log2(max(n, 2)))))
    return -(-n // step) * step


def _ladder(length: int) -> int:
    """The smallest of 256, 384, 512, 768, 1024, 1536, ... (powers of two and their 1.5 multiples) ≥ `length`."""
    size = 256
    while size < length:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3  # 256 → 384 → 512 → 768 → 1024 ...
    return size


def sft_bucket(length: int, max_seq_len: int) -> int:
    """The token length an SFT batch whose longest row has `length` tokens is padded to.

    It is the smallest of 256, 384, 512, 768, 1024, 1536, ... (powers of two and their 1.5 multiples) that holds it, at
    most `max_seq_len`.

    Raises:
      ValueError: `length` > `max_seq_len`.
    """
    if length > max_seq_len:
        raise ValueError(f"an SFT row of {length} tokens exceeds max_seq_len={max_seq_len}")
    return min(_ladder(length), max_seq_len)


def grpo_bucket(longest: int, max_context_tokens: int) -> int:
    """The token length a GRPO batch whose longest rollout has `longest` tokens is padded to.

    It is the SFT ladder's step that holds it, at most `max_context_tokens` — or `longest` itself when a rollout ran
    past the context."""
    return min(_ladder(longest), max(longest, max_context_tokens))


def pad_batch(rows: list[Mapping[str, np.ndarray]], multiple: int, pad_to: int | None = None) -> dict[str, np.ndarray]:
    """Right-pads `[T_i]` per-row arrays to one `[B, T]` batch.

    B is padded to a multiple of `multiple` with all-zero rows (no attention, no loss); T is `pad_to`, or the
    longest row's `length_bucket` (a 12,288-token context stays 12,288, not 16,384). Scalar fields become `[B]`.

    Raises:
      ValueError: no rows, or a row longer than `pad_to`.
    """
    if not rows:
        raise ValueError("pad_batch: no rows")
    longest = max(len(r["input_ids"]) for r in rows)
    t = pad_to or length_bucket(longest)
    if longest > t:
        raise ValueError(f"pad_batch: a row of {longest} tokens exceeds pad_to={t}")
    b = -(-len(rows) // multiple) * multiple
    out: dict[str, np.ndarray] = {}
    for key in rows[0]:
        sample = np.asarray(rows[0][key])
        if sample.ndim == 0:
            arr = np.zeros((b,), sample.dtype)
            for i, r in enumerate(rows):
                arr[i] = r[key]
        else:
            arr = np.zeros((b, t), sample.dtype)
            for i, r in enumerate(rows):
                arr[i, : len(r[key])] = r[key]
        out[key] = arr
    return out
