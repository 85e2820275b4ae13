"""Sandbox image recipe: package list, content-addressed tags, mirror discovery (no engine needed)."""

import pathlib
import shutil

import pytest

from bat_jax.sandbox import images


def test_package_list_is_the_one_the_task_families_need():
    assert images.packages() == ["python3", "python3-numpy", "python3-scipy", "python3-nibabel", "python3-pil"]


def test_tags_are_content_addressed(tmp_path):
    recipe = tmp_path / "sandboxes"
    shutil.copytree(images.RECIPE_DIR, recipe)
    base, task = images.base_tag(recipe), images.task_tag(recipe)
    assert (base, task) == (images.base_tag(), images.task_tag())  # same content, same tags
    assert base.startswith("bat-sandbox-base:") and len(base.split(":")[1]) == 12
    (recipe / "task" / "executor.py").write_text((recipe / "task" / "executor.py").read_text() + "\n# edit\n")
    assert images.base_tag(recipe) == base and images.task_tag(recipe) != task  # only the task layer rebuilds
    (recipe / "packages.txt").write_text("python3\n# comment\npython3-numpy  # inline\n")
    assert images.packages(recipe) == ["python3", "python3-numpy"]
    assert images.base_tag(recipe) != base
    (recipe / "packages.txt").write_text("python3; rm -rf /\n")
    with pytest.raises(ValueError, match="packages.txt:1"):
        images.packages(recipe)


def test_a_benchmarks_own_package_list_gives_its_own_tags_and_the_default_list_the_shared_ones():
    assert images.task_tag(pkgs=images.packages()) == images.task_tag()  # the same list: the shared image
    own_base, own = images.base_tag(pkgs=("python3",)), images.task_tag(pkgs=("python3",))
    assert own_base != images.base_tag() and own != images.task_tag() and own.startswith("bat-sandbox:")
    assert images.task_tag(pkgs=["python3"]) == own  # a list or a tuple: the same image
    for bad in (("python3", "x; rm -rf /"), (), ("",)):
        with pytest.raises(ValueError, match="Debian package names expected"):
            images.task_tag(pkgs=bad)


def test_mirror_read_from_apt_sources(tmp_path):
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n"
                      "Types: deb\nURIs: http://mirror.example/debian-security\n")
    assert images.debian_mirror((tmp_path / "absent", deb822)) == "http://mirror.example/debian"
    legacy = tmp_path / "sources.list"
    legacy.write_text("# c\ndeb [arch=amd64] http://m2.example/debian bookworm main\n")
    assert images.debian_mirror((legacy,)) == "http://m2.example/debian"
    with pytest.raises(RuntimeError, match="no Debian mirror"):
        images.debian_mirror((tmp_path / "absent",))


def test_no_registry_host_in_recipes():
    paths = [p for p in pathlib.Path(images.RECIPE_DIR).rglob("*") if p.is_file() and p.suffix != ".pyc"]
    paths += [pathlib.Path(images.__file__), pathlib.Path(images.RECIPE_DIR).parent / "launch" / "start_dockerd.sh"]
    text = "".join(p.read_text() for p in paths if p.exists())
    for host in ("://", "debian.org", "docker.io/", "docker.com", "ghcr.io", "quay.io"):
        assert host not in text, host  # the package name `docker.io` is fine, a registry address is not
