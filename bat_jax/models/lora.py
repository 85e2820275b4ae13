"""LoRA adapters on the decoders' projections: `LoRAConfig`, adding them to a model, merging them back.

A targeted `layers.Linear` gains ``lora_a [r, in]`` and ``lora_b [out, r]`` (``nnx.LoRAParam``, PEFT's layout) and
adds ``(alpha / r) x A^T B^T``; B = 0 at init leaves the outputs as they were. The learner then trains the adapter
only.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
from flax import nnx

from bat_jax.models.layers import Linear

#: The attention, MLP and Gated DeltaNet projections (the issue's "rank 32 on the attention, MLP and Gated DeltaNet
#: projections"); the tiny scalar-per-head projections ``in_proj_a`` / ``in_proj_b`` and the output head are left out.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                   "in_proj_qkv", "in_proj_z", "out_proj")


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """A LoRA adapter (Hu et al., 2021), in the terms of ``peft.LoraConfig``; rank, alpha and dropout default to PEFT's.

    Attributes:
      rank: ``r``, the adapter's inner dimension (PEFT: 8).
      alpha: ``lora_alpha``; the update is scaled by ``alpha / rank`` (PEFT's scaling, not rsLoRA; PEFT: 8).
      target_modules: PEFT's rule: a tuple of names, each matching a module path equal to it or ending in
        ``'.' + name`` (e.g. ``'q_proj'``, ``'layers.0.mlp.up_proj'``), or one string matched with ``re.fullmatch``
        against the whole dotted path (e.g. ``r'.*\\.self_attn\\.(q|v)_proj'``).
      dropout: ``lora_dropout``; only 0 (the default) is supported.
      base_dtype: the frozen base's dtype, e.g. ``'bfloat16'`` (half the base's memory under a float32 param dtype;
        QLoRA's bf16 frozen weights); its floating leaves are cast once when the adapter is added. None (the default)
        keeps the model's param dtype. The adapter and its optimizer state stay float32 either way.
    Raises:
      ValueError: a rank < 1, a non-positive alpha, no targets, a dropout other than 0, or a base_dtype that is not
        a floating dtype.
    """

    rank: int = 8
    alpha: float = 8.0
    target_modules: tuple[str, ...] | str = DEFAULT_TARGETS
    dropout: float = 0.0
    base_dtype: str | None = None

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"LoRAConfig.rank must be >= 1, got {self.rank}")
        if not self.alpha > 0:
            raise ValueError(f"LoRAConfig.alpha must be > 0, got {self.alpha}")
        if not self.target_modules:
            raise ValueError("LoRAConfig.target_modules names no module")
        if self.dropout != 0.0:
            raise ValueError(f"LoRAConfig.dropout: only 0 is supported, got {self.dropout}")
        if self.base_dtype is not None and not _is_float_dtype(self.base_dtype):
            raise ValueError(f"LoRAConfig.base_dtype must be a floating dtype such as 'bfloat16', got "
                             f"{self.base_dtype!r}")
        if not isinstance(self.target_modules, str):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))

    @property
    def scale(self) -> float:
        """``alpha / rank``, PEFT's ``scaling``."""
        return self.alpha / self.rank


def _is_float_dtype(name: str) -> bool:
    try:
        return jnp.issubdtype(jnp.dtype(name), jnp.floating)
    except TypeError:
        return False


def is_target(path: str, targets: tuple[str, ...] | str) -> bool:
    """Whether the module at dotted ``path`` is a LoRA target (peft ``tuners_utils.check_target_module_exists``)."""
    if isinstance(targets, str):
        return re.fullmatch(targets, path) is not None
    return any(path == t or path.endswith("." + t) for t in targets)


def _uniform_a(key, shape):
    """PEFT's default ``lora_A`` init, ``kaiming_uniform_(a=sqrt(5))``: uniform in ``±1/sqrt(in_features)``."""
    bound = shape[1] ** -0.5
    return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


def add_lora(model: nnx.Module, config: LoRAConfig, seed: int = 0) -> list[str]:
    """Gives every targeted ``Linear`` of ``model`` a fresh float32 adapter (in place); returns the targeted paths.

    ``lora_a`` is drawn from ``seed`` (one key per module, in path order), ``lora_b`` is zero. The adapter's logical
    axes follow the base weight's (the rank axis is replicated). Raises ValueError when nothing matches (naming the
    targets) or when the model already carries adapters."""
    if has_lora(model):
        raise ValueError("add_lora: the model already carries LoRA adapters")
    found = [(".".join(map(str, p)), m) for p, m in nnx.iter_modules(model) if isinstance(m, Linear)]
    targets = [(p, m) for p, m in found if is_target(p, config.target_modules)]
    if not targets:
        raise ValueError(f"LoRAConfig.target_modules {config.target_modules!r} match no projection of the model "
                         f"(e.g. {[p for p, _ in found[:3]]})")
    keys = jax.random.split(jax.random.key(seed), len(targets))
    for key, (_, linear) in zip(keys, targets):
        out_f, in_f = linear.weight.shape
        out_name, in_name = linear.weight.get_metadata().get("out_sharding") or (None, None)
        linear.lora_a = nnx.LoRAParam(_uniform_a(key, (config.rank, in_f)), out_sharding=(None, in_name),
                                      eager_sharding=False)
        linear.lora_b = nnx.LoRAParam(jnp.zeros((out_f, config.rank), jnp.float32), out_sharding=(out_name, None),
                                      eager_sharding=False)
        linear.lora_scale = config.scale
    if config.base_dtype is not None:
        cast_base(model, config.base_dtype)
    return [p for p, _ in targets]


def cast_base(model: nnx.Module, dtype: str) -> None:
    """Casts every floating ``BASE`` parameter of ``model`` to ``dtype``, in place.

    One leaf at a time, so the peak is one leaf's copy, not the model's; shardings and logical axes are kept, the
    adapter is untouched."""
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Param) and not isinstance(node, nnx.LoRAParam) \
                and jnp.issubdtype(node.dtype, jnp.floating):
            node.set_value(node.get_value().astype(dtype))


#: The frozen base's parameters under an adapter: every ``nnx.Param`` that is not an ``nnx.LoRAParam``.
BASE = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))


def has_lora(model: nnx.Module) -> bool:
    """Whether ``model`` carries any ``nnx.LoRAParam``."""
    return bool(jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


def adapted_linears(model: nnx.Module) -> list[tuple[str, Linear]]:
    """(dotted path, module) of every ``Linear`` of ``model`` carrying an adapter, in module order."""
    return [(".".join(map(str, p)), m) for p, m in nnx.iter_modules(model)
            if isinstance(m, Linear) and m.lora_a is not None]


def adapter_paths(model: nnx.Module) -> list[str]:
    """Dotted paths of the ``Linear`` modules of ``model`` that carry an adapter, in module order."""
    return [p for p, _ in adapted_linears(model)]


def merged_weight(linear: Linear) -> jax.Array:
    """``W + (alpha / r) B A`` (``[out, in]``) in the base weight's dtype, computed in float32 (PEFT's merge)."""
    w = linear.weight[...]
    if linear.lora_a is None:
        return w
    delta = jnp.matmul(linear.lora_b[...].astype(jnp.float32), linear.lora_a[...].astype(jnp.float32),
                       precision=jax.lax.Precision.HIGHEST)
    return (w.astype(jnp.float32) + linear.lora_scale * delta).astype(w.dtype)
