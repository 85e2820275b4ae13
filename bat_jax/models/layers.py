"""Shared building blocks of the Qwen3 / Qwen3.5 / Llama decoders (Flax NNX).

Details: docs/design.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from bat_jax.models.cache import AttentionCache

_NEG = -1e30  # finite "minus infinity": fully masked rows (left padding) stay NaN-free


def param(rngs: nnx.Rngs | None, init, shape, dtype, names) -> nnx.Param:
    """An ``nnx.Param`` of ``shape`` with logical axis ``names`` (no eager placement)."""
    key = rngs.params() if rngs is not None else jax.random.key(0)
    return nnx.Param(init(key, shape, dtype), out_sharding=tuple(names), eager_sharding=False)


def _normal(key, shape, dtype):
    return (0.02 * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def _fill(value):
    return lambda key, shape, dtype: jnp.full(shape, value, dtype)


class Linear(nnx.Module):
    """``y = x @ weight.T (+ bias) (+ LoRA update)``; ``weight`` is ``[out, in]`` (torch layout), computed in ``dtype``."""

    def __init__(self, in_features: int, out_features: int, names: tuple, *, bias: bool = False,
                 dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.weight = param(rngs, _normal, (out_features, in_features), param_dtype, names)
        self.bias = param(rngs, _fill(0.0), (out_features,), param_dtype, names[:1]) if bias else None
        self.dtype = dtype
        # a LoRA adapter (``models.lora.add_lora``): lora_a [r, in], lora_b [out, r], update scaled by lora_scale
        self.lora_a, self.lora_b = nnx.data(None), nnx.data(None)
        self.lora_scale = 0.0

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        y = jnp.einsum("...i,oi->...o", x, self.weight[...].astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        if self.lora_a is not None:  # peft LoraLayer: base(x) + lora_B(lora_A(x)) * scaling
            a = jnp.einsum("...i,ri->...r", x, self.lora_a[...].astype(self.dtype))
            y = y + self.lora_scale * jnp.einsum("...r,or->...o", a, self.lora_b[...].astype(self.dtype))
        return y


class Embedding(nnx.Module):
    """Token embedding ``weight [vocab, embed]``; ``attend`` gives tied-head logits."""

    def __init__(self, vocab: int, dim: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.weight = param(rngs, _normal, (vocab, dim), param_dtype, ("vocab", "embed"))
        self.dtype = dtype

    def __call__(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.weight[...], ids, axis=0).astype(self.dtype)

    def attend(self, h: jax.Array) -> jax.Array:
        return jnp.einsum("...d,vd->...v", h.astype(self.dtype), self.weight[...].astype(self.dtype))


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis, in float32.

    ``zero_centered=False`` (Qwen3): ``w * (x / rms(x)).astype(in_dtype)``, weight init 1.
    ``zero_centered=True`` (Qwen3.5): ``((x / rms(x)) * (1 + w)).astype(in_dtype)``, weight init 0.
    """

    def __init__(self, dim: int, *, eps: float, zero_centered: bool, names=("embed",),
                 param_dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        self.weight = param(rngs, _fill(0.0 if zero_centered else 1.0), (dim,), param_dtype, names)
        self.eps = eps
        self.zero_centered = zero_centered

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        w = self.weight[...]
        if self.zero_centered:
            return (normed * (1.0 + w.astype(jnp.float32))).astype(x.dtype)
        return w.astype(x.dtype) * normed.astype(x.dtype)


class MLP(nnx.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, dim: int, hidden: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = Linear(dim, hidden, ("mlp", "embed"), **kw)
        self.up_proj = Linear(dim, hidden, ("mlp", "embed"), **kw)
        self.down_proj = Linear(hidden, dim, ("embed", "mlp"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_inv_freq(rotary_dim: int, theta: float, scaling=None, max_position_embeddings: int | None = None,
                  seq_len=None) -> jax.Array:
    """Inverse frequencies ``[rotary_dim // 2]`` float32 of RoPE, following transformers 5.19.

    The types follow ``modeling_rope_utils`` (default, ``linear``, ``dynamic``, ``llama3``).

    ``scaling`` is a ``configs.RopeScaling`` or None (default RoPE). ``dynamic`` needs ``max_position_embeddings``
    and ``seq_len`` (a traced int: longest position of the call + 1). As in transformers' stateless first call,
    the base becomes ``theta * (factor * L / max_pos - (factor - 1)) ** (d / (d - 2))`` with
    ``L = max(seq_len, max_pos)`` (so the default frequencies while ``seq_len <= max_pos``).
    """
    exponents = jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim
    kind = None if scaling is None else scaling.rope_type
    if kind == "dynamic":
        length = jnp.maximum(jnp.asarray(seq_len, jnp.float32), float(max_position_embeddings))
        f = scaling.factor
        grow = (f * length / max_position_embeddings - (f - 1)) ** (rotary_dim / (rotary_dim - 2))
        return 1.0 / ((theta * grow) ** exponents)
    inv_freq = 1.0 / (theta ** exponents)
    if kind == "linear":
        return inv_freq / scaling.factor
    if kind == "llama3":
        old = scaling.original_max_position_embeddings
        low_wavelen, high_wavelen = old / scaling.low_freq_factor, old / scaling.high_freq_factor
        wavelen = 2 * jnp.pi / inv_freq
        scaled = jnp.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return jnp.where(medium, smoothed, scaled)
    return inv_freq


def rotary_tables(positions: jax.Array, rotary_dim: int, theta: float, dtype, scaling=None,
                  max_position_embeddings: int | None = None) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables ``[batch, seq, rotary_dim]`` for int ``positions [batch, seq]``.

    Halves layout as in transformers ``rotate_half``; frequencies from :func:`rope_inv_freq` (``dynamic`` takes its
    length from ``max(positions) + 1``); computed in float32, returned in ``dtype``."""
    seq_len = jnp.max(positions) + 1 if scaling is not None and scaling.rope_type == "dynamic" else None
    inv_freq = rope_inv_freq(rotary_dim, theta, scaling, max_position_embeddings, seq_len)
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates the first ``cos.shape[-1]`` channels of ``x [batch, seq, heads, head_dim]`` (partial RoPE)."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    half = rd // 2
    rotated = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    return jnp.concatenate([rot * c + rotated * s, rest], axis=-1)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array) -> jax.Array:
    """Grouped-query softmax attention.

    q ``[b, t, H, d]`` (already scaled), k/v ``[b, s, K, d]`` with ``H % K == 0``, valid ``[b, t, s]``
    bool. Returns ``[b, t, H, d]`` in q's dtype; scores and softmax in float32. Rows with no valid key
    (queries at padded positions) give a uniform average instead of NaN; callers ignore them.
    """
    b, t, h, d = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, t, kv, h // kv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
    scores = jnp.where(valid[:, None, None, :, :], scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h, d)


def attend_one(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, q_offset) -> jax.Array:
    """One decode step's grouped-query attention over a cache in the ``[b, K, L, d]`` layout.

    It is the same softmax as ``attend(q, k', v', causal_valid(key_mask, q_offset, 1))`` with ``k'``/``v'`` in ``[b, L,
    K, d]``, without the per-step transposes (on CPU, 8 rows × 1,280 slots: 0.3 ms instead of 2.6 ms per step).

    q ``[b, 1, H, d]`` (scaled), k/v ``[b, K, L, d]``, key_mask ``[b, L]`` bool, q_offset the query's slot.
    Returns ``[b, 1, H, d]`` in q's dtype; scores and softmax in float32.
    """
    b, _, h, d = q.shape
    kv = k.shape[1]
    qg = q.reshape(b, kv, h // kv, d)
    scores = jnp.einsum("bkgd,bksd->bkgs", qg, k, preferred_element_type=jnp.float32)
    valid = causal_valid(key_mask, q_offset, 1)[:, 0]
    scores = jnp.where(valid[:, None, None, :], scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgs,bksd->bkgd", probs, v).reshape(b, 1, h, d)


def causal_valid(key_mask: jax.Array, q_offset, t: int) -> jax.Array:
    """``[b, t, s]`` bool: which key slots each query may see.

    Query ``i`` (at slot ``q_offset + i``) may see key slot ``j`` iff ``j <= q_offset + i`` and ``key_mask[:, j]``
    (``[b, s]`` bool)."""
    s = key_mask.shape[1]
    causal = jnp.arange(s)[None, :] <= (q_offset + jnp.arange(t))[:, None]
    return causal[None] & key_mask[:, None, :]


MAX_UNROLLED_BLOCKS = 32


def attend_causal(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, q_offset=0,
                  block: int = 0) -> jax.Array:
    """Causal GQA attention, computed ``block`` queries at a time when ``0 < block < t``.

    It equals ``attend(q, k, v, causal_valid(key_mask, q_offset, t))``.

    q ``[b, t, H, d]`` (scaled), k/v ``[b, s, K, d]``, key_mask ``[b, s]`` bool, q_offset int (slot of query 0).
    Blockwise, the float32 scores of one query block, ``[b, H, block, s]`` at most, are the largest buffer (never
    ``[b, H, t, s]``); each block is rematerialised in the backward pass (``jax.checkpoint``). With a static
    (Python int) ``q_offset`` (training, fresh prompts) query block ``[lo, hi)`` reads only keys
    ``[0, q_offset + hi)``, the ones it may see. That is about half of the dense work at ``t = s`` (a tiny Qwen3.5 on
    CPU, ``[1, 3072]``, block 128: forward 319 → 114 ms, gradient 956 → 291 ms against one ``jax.lax.map`` over
    1,024-query blocks). The blocks are unrolled, at most ``MAX_UNROLLED_BLOCKS`` of them (longer sequences get
    longer blocks). A traced ``q_offset`` (a prompt continuing a cache) maps over blocks that read every key.
    Every query row is the same softmax over the same keys as the dense form, so they agree to float round-off.
    Returns ``[b, t, H, d]`` in q's dtype.
    """
    b, t, h, d = q.shape
    if not block or t <= block:
        return attend(q, k, v, causal_valid(key_mask, q_offset, t))

    @jax.checkpoint
    def one_block(q_i, k_i, v_i, m_i, start):  # queries from slot `start` on, over the given keys
        return attend(q_i, k_i, v_i, causal_valid(m_i, start, q_i.shape[1]))

    if isinstance(q_offset, int):
        block = max(block, -(-t // MAX_UNROLLED_BLOCKS))
        outs = []
        for lo in range(0, t, block):
            keys = min(k.shape[1], q_offset + min(t, lo + block))
            outs.append(one_block(q[:, lo:lo + block], k[:, :keys], v[:, :keys], key_mask[:, :keys], q_offset + lo))
        return jnp.concatenate(outs, axis=1)
    pad = (-t) % block
    n = (t + pad) // block
    qb = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, n, block, h, d)
    starts = q_offset + block * jnp.arange(n)
    out = jax.lax.map(lambda args: one_block(args[0], k, v, key_mask, args[1]),
                      (jnp.moveaxis(qb, 1, 0), starts))  # [n, b, block, H, d]
    return jnp.moveaxis(out, 0, 1).reshape(b, n * block, h, d)[:, :t]


class Attention(nnx.Module):
    """Causal GQA self-attention with per-head q/k RMSNorm and RoPE.

    The q/k norm is on with ``qk_norm=True`` (Llama has none); RoPE is scaled as ``cfg.rope_scaling`` says, when the
    config has that field.

    ``output_gate=True`` (Qwen3.5 gated attention): q_proj emits ``[q | gate]`` per head and the
    attention output is multiplied by ``sigmoid(gate)`` before o_proj; norms are zero-centred and
    only ``rotary_dim`` channels are rotated. ``output_gate=False`` is Qwen3 attention.
    """

    def __init__(self, cfg, *, output_gate: bool, zero_centered: bool, qk_norm: bool = True, rngs: nnx.Rngs):
        dt, pdt = cfg.compute_dtype, jnp.dtype(cfg.param_dtype)
        kw = dict(bias=cfg.attention_bias, dtype=dt, param_dtype=pdt, rngs=rngs)
        h, k, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, k, d
        self.output_gate = output_gate
        self.rotary_dim, self.rope_theta = cfg.rotary_dim, cfg.rope_theta
        self.rope_scaling = getattr(cfg, "rope_scaling", None)  # only LlamaConfig has the field
        self.max_position_embeddings = cfg.max_position_embeddings
        self.q_proj = Linear(cfg.hidden_size, h * d * (2 if output_gate else 1), ("heads", "embed"), **kw)
        self.k_proj = Linear(cfg.hidden_size, k * d, ("kv_heads", "embed"), **kw)
        self.v_proj = Linear(cfg.hidden_size, k * d, ("kv_heads", "embed"), **kw)
        self.o_proj = Linear(h * d, cfg.hidden_size, ("embed", "heads"), **kw)
        norm_kw = dict(eps=cfg.rms_norm_eps, zero_centered=zero_centered, names=("head_dim",),
                       param_dtype=pdt, rngs=rngs)
        self.q_norm = RMSNorm(d, **norm_kw) if qk_norm else None
        self.k_norm = RMSNorm(d, **norm_kw) if qk_norm else None

    def __call__(self, x, mask, positions, cache: AttentionCache | None = None, write_index=None,
                 slot_mask=None, block: int = 0):
        """x ``[b, t, embed]``; mask ``[b, t]`` bool (1 = real token); positions ``[b, t]`` int32.

        With ``cache`` the new keys/values are written at slots ``[write_index, write_index + t)`` and
        the queries attend to every slot ``j <= own slot`` with ``slot_mask[:, j]`` (``[b, max_len]``
        bool, already including ``mask``). ``block`` > 0: queries in blocks of that many tokens
        (:func:`attend_causal`). Returns ``(y [b, t, embed], cache)``.
        """
        b, t, _ = x.shape
        d = self.head_dim
        q = self.q_proj(x)
        if self.output_gate:
            q = q.reshape(b, t, self.num_heads, 2 * d)
            q, gate = q[..., :d], q[..., d:].reshape(b, t, self.num_heads * d)
        else:
            q, gate = q.reshape(b, t, self.num_heads, d), None
        k = self.k_proj(x).reshape(b, t, self.num_kv_heads, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, d)
        cos, sin = rotary_tables(positions, self.rotary_dim, self.rope_theta, x.dtype, self.rope_scaling,
                                 self.max_position_embeddings)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q = q * jnp.asarray(d ** -0.5, q.dtype)
        if cache is None:
            out = attend_causal(q, k, v, mask, 0, block)
        else:  # the cache is [b, kv_heads, L, d]: a decode step reads it without transposing it
            idx = (0, 0, write_index, 0)
            cache = AttentionCache(
                k=jax.lax.dynamic_update_slice(cache.k, k.swapaxes(1, 2).astype(cache.k.dtype), idx),
                v=jax.lax.dynamic_update_slice(cache.v, v.swapaxes(1, 2).astype(cache.v.dtype), idx))
            ck, cv = cache.k.astype(x.dtype), cache.v.astype(x.dtype)
            if t == 1:
                out = attend_one(q, ck, cv, slot_mask, write_index)
            else:
                out = attend_causal(q, ck.swapaxes(1, 2), cv.swapaxes(1, 2), slot_mask, write_index, block)
        out = out.reshape(b, t, self.num_heads * d)
        if gate is not None:
            out = out * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
        return self.o_proj(out), cache
