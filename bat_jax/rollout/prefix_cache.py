"""Prefix reuse for the JAX sampler: a multi-turn episode's next prompt continues its last call's decode state.

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Sequence

import numpy as np

from bat_jax.models.cache import AttentionCache, DecodeCache, DeltaNetCache


@dataclasses.dataclass(frozen=True)
class RowState:
    """Decode state of one row after a sampling call.

    Attributes:
      tokens: `[n] int32` the tokens fed to the model, in order (prompt + completion[:-1]).
      layers: per decoder layer, an `AttentionCache` with k, v `[kv_heads, n, head_dim]` (real slots only) or a
        `DeltaNetCache` with conv `[kernel-1, conv_dim]` and state `[value_heads, key_dim, value_dim]`.
      next_position: RoPE position of the row's next token (int).
    """

    tokens: np.ndarray
    layers: tuple
    next_position: int


class PrefixCache:
    """Row states keyed by their tokens (module docstring). `max_rows` >= 1."""

    def __init__(self, max_rows: int):
        if max_rows < 1:
            raise ValueError(f"PrefixCache: max_rows must be >= 1, got {max_rows}")
        self.max_rows = int(max_rows)
        self._rows: collections.OrderedDict[bytes, RowState] = collections.OrderedDict()
        self._lock = threading.Lock()  # engine calls may run in several threads
        self.hits = 0  # prompts that continued a stored row
        self.reused_tokens = 0  # tokens those prompts did not prefill again

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        """Forgets every row (new weights make the stored states stale)."""
        with self._lock:
            self._rows.clear()

    def put(self, row: RowState) -> None:
        """Stores `row`, dropping the oldest rows beyond `max_rows`."""
        key = np.asarray(row.tokens, np.int32).tobytes()
        with self._lock:
            self._rows.pop(key, None)
            self._rows[key] = row
            while len(self._rows) > self.max_rows:
                self._rows.popitem(last=False)

    def pop_longest(self, prompt: Sequence[int]) -> RowState | None:
        """Removes and returns the stored row whose tokens are the longest strict prefix of `prompt`, or None."""
        ids = np.asarray(prompt, np.int32)
        with self._lock:
            best_key, best_n = None, 0
            for key, row in self._rows.items():
                n = len(row.tokens)
                if best_n < n < len(ids) and ids[:n].tobytes() == key:
                    best_key, best_n = key, n
            if best_key is None:
                return None
            self.hits += 1
            self.reused_tokens += best_n
            return self._rows.pop(best_key)


def extract_rows(cache: DecodeCache, fed: Sequence[np.ndarray]) -> list[RowState | None]:
    """`RowState` of rows `0..len(fed)-1` of a host (numpy) `cache`.

    `fed[i]` `[n_i] int32` are the tokens row i was fed (None: skip the row). A row whose count of real slots differs
    from `len(fed[i])` gives None (not reusable)."""
    out: list[RowState | None] = []
    for i, tokens in enumerate(fed):
        slots = np.flatnonzero(cache.slot_mask[i]) if tokens is not None else None
        if tokens is None or len(slots) != len(tokens):
            out.append(None)
            continue
        layers = []
        for layer in cache.layers:
            if isinstance(layer, AttentionCache):
                layers.append(AttentionCache(k=layer.k[i][:, slots].copy(), v=layer.v[i][:, slots].copy()))
            elif isinstance(layer, DeltaNetCache):
                layers.append(DeltaNetCache(conv=layer.conv[i].copy(), state=layer.state[i].copy()))
            else:
                raise TypeError(f"extract_rows: unknown cache layer type {type(layer).__name__}")
        out.append(RowState(tokens=np.asarray(tokens, np.int32), layers=tuple(layers),
                            next_position=int(cache.next_position[i])))
    return out


def assemble(rows: Sequence[RowState | None], template: DecodeCache) -> DecodeCache:
    """A host `DecodeCache` shaped like `template` holding the given rows' states.

    `template` holds arrays or `jax.ShapeDtypeStruct`s, batch B >= len(rows). The cache holds row i's state in its first
    `len(rows[i].tokens)` slots (None: an empty row). Its write index (`length`) is the longest row's token count; the
    slots between a row's tokens and it are masked.

    Raises ValueError when a row holds more tokens than the template's slots."""
    b, max_len = template.slot_mask.shape
    lc = max((len(r.tokens) for r in rows if r is not None), default=0)
    if lc > max_len:
        raise ValueError(f"assemble: a row holds {lc} tokens but the cache has {max_len} slots")
    layers = []
    for j, t in enumerate(template.layers):
        fields = {f.name: np.zeros(getattr(t, f.name).shape, getattr(t, f.name).dtype)
                  for f in dataclasses.fields(t)}
        for i, row in enumerate(rows):
            if row is None:
                continue
            src = row.layers[j]
            if isinstance(t, AttentionCache):
                n = len(row.tokens)
                fields["k"][i, :, :n], fields["v"][i, :, :n] = src.k, src.v
            else:
                fields["conv"][i], fields["state"][i] = src.conv, src.state
        layers.append(type(t)(**fields))
    slot_mask = np.zeros((b, max_len), bool)
    next_position = np.zeros((b,), np.int32)
    for i, row in enumerate(rows):
        if row is not None:
            slot_mask[i, :len(row.tokens)] = True
            next_position[i] = row.next_position
    return DecodeCache(layers=tuple(layers), length=np.int32(lc), slot_mask=slot_mask, next_position=next_position)
