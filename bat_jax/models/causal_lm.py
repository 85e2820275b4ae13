"""Decoder-only causal LM shared by the Qwen3, Qwen3.5 and Llama families (one interface for all).

Module tree mirrors transformers (``model.embed_tokens``, ``model.layers[i]``, ``model.norm``,
``lm_head``) so a parameter's dotted path is its safetensors key.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from bat_jax.models.cache import AttentionCache, DecodeCache, empty_cache
from bat_jax.models.configs import LINEAR_ATTENTION
from bat_jax.models.gated_deltanet import GatedDeltaNet
from bat_jax.models.layers import MLP, Attention, Embedding, Linear, RMSNorm


REMAT_POLICIES = {
    "none": None,  # no rematerialisation: every intermediate of every layer is kept for the backward pass
    "full": jax.checkpoint_policies.nothing_saveable,  # keep only each layer's input; recompute the layer
    "dots": jax.checkpoint_policies.dots_saveable,  # keep matmul outputs, recompute the elementwise work
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep weight matmuls only
}
"""Per-layer remat policies by name (``ForwardOptions.remat``)."""


@dataclasses.dataclass(frozen=True)
class ForwardOptions:
    """How a full forward spends memory; the values it computes do not depend on these.

    Attributes:
      remat: a key of :data:`REMAT_POLICIES`; applied to every decoder layer (:func:`ordered_remat`: a
        ``jax.checkpoint`` whose backward runs layer by layer) in ``hidden_states`` (the cached prefill/decode
        paths never remat).
      attention_block: queries per attention block (float32 scores ``[b, heads, block, t]``); 0 = dense.
      activation_sharding: a ``NamedSharding`` whose spec's first entry names the mesh axes of the batch
        dimension; the residual stream ``[b, t, embed]`` is constrained to it between layers (skipped when
        ``b`` does not divide). None = no constraint.
    Raises:
      ValueError: an unknown ``remat`` name or a negative ``attention_block``.
    """

    remat: str = "none"
    attention_block: int = 1024
    activation_sharding: jax.sharding.NamedSharding | None = None

    def __post_init__(self):
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"ForwardOptions.remat must be one of {tuple(REMAT_POLICIES)}, got {self.remat!r}")
        if self.attention_block < 0:
            raise ValueError(f"ForwardOptions.attention_block must be >= 0, got {self.attention_block}")

    def constrain(self, x: jax.Array) -> jax.Array:
        """``x`` with its leading (batch) axis constrained to ``activation_sharding``'s batch axes."""
        sh = self.activation_sharding
        if sh is None or not len(sh.spec) or sh.spec[0] is None:
            return x
        axes = sh.spec[0] if isinstance(sh.spec[0], tuple) else (sh.spec[0],)
        if x.shape[0] % math.prod(sh.mesh.shape[a] for a in axes):
            return x
        spec = jax.sharding.PartitionSpec(sh.spec[0], *([None] * (x.ndim - 1)))
        return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(sh.mesh, spec))


DEFAULT_OPTIONS = ForwardOptions()


def ordered_remat(fn, policy):
    """``jax.checkpoint(fn, policy=policy)`` whose backward pass runs in layer order: same values, bounded memory.

    ``fn(state, x, *rest) -> y``: ``state`` a pytree of float arrays (the layer's parameters), ``x`` the float
    residual stream ``[b, t, embed]``, ``rest`` non-differentiable arrays (masks, integer positions; they get no
    cotangent), ``y`` shaped like ``x``. The forward is ``fn`` itself; the backward recomputes ``fn`` under
    ``policy`` (exactly as ``jax.checkpoint`` does) and returns ``(d state, d x)``.

    Why: a plain ``jax.checkpoint`` leaves the recomputation of every layer free of any dependency on the
    incoming cotangent, and the weight-gradient contractions free of any dependency on the next layer's
    backward. XLA's TPU scheduler then hoists several layers' recomputed intermediates (MLP activations
    ``[b, t, intermediate]``, DeltaNet projections) and delays their weight gradients, so the backward's peak
    grows by ~2 GB per decoder layer at Qwen3.5-9B / 12,288 tokens (launch/bench/compile_probe.py). Two
    ``optimization_barrier``s pin the order: the recomputation starts only once the cotangent ``dy`` has
    arrived, and ``d x`` (which starts the previous layer's backward) is released only together with
    ``d state``. At most one layer's recomputed activations are live at a time.
    """

    remat_fn = jax.checkpoint(fn, policy=policy)

    def call(state, x, *rest):
        @jax.custom_vjp
        def layer(state, x):
            return fn(state, x, *rest)

        def fwd(state, x):
            return jax.vjp(lambda s, h: remat_fn(s, h, *rest), state, x)

        def bwd(vjp, dy):
            vjp, dy = jax.lax.optimization_barrier((vjp, dy))
            return jax.lax.optimization_barrier(vjp(dy))

        layer.defvjp(fwd, bwd)
        return layer(state, x)

    return call


class DecoderLayer(nnx.Module):
    """Pre-norm residual block: token mixer (attention or Gated DeltaNet) then SwiGLU MLP."""

    def __init__(self, cfg, layer_type: str, *, zero_centered: bool, output_gate: bool, qk_norm: bool = True,
                 rngs: nnx.Rngs):
        dt, pdt = cfg.compute_dtype, jnp.dtype(cfg.param_dtype)
        self.is_linear = layer_type == LINEAR_ATTENTION
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(cfg, rngs=rngs)
        else:
            self.self_attn = Attention(cfg, output_gate=output_gate, zero_centered=zero_centered, qk_norm=qk_norm,
                                       rngs=rngs)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, dtype=dt, param_dtype=pdt, rngs=rngs)
        norm_kw = dict(eps=cfg.rms_norm_eps, zero_centered=zero_centered, param_dtype=pdt, rngs=rngs)
        self.input_layernorm = RMSNorm(cfg.hidden_size, **norm_kw)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, **norm_kw)

    def empty_cache(self, cfg, batch: int, max_len: int, dtype):
        if self.is_linear:
            return self.linear_attn.empty_cache(batch, dtype)
        shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        return AttentionCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))

    def __call__(self, x, mask, positions, cache, write_index, slot_mask, deltanet_mode, attention_block=0):
        h = self.input_layernorm(x)
        if self.is_linear:
            h, cache = self.linear_attn(h, mask, cache, deltanet_mode)
        else:
            h, cache = self.self_attn(h, mask, positions, cache, write_index, slot_mask, attention_block)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), cache


class DecoderModel(nnx.Module):
    """Embedding, decoder layers and final norm (transformers ``*TextModel``)."""

    def __init__(self, cfg, *, zero_centered: bool, output_gate: bool, qk_norm: bool = True, rngs: nnx.Rngs):
        dt, pdt = cfg.compute_dtype, jnp.dtype(cfg.param_dtype)
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dt, param_dtype=pdt, rngs=rngs)
        self.layers = nnx.List([
            DecoderLayer(cfg, lt, zero_centered=zero_centered, output_gate=output_gate, qk_norm=qk_norm, rngs=rngs)
            for lt in cfg.layer_types])
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, zero_centered=zero_centered,
                            param_dtype=pdt, rngs=rngs)


class CausalLM(nnx.Module):
    """Base class; subclasses set ``zero_centered_norm``, ``output_gate``, ``qk_norm`` and the config type."""

    zero_centered_norm = False
    output_gate = False
    qk_norm = True

    def __init__(self, config, *, rngs: nnx.Rngs):
        self.config = config
        self.model = DecoderModel(config, zero_centered=self.zero_centered_norm,
                                  output_gate=self.output_gate, qk_norm=self.qk_norm, rngs=rngs)
        self.lm_head = None if config.tie_word_embeddings else Linear(
            config.hidden_size, config.vocab_size, ("vocab", "embed"), dtype=config.compute_dtype,
            param_dtype=jnp.dtype(config.param_dtype), rngs=rngs)

    def __call__(self, input_ids, attention_mask=None, positions=None, *, deltanet_mode: str = "auto",
                 options: ForwardOptions = DEFAULT_OPTIONS):
        """Full forward without a cache: logits ``[b, t, vocab]`` float32 (see module docstring)."""
        return self.logits_from_hidden(self.hidden_states(input_ids, attention_mask, positions,
                                                          deltanet_mode=deltanet_mode, options=options))

    def hidden_states(self, input_ids, attention_mask=None, positions=None, *, deltanet_mode: str = "auto",
                      options: ForwardOptions = DEFAULT_OPTIONS):
        """Final-norm hidden states ``[b, t, embed]`` (compute dtype) of a full forward without a cache.

        ``input_ids [b, t] int32``, ``attention_mask [b, t]`` 0/1 (None = all real) are the inputs."""
        b, t = input_ids.shape
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        if positions is None:
            positions = jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)
        x = options.constrain(self.model.embed_tokens(input_ids))
        policy = REMAT_POLICIES[options.remat]
        for layer in self.model.layers:
            if options.remat == "none":
                x = layer(x, mask, positions, None, None, None, deltanet_mode, options.attention_block)[0]
            else:
                graphdef, state = nnx.split(layer)

                def run(state, x, mask, positions, graphdef=graphdef):
                    # matrices in the compute dtype before use (Linear casts them anyway: same values), so an
                    # FSDP all-gather inside the rematerialised layer moves bf16, not fp32
                    state = jax.tree.map(lambda v: v.astype(x.dtype) if v.ndim == 2 else v, state)
                    return nnx.merge(graphdef, state)(x, mask, positions, None, None, None, deltanet_mode,
                                                      options.attention_block)[0]

                x = ordered_remat(run, policy)(state, x, mask, positions)
            x = options.constrain(x)
        return options.constrain(self.model.norm(x))

    def logits_from_hidden(self, h):
        """Output head: ``h [..., embed]`` -> logits ``[..., vocab]`` float32 (tied or untied)."""
        logits = self.model.embed_tokens.attend(h) if self.lm_head is None else self.lm_head(h)
        return logits.astype(jnp.float32)

    def init_cache(self, batch: int, max_len: int, dtype=None) -> DecodeCache:
        """Empty decode cache for ``batch`` rows and ``max_len`` token slots.

        Attention K/V and the conv history in ``dtype`` (default: compute dtype), DeltaNet state in float32."""
        dtype = jnp.dtype(dtype or self.config.compute_dtype)
        layers = tuple(layer.empty_cache(self.config, batch, max_len, dtype) for layer in self.model.layers)
        return empty_cache(layers, batch, max_len)

    def prefill(self, input_ids, attention_mask, cache: DecodeCache, positions=None,
                *, deltanet_mode: str = "auto", attention_block: int = DEFAULT_OPTIONS.attention_block,
                last_only: bool = False):
        """Feeds ``input_ids [b, t]`` (left padded, mask ``[b, t]``) after the cache's tokens.

        Returns ``(logits [b, t, vocab] float32, cache)``; with ``last_only`` the logits of the last position only,
        ``[b, 1, vocab]`` (a sampler needs no more; the output head then costs 1/t of the full one)."""
        return self._run(input_ids, attention_mask, positions, cache, deltanet_mode, attention_block, last_only)

    def decode_step(self, tokens, cache: DecodeCache, live=None):
        """Feeds one token per row, ``tokens [b]`` int32, and returns ``(logits [b, vocab], cache)``.

        ``live [b]`` bool (default all): rows where it is False feed nothing (their slot is masked, their DeltaNet state
        and conv history and their next position stay as they were), so a finished row's cache stays that of its real
        tokens."""
        mask = None if live is None else live[:, None]
        logits, cache = self._run(tokens[:, None], mask, None, cache, "recurrent")
        return logits[:, 0], cache

    def _run(self, input_ids, attention_mask, positions, cache, deltanet_mode, attention_block=0, last_only=False):
        """The cached path (prefill / decode): one pass over the layers, updating ``cache``."""
        b, t = input_ids.shape
        mask = (jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool))
        write_index = cache.length
        slot_mask = jax.lax.dynamic_update_slice(cache.slot_mask, mask, (0, write_index))
        base = cache.next_position[:, None]
        if positions is None:
            positions = base + jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)
        x = self.model.embed_tokens(input_ids)
        new_layers = []
        for i, layer in enumerate(self.model.layers):
            x, layer_cache = layer(x, mask, positions, cache.layers[i], write_index, slot_mask, deltanet_mode,
                                   attention_block)
            new_layers.append(layer_cache)
        logits = self.logits_from_hidden(self.model.norm(x[:, -1:] if last_only else x))
        cache = DecodeCache(layers=tuple(new_layers), length=cache.length + t, slot_mask=slot_mask,
                            next_position=cache.next_position + mask.sum(axis=1).astype(jnp.int32))
        return logits, cache
