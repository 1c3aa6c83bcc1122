"""What the package's build says when it cannot build: without torch (pip's isolated
build environment), it stops with one line saying what to run instead."""
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_a_build_without_torch_names_what_to_run():
    # torch made unimportable, as in pip's isolated build environment
    code = "import sys; sys.modules['torch'] = None; sys.argv = ['setup.py', '--name']; exec(open('setup.py').read())"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip() == ("gradcomp: the build compiles against the installed torch, which this environment "
                                   "lacks: install torch (1.13 or >= 2.1) first, then run "
                                   "`pip install --no-build-isolation .`"), done.stderr
