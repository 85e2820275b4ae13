"""Sandbox images built from nothing: a Debian base from `debootstrap` + `docker import`, and a task image.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import docker

RECIPE_DIR = pathlib.Path(__file__).resolve().parents[2] / "sandboxes"
#: Package modules copied into the task image's build context next to the executor.
TASK_EXTRA_FILES = (pathlib.Path(__file__).resolve().parent / "file_trace.py",)
SUITE = "bookworm"
VARIANT = "minbase"
BASE_REPO = "bat-sandbox-base"
TASK_REPO = "bat-sandbox"
IMAGE_LABEL = "bat_jax.image"
_APT_SOURCES = (pathlib.Path("/etc/apt/sources.list.d/debian.sources"), pathlib.Path("/etc/apt/sources.list"))
# Paths dropped from the debootstrap tree before import (caches only).
_PRUNE = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")


def packages(recipe_dir: pathlib.Path = RECIPE_DIR, pkgs: Sequence[str] | None = None) -> list[str]:
    """The Debian packages of the base image.

    `pkgs` (a benchmark's own, `StagedBenchmark.sandbox_packages`) or else `packages.txt`. Raises FileNotFoundError,
    ValueError (naming the bad name)."""
    if pkgs is not None:
        bad = [n for n in pkgs if not (isinstance(n, str) and n and all(c.isalnum() or c in "+-._" for c in n))]
        if bad or not pkgs:
            raise ValueError(f"sandbox packages: {bad or 'none'} given; Debian package names expected")
        return list(pkgs)
    path = recipe_dir / "packages.txt"
    names = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if not all(c.isalnum() or c in "+-._" for c in name):
            raise ValueError(f"{path}:{lineno}: bad package name {name!r}")
        names.append(name)
    if not names:
        raise ValueError(f"{path}: no packages listed")
    return names


def base_tag(recipe_dir: pathlib.Path = RECIPE_DIR, pkgs: Sequence[str] | None = None) -> str:
    """`bat-sandbox-base:<12 hex>`: hash of suite, variant, pruned paths and the package list (`packages`)."""
    h = hashlib.sha256(f"{SUITE}\n{VARIANT}\n{_PRUNE}\n".encode())
    h.update("\n".join(packages(recipe_dir, pkgs)).encode())
    return f"{BASE_REPO}:{h.hexdigest()[:12]}"


def task_tag(recipe_dir: pathlib.Path = RECIPE_DIR, pkgs: Sequence[str] | None = None) -> str:
    """`bat-sandbox:<12 hex>`: the task image tag, a hash of what goes into the image.

    It hashes the base tag, every file (path + bytes) under `task/` (no caches) and the package modules copied next to
    them (`TASK_EXTRA_FILES`)."""
    h = hashlib.sha256(base_tag(recipe_dir, pkgs).encode())
    task_dir = recipe_dir / "task"
    for path in sorted(p for p in task_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(task_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    for path in TASK_EXTRA_FILES:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{TASK_REPO}:{h.hexdigest()[:12]}"


def debian_mirror(sources: tuple[pathlib.Path, ...] = _APT_SOURCES) -> str:
    """The Debian mirror URL of this machine's apt sources (first non-security `URIs:` or `deb` entry).

    Raises:
      RuntimeError: no mirror in any of `sources`.
    """
    for path in sources:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            line = line.strip()
            if line.startswith("URIs:"):
                uris = line.split(":", 1)[1].split()
                if uris and "security" not in uris[0]:
                    return uris[0]
            elif line.startswith("deb ") and "security" not in line:
                return [w for w in line.split()[1:] if not w.startswith("[")][0]
    raise RuntimeError(f"no Debian mirror found in {', '.join(map(str, sources))}")


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    """Whether the engine of `client` holds an image tagged `tag`."""
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_base(client: docker.DockerClient, recipe_dir: pathlib.Path = RECIPE_DIR,
               pkgs: Sequence[str] | None = None) -> str:
    """Builds the base image with debootstrap + `docker import` (needs root and debootstrap); returns its tag."""
    tag = base_tag(recipe_dir, pkgs)
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (apt-get install -y debootstrap; see launch/start_dockerd.sh)")
    with tempfile.TemporaryDirectory(prefix="bat-rootfs-") as tmp:
        rootfs = pathlib.Path(tmp) / "rootfs"
        cmd = ["debootstrap", f"--variant={VARIANT}", "--include=" + ",".join(packages(recipe_dir, pkgs)),
               SUITE, str(rootfs), debian_mirror()]
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        for rel in _PRUNE:
            target = rootfs / rel
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir(parents=True)
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "--change", f"LABEL {IMAGE_LABEL}=base", "-", tag],
                       stdin=tar.stdout, check=True, stdout=sys.stderr)
        tar.stdout.close()
        if tar.wait() != 0:
            raise RuntimeError(f"tar of {rootfs} failed")
    return tag


def build_task(client: docker.DockerClient, recipe_dir: pathlib.Path = RECIPE_DIR,
               pkgs: Sequence[str] | None = None) -> str:
    """Builds the task image (base + executor + `TASK_EXTRA_FILES`) with `docker build`; returns its tag."""
    tag = task_tag(recipe_dir, pkgs)
    with tempfile.TemporaryDirectory(prefix="bat-task-context-") as tmp:
        context = pathlib.Path(tmp) / "task"
        shutil.copytree(recipe_dir / "task", context, ignore=shutil.ignore_patterns("__pycache__"))
        for path in TASK_EXTRA_FILES:
            shutil.copy2(path, context / path.name)
        client.images.build(path=str(context), tag=tag, buildargs={"BASE": base_tag(recipe_dir, pkgs)},
                            labels={IMAGE_LABEL: "task"}, rm=True, network_mode="none")
    return tag


def ensure_images(client: docker.DockerClient | None = None, force: bool = False,
                  recipe_dir: pathlib.Path = RECIPE_DIR, pkgs: Sequence[str] | None = None) -> str:
    """Builds the base and task images when their content-addressed tags are missing; returns the task tag.

    `pkgs`: a benchmark's own package list (its own image); None: `packages.txt`."""
    client = client or docker.from_env(timeout=600)
    if force or not image_exists(client, base_tag(recipe_dir, pkgs)):
        build_base(client, recipe_dir, pkgs)
    tag = task_tag(recipe_dir, pkgs)
    if force or not image_exists(client, tag):
        build_task(client, recipe_dir, pkgs)
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the tags exist")
    parser.add_argument("--print-tag", action="store_true", help="print the task tag without building")
    parser.add_argument("--packages", default=None,
                        help="comma-separated Debian packages of a benchmark's own image (default: packages.txt)")
    args = parser.parse_args(argv)
    pkgs = args.packages.split(",") if args.packages else None
    if args.print_tag:
        print(task_tag(pkgs=pkgs))
        return 0
    print(ensure_images(force=args.force, pkgs=pkgs))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DEBIAN_FRONTEND", "noninteractive")
    sys.exit(main())
