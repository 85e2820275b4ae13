"""Model configurations for the Qwen3 (dense), Qwen3.5 (hybrid) and Llama (dense) text families.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"


def _rope_from_hf(hf: dict[str, Any], default_partial: float) -> tuple[float, float]:
    """Returns (rope_theta, partial_rotary_factor) from new-style ``rope_parameters`` or legacy keys."""
    rope = hf.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"config.json: rope_type {rope_type!r} is not supported (only 'default')")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", default_partial))
    return float(theta), float(partial)


def _common_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [k for k in required if k not in hf]
    if missing:
        raise ValueError(f"config.json: missing required fields {missing}")
    heads = hf["num_attention_heads"]
    return dict(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_hidden_layers=int(hf["num_hidden_layers"]),
        num_attention_heads=int(heads),
        num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=tuple(eos) if isinstance(eos := hf.get("eos_token_id"), list) else eos,
        pad_token_id=hf.get("pad_token_id"),
    )


def _check_act(hf: dict[str, Any]) -> None:
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json: hidden_act {hf.get('hidden_act')!r} is not supported (only 'silu')")


@dataclasses.dataclass(frozen=True)
class DenseDecoderConfig:
    """The fields a dense decoder shares, with Qwen3's defaults.

    Every layer is full attention, with RoPE over the whole head. ``Qwen3Config`` and ``LlamaConfig`` add their family,
    HF conversion and (Llama) defaults and rotary scaling. Sizes in units (tokens, channels)."""

    vocab_size: int = 4096
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    dtype: str = "float32"
    param_dtype: str = "float32"

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def rotary_dim(self) -> int:
        return self.head_dim

    @property
    def layer_types(self) -> tuple[str, ...]:
        return (FULL_ATTENTION,) * self.num_hidden_layers


@dataclasses.dataclass(frozen=True)
class Qwen3Config(DenseDecoderConfig):
    """Qwen3 dense decoder (transformers ``Qwen3ForCausalLM``): ``DenseDecoderConfig`` with its defaults."""

    family = "qwen3"

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], **overrides: Any) -> "Qwen3Config":
        """Builds from a transformers ``Qwen3Config`` dict. Raises ValueError on unsupported fields."""
        _check_act(hf)
        if hf.get("use_sliding_window", False):
            raise ValueError("config.json: use_sliding_window=true is not supported")
        theta, partial = _rope_from_hf(hf, 1.0)
        if partial != 1.0:
            raise ValueError(f"config.json: Qwen3 partial_rotary_factor {partial} != 1 is not supported")
        return dataclasses.replace(cls(**_common_from_hf(hf), rope_theta=theta), **overrides)

    def to_hf_config(self) -> dict[str, Any]:
        """Returns a ``config.json`` dict readable by transformers ``AutoConfig`` (``Qwen3ForCausalLM``)."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            **_common_to_hf(self),
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "use_sliding_window": False,
            "sliding_window": None,
            "layer_types": list(self.layer_types),
        }


@dataclasses.dataclass(frozen=True)
class Qwen3_5Config:
    """Qwen3.5 hybrid text decoder (transformers ``Qwen3_5ForCausalLM`` / ``Qwen3_5TextConfig``).

    ``layer_types`` lists ``"linear_attention"`` (Gated DeltaNet) or ``"full_attention"`` (gated
    attention) per layer; empty (the default) means every ``full_attention_interval``-th layer is full attention.
    ``chunk_size`` is the Gated DeltaNet chunk length of the chunked (parallel) form.
    """

    vocab_size: int = 4096
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    layer_types: tuple[str, ...] = ()
    full_attention_interval: int = 4
    partial_rotary_factor: float = 0.25
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    chunk_size: int = 64
    dtype: str = "float32"
    param_dtype: str = "float32"

    family = "qwen3_5"

    def __post_init__(self):
        if not self.layer_types:
            n = self.full_attention_interval
            object.__setattr__(self, "layer_types", tuple(
                LINEAR_ATTENTION if (i + 1) % n else FULL_ATTENTION for i in range(self.num_hidden_layers)))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        bad = [t for t in self.layer_types if t not in (FULL_ATTENTION, LINEAR_ATTENTION)]
        if bad or len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"Qwen3_5Config.layer_types: {self.layer_types} (need {self.num_hidden_layers} "
                             f"entries of {FULL_ATTENTION!r}/{LINEAR_ATTENTION!r})")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("Qwen3_5Config: linear_num_value_heads must be a multiple of linear_num_key_heads")

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], **overrides: Any) -> "Qwen3_5Config":
        """Builds from a ``Qwen3_5TextConfig`` dict, or a ``Qwen3_5Config`` dict.

        A ``Qwen3_5Config`` dict is read by its ``text_config``; a top-level ``tie_word_embeddings`` wins. Raises
        ValueError on unsupported fields."""
        if "text_config" in hf:
            text = dict(hf["text_config"])
            if "tie_word_embeddings" in hf:
                text["tie_word_embeddings"] = hf["tie_word_embeddings"]
            hf = text
        _check_act(hf)
        theta, partial = _rope_from_hf(hf, 0.25)
        cfg = cls(
            **_common_from_hf(hf),
            linear_conv_kernel_dim=int(hf.get("linear_conv_kernel_dim", 4)),
            linear_key_head_dim=int(hf.get("linear_key_head_dim", 128)),
            linear_value_head_dim=int(hf.get("linear_value_head_dim", 128)),
            linear_num_key_heads=int(hf.get("linear_num_key_heads", 16)),
            linear_num_value_heads=int(hf.get("linear_num_value_heads", 32)),
            layer_types=tuple(hf.get("layer_types") or ()),
            full_attention_interval=int(hf.get("full_attention_interval", 4)),
            partial_rotary_factor=partial,
            rope_theta=theta,
        )
        return dataclasses.replace(cfg, **overrides)

    def to_hf_config(self) -> dict[str, Any]:
        """Returns a ``config.json`` dict readable by transformers (``Qwen3_5ForCausalLM``, text only)."""
        return {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            **_common_to_hf(self),
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "layer_types": list(self.layer_types),
            "partial_rotary_factor": self.partial_rotary_factor,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary_factor},
        }


ROPE_SCALING_TYPES = ("linear", "dynamic", "llama3")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """A rotary scaling variant of transformers' ``rope_parameters`` (``modeling_rope_utils.py``, 5.19).

    Attributes:
      rope_type: ``"linear"`` (inverse frequencies / ``factor``), ``"dynamic"`` (NTK: the base grows with
        the longest position of the call beyond ``max_position_embeddings``) or ``"llama3"`` (Llama 3.1:
        wavelengths above ``original_max_position_embeddings / low_freq_factor`` divided by ``factor``,
        below ``... / high_freq_factor`` kept, smooth in between).
      factor: the scaling factor (> 0).
      low_freq_factor, high_freq_factor: Llama 3 only.
      original_max_position_embeddings: Llama 3 only (tokens).
    Raises:
      ValueError: an unknown ``rope_type`` or a missing / non-positive parameter.
    """

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self):
        if self.rope_type not in ROPE_SCALING_TYPES:
            raise ValueError(f"config.json: rope_type {self.rope_type!r} is not supported "
                             f"(default, {', '.join(ROPE_SCALING_TYPES)})")
        if not self.factor > 0:
            raise ValueError(f"config.json: rope scaling factor must be > 0, got {self.factor}")
        if self.rope_type == "llama3":
            need = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            missing = [k for k in need if getattr(self, k) is None]
            if missing:
                raise ValueError(f"config.json: llama3 rope scaling lacks {missing}")
            if not self.high_freq_factor > self.low_freq_factor:
                raise ValueError("config.json: llama3 rope scaling needs high_freq_factor > low_freq_factor")

    def to_hf(self) -> dict[str, Any]:
        """The fields as ``rope_parameters`` entries (without ``rope_theta``)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def _rope_scaling_from_hf(hf: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from ``rope_parameters`` (transformers 5) or legacy ``rope_scaling`` + ``rope_theta``."""
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    if rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("config.json: Llama partial_rotary_factor != 1 is not supported")
    if rope_type in ("default", None):
        return theta, None
    if "factor" not in rope and rope_type in ROPE_SCALING_TYPES:
        raise ValueError(f"config.json: rope_type {rope_type!r} lacks 'factor'")
    omp = rope.get("original_max_position_embeddings")
    return theta, RopeScaling(rope_type=rope_type, factor=float(rope.get("factor", 1.0)),
                              low_freq_factor=rope.get("low_freq_factor"),
                              high_freq_factor=rope.get("high_freq_factor"),
                              original_max_position_embeddings=None if omp is None else int(omp))


@dataclasses.dataclass(frozen=True)
class LlamaConfig(DenseDecoderConfig):
    """Llama dense decoder (transformers ``LlamaForCausalLM``).

    GQA without q/k norm, full RoPE with an optional ``rope_scaling`` (``RopeScaling``), SwiGLU MLP without bias.
    ``DenseDecoderConfig`` with Llama's defaults for the norm epsilon, RoPE base and context length."""

    rms_norm_eps: float = 1e-5
    rope_theta: float = 10_000.0
    max_position_embeddings: int = 8192
    rope_scaling: RopeScaling | None = None

    family = "llama"

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], **overrides: Any) -> "LlamaConfig":
        """Builds from a transformers ``LlamaConfig`` dict.

        Raises ValueError on unsupported fields (activation, ``mlp_bias``, ``pretraining_tp`` > 1, a rope type other
        than default / linear / dynamic / llama3)."""
        _check_act(hf)
        if hf.get("mlp_bias", False):
            raise ValueError("config.json: Llama mlp_bias=true is not supported")
        if int(hf.get("pretraining_tp", 1) or 1) != 1:
            raise ValueError(f"config.json: Llama pretraining_tp={hf['pretraining_tp']} is not supported (only 1)")
        theta, scaling = _rope_scaling_from_hf(hf)
        common = _common_from_hf({"rms_norm_eps": 1e-6, "max_position_embeddings": 2048, **hf})
        return dataclasses.replace(cls(**common, rope_theta=theta, rope_scaling=scaling), **overrides)

    def to_hf_config(self) -> dict[str, Any]:
        """Returns a ``config.json`` dict readable by transformers ``AutoConfig`` (``LlamaForCausalLM``)."""
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope = {**self.rope_scaling.to_hf(), "rope_theta": self.rope_theta}
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **_common_to_hf(self),
            "rope_parameters": rope,
            "mlp_bias": False,
            "pretraining_tp": 1,
        }


def _common_to_hf(cfg: DenseDecoderConfig | Qwen3_5Config) -> dict[str, Any]:
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "dtype": "bfloat16" if cfg.param_dtype == "bfloat16" else "float32",
    }


def config_from_hf(hf: dict[str, Any], **overrides: Any) -> Qwen3Config | Qwen3_5Config | LlamaConfig:
    """Picks the family from ``model_type`` (``qwen3`` / ``qwen3_5`` / ``qwen3_5_text`` / ``llama``).

    Raises ValueError naming the model_type when it is not supported."""
    mt = hf.get("model_type")
    if mt == "qwen3":
        return Qwen3Config.from_hf_config(hf, **overrides)
    if mt in ("qwen3_5", "qwen3_5_text"):
        return Qwen3_5Config.from_hf_config(hf, **overrides)
    if mt == "llama":
        return LlamaConfig.from_hf_config(hf, **overrides)
    raise ValueError(f"config.json: model_type {mt!r} is not supported (qwen3, qwen3_5, qwen3_5_text, llama)")
