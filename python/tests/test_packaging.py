"""What the package's build does about the machine it meets: without torch (pip's isolated
build environment) it stops with one line saying what to run instead; with a compiler that
links libstdc++ statically it links the shared one."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_a_build_without_torch_names_what_to_run():
    # torch made unimportable, as in pip's isolated build environment
    code = "import sys; sys.modules['torch'] = None; sys.argv = ['setup.py', '--name']; exec(open('setup.py').read())"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip() == ("gradcomp: the build compiles against the installed torch, which this environment "
                                   "lacks: install torch (1.13 or >= 2.1) first, then run "
                                   "`pip install --no-build-isolation .`"), done.stderr


def setup_function_named(name):
    """A function of setup.py, compiled alone (running setup.py would build)."""
    import ast
    import tempfile
    with open(os.path.join(ROOT, "setup.py")) as f:
        tree = ast.parse(f.read())
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
    scope = {"os": os, "subprocess": subprocess, "tempfile": tempfile}
    exec(compile(ast.Module(body=found, type_ignores=[]), "setup.py", "exec"), scope)
    return scope[name]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
def test_the_build_sees_a_compiler_that_links_libstdcxx_statically(tmp_path):
    # Such a compiler (the GPU machine's, 2026-11-26) gave the extension a copy of libstdc++
    # of its own beside torch's; setup.py then links the shared one.
    probe = setup_function_named("links_libstdcxx_statically")
    assert probe(["g++"]) is False
    static = tmp_path / "g++-static"
    static.write_text('#!/bin/sh\nexec g++ "$@" -static-libstdc++\n')
    static.chmod(0o755)
    assert probe([str(static)]) is True
