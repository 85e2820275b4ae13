"""Kernel-observed file reads and writes (bat_jax/sandbox/file_trace.py): what a call did, never what it said."""

import subprocess

import pytest

from bat_jax.sandbox.file_trace import FileTrace


def _run(root, script):
    subprocess.run(["bash", "-c", script], cwd=root, check=True)


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "model.py").write_text("X = 1\n")
    (tmp_path / "task.md").write_text("T-1\n")
    trace = FileTrace(str(tmp_path))
    yield tmp_path, trace
    trace.close()


def test_reads_and_writes_of_any_process(tree):
    root, trace = tree
    trace.begin()
    _run(root, "cat task.md >/dev/null; python3 -c 'import sys; sys.path.insert(0, \"method\"); import model'; "
               "mkdir -p out/deep && echo 1 > out/deep/a && cp task.md copy.md")
    reads, writes, complete = trace.end()
    assert reads == ["method/model.py", "task.md"] and complete
    assert writes == ["copy.md", "out/deep/a"]


def test_code_that_only_names_files_reads_and_writes_nothing(tree):
    root, trace = tree
    trace.begin()
    _run(root, "# cat task.md > out.txt\npython3 -c '# import model\n\"open(task.md)\"\nif False: open(\"task.md\")'"
               "; ls -la method >/dev/null; stat task.md >/dev/null")
    assert trace.end() == ([], [], True)


def test_each_call_sees_only_its_own_events(tree):
    root, trace = tree
    _run(root, "cat task.md >/dev/null")  # before begin(): not this call's
    trace.begin()
    _run(root, "echo x > w")
    assert trace.end() == ([], ["w"], True)


def test_renamed_directories_keep_true_paths(tree):
    root, trace = tree
    (root / "fake").mkdir()
    (root / "fake" / "model.py").write_text("fake\n")
    trace.begin()
    _run(root, "mv method orig && mv fake method && cat method/model.py >/dev/null && "
               "mkdir -p a/b && mv a c && echo 1 > c/b/f")
    reads, writes, _ = trace.end()
    assert reads == ["method/model.py"]  # the directory now called method (the fake one), under its new name
    assert writes == ["c/b/f"]
    trace.begin()
    _run(root, "cat orig/model.py >/dev/null")
    assert trace.end()[0] == ["orig/model.py"]


def test_moved_out_directory_is_no_longer_reported(tree, tmp_path_factory):
    root, trace = tree
    outside = tmp_path_factory.mktemp("outside")
    trace.begin()
    _run(root, f"mv method {outside}/ && cat {outside}/method/model.py >/dev/null && mv {outside}/method back "
               "&& cat back/model.py >/dev/null")
    reads, writes, _ = trace.end()
    # the read outside the tree is not reported under the old name; the directory moved back in counts as made
    # by the call (its later read may be lost: a watch on a new directory can only be added after it appears)
    assert "method/model.py" not in reads and writes == ["back/model.py"]


def test_caps_mark_the_trace_incomplete(tmp_path):
    trace = FileTrace(str(tmp_path), max_dirs=3, max_paths=2)
    try:
        trace.begin()
        _run(tmp_path, "mkdir -p a/b/c/d && for i in 1 2 3 4; do echo $i > f$i; done")
        reads, writes, complete = trace.end()
        assert not complete and len(writes) == 2
    finally:
        trace.close()
