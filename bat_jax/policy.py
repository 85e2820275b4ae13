"""The policy: a model with its tokenizer and chat family, and the agent loop that samples from it.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from flax import nnx

from bat_jax.errors import ConfigPathError
from bat_jax.models import chat
from bat_jax.models.episode import EpisodeBuilder
from bat_jax.models.lora import LoRAConfig, add_lora
from bat_jax.prompts import PROMPT_STYLES
from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig
from bat_jax.rollout.engine import RolloutEngine
from bat_jax.sandbox.backends import SandboxFactory
from bat_jax.sandbox.types import Sandbox

#: Architectures of the embedded tiny default (`PolicyConfig.architecture`).
TINY_ARCHITECTURES = ("qwen3_5", "qwen3")


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Which policy to train.

    Attributes:
      architecture: the tiny default's model, 'qwen3_5' (paper: Qwen3.5 hybrid) or 'qwen3' (dense). A checkpoint's
        architecture comes from its config.json.
      chat_family: the chat family of a checkpoint's template (`models.chat.CHAT_FAMILIES`: 'qwen3_5', 'qwen3',
        'chatml'); None = the model family's own (`models.chat.MODEL_CHAT_FAMILY`, e.g. 'chatml' for the Llama
        SmolLM2 of `python -m bat_jax.models.gguf_import`). The tiny default always renders turns with the shipped
        tokenizer's Qwen3.5 template.
      checkpoint_dir: a local Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files);
        None = the embedded tiny default (random init + the shipped tiny tokenizer).
      tiny: model-config overrides of the tiny default (e.g. hidden_size, num_hidden_layers).
      dtype: compute dtype ('float32' on CPU, 'bfloat16' on GPU/TPU).
      seed: parameter-init seed of the tiny default.
      prompt_style: 'full' (paper scale: full system prompt, tools block, brief and skills) or 'compact'
        (small policies: short system prompt naming the tools, terse brief and one-line skills).
      lora: a LoRA adapter on the model (`models.lora.LoRAConfig`; its A drawn from `seed`, B = 0): the learner then
        trains the adapter only and keeps the base frozen. None (the default) trains every weight.
    """

    architecture: str = "qwen3_5"
    chat_family: str | None = None
    checkpoint_dir: str | None = None
    tiny: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dtype: str = "float32"
    seed: int = 0
    prompt_style: str = "full"
    lora: LoRAConfig | None = None

    def __post_init__(self):
        if self.architecture not in TINY_ARCHITECTURES:
            raise ValueError(f"PolicyConfig.architecture must be one of {TINY_ARCHITECTURES}, got "
                             f"{self.architecture!r}")
        if self.chat_family is not None:
            if self.checkpoint_dir is None:
                raise ValueError("PolicyConfig.chat_family names a checkpoint's template; the tiny default renders "
                                 "with the shipped tokenizer's Qwen3.5 template (set checkpoint_dir, or leave it None)")
            if self.chat_family not in chat.CHAT_FAMILIES:
                raise ValueError(f"PolicyConfig.chat_family must be one of {sorted(chat.CHAT_FAMILIES)}, got "
                                 f"{self.chat_family!r}")
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"PolicyConfig.prompt_style must be one of {PROMPT_STYLES}, got {self.prompt_style!r}")

    def base_source(self) -> str:
        """Where the base weights come from: the checkpoint directory (absolute) or the tiny default's name."""
        if self.checkpoint_dir is not None:
            return str(pathlib.Path(self.checkpoint_dir).resolve())
        return f"tiny default ({self.architecture}, seed {self.seed})"


@dataclasses.dataclass
class Policy:
    """A model with its tokenizer, chat family and prompt style.

    `chat_family` is the chat family of the tokenizer's template (how turns and tool calls are rendered; the shipped
    tiny tokenizer carries the Qwen3.5 template whatever the model). `prompt_style` is the style its turns are rendered
    in (`PROMPT_STYLES`)."""

    model: nnx.Module
    tokenizer: Any
    chat_family: str
    prompt_style: str = "full"


def build_policy(config: PolicyConfig, sharding_fn: Callable[[tuple, tuple], Any] | None = None) -> Policy:
    """The tiny default or a local HF checkpoint.

    `sharding_fn` places each checkpoint parameter (`hf_io.load_pretrained`'s; a run passes
    `learn.learner.checkpoint_sharding`, so the model never exists whole on one device); default the first local
    device. The tiny default is initialised on the default device.

    Raises:
      errors.ConfigPathError: `checkpoint_dir` does not exist or lacks config.json, weights (*.safetensors) or the
        tokenizer (tokenizer.json or tokenizer_config.json) — the message names the binding, the path and what is
        missing.
    """
    if config.checkpoint_dir is not None:
        path = pathlib.Path(config.checkpoint_dir)
        missing = _missing_checkpoint_files(path)
        if missing:
            raise ConfigPathError(
                f"policy.PolicyConfig.checkpoint_dir = {str(path)!r}: "
                + ("no such directory" if not path.is_dir() else f"incomplete checkpoint, missing {missing}")
                + "; put a local copy of the Hugging Face checkpoint there or bind the binding to one")
        from transformers import AutoTokenizer

        from bat_jax.models import hf_io

        model = hf_io.load_pretrained(path, sharding_fn=sharding_fn, dtype=config.dtype)
        if config.lora is not None:
            add_lora(model, config.lora, config.seed)
        family = config.chat_family or chat.MODEL_CHAT_FAMILY[model.config.family]
        return Policy(model, AutoTokenizer.from_pretrained(str(path)), family, config.prompt_style)
    from bat_jax.models.tokenizer import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    overrides = {"vocab_size": len(tokenizer), "dtype": config.dtype, **dict(config.tiny)}
    if config.architecture == "qwen3_5":
        from bat_jax.models.configs import Qwen3_5Config
        from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

        model = Qwen3_5ForCausalLM(Qwen3_5Config(**overrides), rngs=nnx.Rngs(config.seed))
    else:
        from bat_jax.models.configs import Qwen3Config
        from bat_jax.models.qwen3 import Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(**overrides), rngs=nnx.Rngs(config.seed))
    if config.lora is not None:
        add_lora(model, config.lora, config.seed)
    return Policy(model, tokenizer, "qwen3_5", config.prompt_style)  # the shipped tokenizer's chat template


def _missing_checkpoint_files(path: pathlib.Path) -> list[str]:
    """What a Hugging Face checkpoint directory lacks to be loaded: config.json, weights, a tokenizer."""
    if not path.is_dir():
        return ["the directory"]
    missing = [] if (path / "config.json").is_file() else ["config.json"]
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors")
    if not ((path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()):
        missing.append("tokenizer.json")
    return missing


def make_agent_loop(policy: Policy, engine: RolloutEngine, make_sandbox: SandboxFactory, config: AgentLoopConfig,
                    sandbox_release: Callable[[Sandbox], None] | None = None) -> AgentLoop:
    """An AgentLoop over `engine` with the policy's chat template (token in, token out).

    `make_sandbox` / `sandbox_release`: where episodes get and give back sandboxes
    (`sandbox.backends.SandboxBackend.make` / `.release`; release None = close each one)."""
    im_start = policy.tokenizer.convert_tokens_to_ids("<|im_start|>")
    return AgentLoop(engine, lambda: EpisodeBuilder(policy.tokenizer, policy.chat_family), make_sandbox, config,
                     sandbox_release=sandbox_release, extra_stop_ids=(im_start,))
