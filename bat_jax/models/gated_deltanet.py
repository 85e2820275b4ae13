"""Gated DeltaNet linear-attention layer of Qwen3.5 (Flax NNX), after transformers 5.19.

It follows ``Qwen3_5GatedDeltaNet`` and its torch fallbacks ``torch_recurrent_gated_delta_rule`` /
``torch_chunk_gated_delta_rule`` (Yang et al., "Gated Delta Networks", 2024).

Details: docs/design.md.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from bat_jax.models.cache import DeltaNetCache
from bat_jax.models.layers import Linear, _fill, param



def _precision():
    """The float32 matmul precision: HIGHEST on GPU/TPU, the default on CPU.

    On GPU/TPU the default rounds to tf32/bf16; on CPU the default is already exact float32 and HIGHEST is ~10x slower.
    """
    return None if jax.default_backend() == "cpu" else jax.lax.Precision.HIGHEST


def unit_lower_inverse(strict_lower: jax.Array) -> jax.Array:
    """``(I + L)^-1`` for strictly lower-triangular ``L [..., c, c]``.

    ``L`` is nilpotent, so ``(I + L)^-1 = sum_j (-L)^j = prod_k (I + (-L)^(2^k))`` over
    ``k < ceil(log2 c)``: a few batched matmuls instead of a batched triangular solve
    (which measured several times slower on CPU here)."""
    c = strict_lower.shape[-1]
    m = -strict_lower
    inv = jnp.eye(c, dtype=m.dtype) + m
    power = m
    for _ in range(max(math.ceil(math.log2(c)) - 1, 0)):
        power = jnp.matmul(power, power, precision=_precision())
        inv = inv + jnp.matmul(inv, power, precision=_precision())
    return inv


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``x * rsqrt(sum(x^2) + eps)`` over the last axis (matches transformers / FLA)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def recurrent_gated_delta_rule(q, k, v, g, beta, state):
    """Exact token-by-token gated delta rule.

    q, k ``[b, t, h, dk]``; v ``[b, t, h, dv]``; g, beta ``[b, t, h]``; state ``[b, h, dk, dv]``.
    All float32, q/k already normalised and q scaled. Returns ``(o [b, t, h, dv], state)``.
    """

    hi = _precision()

    def step(s, inp):
        q_t, k_t, v_t, g_t, b_t = inp
        s = s * jnp.exp(g_t)[..., None, None]
        mem = jnp.einsum("bhkv,bhk->bhv", s, k_t, precision=hi)
        delta = (v_t - mem) * b_t[..., None]
        s = s + k_t[..., :, None] * delta[..., None, :]
        return s, jnp.einsum("bhkv,bhk->bhv", s, q_t, precision=hi)

    xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta))
    state, out = jax.lax.scan(step, state, xs)
    return jnp.moveaxis(out, 0, 1), state


def chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size: int = 64):
    """Chunked (parallel within a chunk) gated delta rule.

    Same arguments and result as ``recurrent_gated_delta_rule``. The sequence is padded to a multiple of the chunk with
    ``g = beta = 0`` steps, which leave the state unchanged."""
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    hi = _precision()
    c = min(chunk_size, t)
    pad = (-t) % c
    n = (t + pad) // c

    def prep(x):  # [b, t, h, ...] -> [b, h, n, c, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = jnp.moveaxis(x, 2, 1)
        return x.reshape(x.shape[:2] + (n, c) + x.shape[3:])

    q, k, v, g, beta = (prep(x) for x in (q, k, v, g, beta))
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = jnp.cumsum(g, axis=-1)  # [b, h, n, c] log decay from chunk start
    lower = jnp.tril(jnp.ones((c, c), bool))
    diff = jnp.where(lower, cum[..., :, None] - cum[..., None, :], 0.0)
    decay = jnp.where(lower, jnp.exp(diff), 0.0)  # decay[i, j] = prod g over (j, i]
    kk = jnp.einsum("bhnid,bhnjd->bhnij", k_beta, k, precision=hi) * decay
    qk = jnp.einsum("bhnid,bhnjd->bhnij", q, k, precision=hi) * decay
    rhs = jnp.concatenate([v_beta, k_beta * jnp.exp(cum)[..., None]], axis=-1)
    sol = jnp.matmul(unit_lower_inverse(jnp.tril(kk, -1)), rhs, precision=hi)
    u, w = sol[..., :dv], sol[..., dv:]
    q_dec = q * jnp.exp(cum)[..., None]
    k_dec = k * jnp.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = jnp.exp(cum[..., -1])  # [b, h, n]

    def step(s, inp):
        u_i, w_i, q_i, k_i, qk_i, d_i = inp
        v_new = u_i - jnp.einsum("bhck,bhkv->bhcv", w_i, s, precision=hi)
        o = (jnp.einsum("bhck,bhkv->bhcv", q_i, s, precision=hi)
             + jnp.einsum("bhij,bhjv->bhiv", qk_i, v_new, precision=hi))
        s = s * d_i[..., None, None] + jnp.einsum("bhck,bhcv->bhkv", k_i, v_new, precision=hi)
        return s, o

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (u, w, q_dec, k_dec, qk, chunk_decay))
    state, out = jax.lax.scan(step, state, xs)  # out [n, b, h, c, dv]
    out = jnp.moveaxis(out, 0, 2).reshape(b, h, n * c, dv)[:, :, :t]
    return jnp.moveaxis(out, 1, 2), state


def causal_conv(x, conv_state, weight, lead=None):
    """Causal depthwise conv + SiLU.

    x ``[b, t, C]``; conv_state ``[b, K-1, C]`` (previous inputs); weight ``[C, 1, K]`` (torch ``Conv1d`` layout); lead
    ``[b] int32`` or None: leading padded positions of each row's segment (zero inputs), moved before the history so
    that the history is adjacent to the first real input (module docstring). Returns ``(y [b, t, C], new conv_state)``;
    computed in float32, returned in x's dtype."""
    kernel = weight.shape[-1]
    t = x.shape[1]
    full = jnp.concatenate([conv_state.astype(x.dtype), x], axis=1)
    if lead is not None:  # row r: [pad x lead_r, history, real inputs] (a per-row rotation of the first part)
        j = jnp.arange(full.shape[1])[None, :]
        lead = lead[:, None]
        src = jnp.where(j < lead, 0, jnp.where(j < lead + kernel - 1, j - lead, j))
        full = jnp.where((j < lead)[..., None], jnp.zeros((), full.dtype),
                         jnp.take_along_axis(full, src[..., None], axis=1))
    w = weight[:, 0, :].astype(jnp.float32)
    fullf = full.astype(jnp.float32)
    y = sum(fullf[:, j:j + t, :] * w[:, j] for j in range(kernel))
    return jax.nn.silu(y).astype(x.dtype), full[:, full.shape[1] - (kernel - 1):]


FLOAT32_PARAMS = ("linear_attn.A_log", "linear_attn.norm.weight")
"""Gated DeltaNet parameters (dotted-path tails, as HF names end) that are float32 whatever the
model's ``param_dtype``: released Qwen3.5 checkpoints store them in float32, and a bfloat16 ``A_log``
is off by up to ~8e-3 in the log decay."""


class GatedRMSNorm(nnx.Module):
    """``w * rmsnorm(x) * silu(z)`` over the last axis (norm before gate; weight init 1).

    ``weight [dim]`` is float32 (see :data:`FLOAT32_PARAMS`); as in transformers, the normalised input
    is cast back to the input dtype before the (type-promoting) product with the weight."""

    def __init__(self, dim: int, *, eps: float, rngs: nnx.Rngs):
        self.weight = param(rngs, _fill(1.0), (dim,), jnp.float32, ("head_dim",))
        self.eps = eps

    def __call__(self, x, z):
        xf = x.astype(jnp.float32)
        normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        y = self.weight[...] * normed.astype(x.dtype)
        return (y * jax.nn.silu(z.astype(jnp.float32))).astype(x.dtype)


class GatedDeltaNet(nnx.Module):
    """Qwen3.5 linear-attention token mixer.

    Parameter names follow transformers 5.19 (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``, ``conv1d``,
    ``dt_bias``, ``A_log``, ``norm``, ``out_proj``)."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        dt, pdt = cfg.compute_dtype, jnp.dtype(cfg.param_dtype)
        self.nk, self.nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.kernel = cfg.linear_conv_kernel_dim
        self.chunk_size = cfg.chunk_size
        key_dim, value_dim = self.nk * self.dk, self.nv * self.dv
        self.conv_dim = 2 * key_dim + value_dim
        kw = dict(dtype=dt, param_dtype=pdt, rngs=rngs)
        hs = cfg.hidden_size
        self.in_proj_qkv = Linear(hs, self.conv_dim, ("linear_qkv", "embed"), **kw)
        self.in_proj_z = Linear(hs, value_dim, ("linear_v", "embed"), **kw)
        self.in_proj_b = Linear(hs, self.nv, ("linear_heads", "embed"), **kw)
        self.in_proj_a = Linear(hs, self.nv, ("linear_heads", "embed"), **kw)
        bound = self.kernel ** -0.5
        conv_init = lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)
        self.conv1d = nnx.Dict(weight=param(rngs, conv_init, (self.conv_dim, 1, self.kernel), pdt,
                                            ("linear_qkv", None, "conv")))
        self.dt_bias = param(rngs, _fill(1.0), (self.nv,), pdt, ("linear_heads",))
        a_init = lambda key, shape, dtype: jnp.log(jax.random.uniform(key, shape, jnp.float32, 0.01, 16.0)
                                                   ).astype(dtype)
        self.A_log = param(rngs, a_init, (self.nv,), jnp.float32, ("linear_heads",))  # FLOAT32_PARAMS
        self.norm = GatedRMSNorm(self.dv, eps=cfg.rms_norm_eps, rngs=rngs)
        self.out_proj = Linear(value_dim, hs, ("embed", "linear_v"), **kw)

    def empty_cache(self, batch: int, dtype) -> DeltaNetCache:
        return DeltaNetCache(conv=jnp.zeros((batch, self.kernel - 1, self.conv_dim), dtype),
                             state=jnp.zeros((batch, self.nv, self.dk, self.dv), jnp.float32))

    def __call__(self, x, mask, cache: DeltaNetCache | None = None, mode: str = "auto"):
        """The token mixer's forward: returns ``(y [b, t, embed], new DeltaNetCache or None)``.

        x ``[b, t, embed]``; mask ``[b, t]`` bool (1 = real token). ``mode``: ``"chunk"``, ``"recurrent"`` or ``"auto"``
        (recurrent for t == 1, chunked otherwise)."""
        b, t, _ = x.shape
        x = jnp.where(mask[..., None], x, jnp.zeros((), x.dtype))
        mixed = self.in_proj_qkv(x)
        z = self.in_proj_z(x).reshape(b, t, self.nv, self.dv)
        beta = jax.nn.sigmoid(self.in_proj_b(x).astype(jnp.float32))
        a = self.in_proj_a(x).astype(jnp.float32)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
            a + self.dt_bias[...].astype(jnp.float32))
        beta = jnp.where(mask[..., None], beta, 0.0)
        g = jnp.where(mask[..., None], g, 0.0)

        prev = cache if cache is not None else self.empty_cache(b, x.dtype)
        lead = None if cache is None else t - mask.sum(axis=1).astype(jnp.int32)  # left-padded segment
        mixed, conv_state = causal_conv(mixed, prev.conv, self.conv1d["weight"][...], lead)
        kd = self.nk * self.dk
        q = mixed[..., :kd].reshape(b, t, self.nk, self.dk).astype(jnp.float32)
        k = mixed[..., kd:2 * kd].reshape(b, t, self.nk, self.dk).astype(jnp.float32)
        v = mixed[..., 2 * kd:].reshape(b, t, self.nv, self.dv).astype(jnp.float32)
        rep = self.nv // self.nk
        if rep > 1:
            q, k = jnp.repeat(q, rep, axis=2), jnp.repeat(k, rep, axis=2)
        q = l2norm(q) * (self.dk ** -0.5)
        k = l2norm(k)
        if mode == "recurrent" or (mode == "auto" and t == 1):
            out, state = recurrent_gated_delta_rule(q, k, v, g, beta, prev.state)
        elif mode in ("chunk", "auto"):
            out, state = chunk_gated_delta_rule(q, k, v, g, beta, prev.state, self.chunk_size)
        else:
            raise ValueError(f"GatedDeltaNet: mode {mode!r} is not one of 'auto', 'chunk', 'recurrent'")
        out = self.norm(out.astype(x.dtype), z)
        y = self.out_proj(out.reshape(b, t, self.nv * self.dv))
        new_cache = DeltaNetCache(conv=conv_state.astype(prev.conv.dtype), state=state) if cache is not None else None
        return y, new_cache
