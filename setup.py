"""Builds gradcomp._C, the torch extension, from the C++ headers in include/ (no copy).

The extension is compiled against the torch already installed, which pip's isolated
build environment lacks: install with ``pip install --no-build-isolation .``. With a CUDA
build of torch and nvcc (CUDA_HOME), the extension also carries the CUDA backend
(GRADCOMP_PY_CUDA); GRADCOMP_CUDA=0 builds it for the CPU only. gradcomp/_build.py records
how it was built (the torch, and why there is no CUDA backend where there is none).
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:
    sys.exit("gradcomp: the build compiles against the installed torch, which this environment lacks: install "
             "torch (1.13 or >= 2.1) first, then run `pip install --no-build-isolation .`")
if tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2]) < (1, 13):
    sys.exit(f"gradcomp: torch {torch.__version__} is too old: gradcomp needs torch 1.13 or >= 2.1")

root = os.path.dirname(os.path.abspath(__file__))
csrc = os.path.join("python", "csrc")
sources = [os.path.join(csrc, f) for f in ("module.cpp", "messages.cpp", "process_group.cpp", "ddp_steps.cpp", "leader.cpp",
                                           "options.cpp",
                                           os.path.join("host", "factory.cpp"))]


# One translation unit per selector of gradcomp/registry.hpp and backend (under build/units).
units = importlib.util.spec_from_file_location("binding_units", os.path.join(root, "scripts", "binding_units.py"))
binding_units = importlib.util.module_from_spec(units)
units.loader.exec_module(binding_units)


def selector_units(backend):
    return [os.path.relpath(u, root) for u in binding_units.write_units(backend, os.path.join(root, "build", "units", backend))]


sources += selector_units("host")

if os.environ.get("GRADCOMP_CUDA", "1") == "0":
    no_cuda = "it was built with GRADCOMP_CUDA=0"
elif torch.version.cuda is None:
    no_cuda = f"it was built against a CPU-only torch ({torch.__version__})"
elif cpp_extension.CUDA_HOME is None:
    no_cuda = (f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, but no CUDA toolkit (nvcc, "
               "CUDA_HOME) was found when gradcomp was built: install one and reinstall gradcomp")
    print(f"gradcomp: building for the CPU only: {no_cuda}", file=sys.stderr)
else:
    no_cuda = None
with_cuda = no_cuda is None
# -g0: Python's own flags ask for debug information, which for these template-heavy units
# costs a quarter of the compile time (137 s -> 101 s for the exact_topk unit, CI machine
# type, 2026-11-26) and most of the module's size.
cxx = ["-std=c++20", "-O3", "-g0", "-fopenmp", "-Wno-deprecated-declarations"]
nvcc = ["-std=c++20", "-O3", "--expt-relaxed-constexpr", "--fmad=false", "-Xcompiler", "-fopenmp"]
define_macros = []
if with_cuda:
    sources += [os.path.join(csrc, "cuda", "factory.cu")] + selector_units("cuda")
    define_macros.append(("GRADCOMP_PY_CUDA", "1"))
    extension = cpp_extension.CUDAExtension
else:
    extension = cpp_extension.CppExtension



def links_libstdcxx_statically(cxx):
    """Whether the C++ driver ``cxx`` (a command list) links libstdc++ into a shared object
    statically, as some relocatable toolchains are configured to. Probed by linking one."""
    with tempfile.TemporaryDirectory() as d:
        source, probe = os.path.join(d, "probe.cpp"), os.path.join(d, "probe.so")
        with open(source, "w") as f:
            f.write("#include <sstream>\nstd::string probe() { std::ostringstream s; s << 1; return s.str(); }\n")
        if subprocess.run(cxx + ["-shared", "-fPIC", source, "-o", probe], capture_output=True).returncode != 0:
            return False  # the build itself will say what is wrong with the compiler
        with open(probe, "rb") as f:
            return b"libstdc++.so." not in f.read()  # no DT_NEEDED entry naming the shared one


class build_ext_on_shared_runtime(cpp_extension.BuildExtension):
    """torch's BuildExtension, linking the shared libstdc++ (the one torch runs on) where the
    compiler would link its own copy statically: the two copies then share the C++ runtime's
    data, and the first error message's std::ostringstream ends in "free(): invalid pointer"
    (seen on the GPU machine, 2026-11-26, with Python's -Wl,-Bsymbolic-functions)."""

    def build_extensions(self):
        cxx = list(getattr(self.compiler, "compiler_cxx", None) or [os.environ.get("CXX", "c++")])
        if links_libstdcxx_statically(cxx):
            print(f"gradcomp: {cxx[0]} links libstdc++ statically; linking the shared libstdc++ instead",
                  file=sys.stderr)
            for ext in self.extensions:
                ext.extra_link_args.insert(0, "-l:libstdc++.so.6")
        super().build_extensions()


class build_py_with_record(build_py):
    """Also writes gradcomp/_build.py: the torch the extension is compiled against, and why
    it has no CUDA backend (None where it has one)."""

    def run(self):
        super().run()
        path = os.path.join(self.build_lib, "gradcomp", "_build.py")
        with open(path, "w") as f:
            f.write(f'"""How this gradcomp was built (written by setup.py)."""\n\nTORCH = {torch.__version__!r}\n'
                    f"NO_CUDA = {no_cuda!r}\n")


setup(
    ext_modules=[
        extension(
            "gradcomp._C",
            sources,
            include_dirs=[os.path.join(root, "include"), os.path.join(root, csrc)],
            define_macros=define_macros,
            extra_compile_args={"cxx": cxx, "nvcc": nvcc},
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": build_ext_on_shared_runtime, "build_py": build_py_with_record},
)
