"""The Python API reference (docs/python): every public entity has a docstring, and
Sphinx builds the reference from them without a warning (as ctest checks the C++
reference with Doxygen)."""
import inspect
import os
import subprocess
import sys

import pytest

import gradcomp
import gradcomp.errors
import gradcomp.plan
import gradcomp.torch
import gradcomp.torch.ddp
import gradcomp.torch.fsdp
import gradcomp.torch.lsgd

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODULES = [gradcomp, gradcomp.errors, gradcomp.plan, gradcomp.torch, gradcomp.torch.ddp, gradcomp.torch.fsdp,
           gradcomp.torch.lsgd]


def public_entities():
    """(qualified name, object) of every public name the modules export, and of the
    public methods and properties their classes define."""
    for module in MODULES:
        yield module.__name__, module
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)) or obj.__module__ != module.__name__:
                continue
            yield f"{module.__name__}.{name}", obj
            if inspect.isclass(obj):
                for member, value in vars(obj).items():
                    if not member.startswith("_") or member == "__call__":
                        if inspect.isfunction(value) or isinstance(value, property):
                            yield f"{module.__name__}.{name}.{member}", value


def test_every_public_entity_has_a_docstring():
    undocumented = [name for name, obj in public_entities() if not (inspect.getdoc(obj) or "").strip()]
    assert not undocumented, f"undocumented: {undocumented}"


def test_sphinx_builds_the_reference_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="Sphinx is Debian's python3-sphinx: the run under Debian's torch builds it")
    out = os.environ.get("GRADCOMP_PYTHON_DOCS", str(tmp_path / "html"))
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                          os.path.join(ROOT, "docs", "python"), out], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert os.path.exists(os.path.join(out, "index.html"))


def test_the_methods_table_is_the_registry():
    """docs/torch.md's table of methods lists the methods gradcomp.torch takes (the presets
    of gradcomp/registry.hpp, then compose), each preset with every option of its options
    struct under its C++ name, and the defaults it states are the struct's."""
    import math
    import re

    from gradcomp import _C

    with open(os.path.join(ROOT, "docs", "torch.md")) as f:
        text = f.read()
    rows = dict(re.findall(r"^\| `(\w+)` \|.* \| ([^|]*) \|$", text, re.M))
    assert list(rows) == list(gradcomp.torch.METHODS)
    for method, settings in _C.preset_settings():
        stated = dict(re.findall(r"`(\w+)`(?: \(([^)]*)\))?", rows[method]))
        assert set(stated) == {name for name, _ in settings}, method
        for name, default in settings:
            if stated[name]:
                value = math.inf if stated[name] == "inf" else float(stated[name])
                assert value == pytest.approx(default), f"{method}: {name} ({stated[name]}), the struct's {default}"
