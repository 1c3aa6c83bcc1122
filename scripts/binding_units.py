"""Writes the binding's translation units: one per selector of gradcomp/registry.hpp's
GRADCOMP_SELECTORS and per backend, each instantiating build<Backend, select::S>
(python/csrc/compressors.hpp), so that the compiler's memory and time per file stay low.
setup.py imports it; tests/CMakeLists.txt runs it (``python3 scripts/binding_units.py
BACKEND DIR`` prints the units' paths, one per line). A unit whose text is unchanged is
not rewritten, so its object is kept."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGISTRY = os.path.join(ROOT, "include", "gradcomp", "registry.hpp")
# Per backend: the units' extension and the header that defines build<Backend, S> there.
BACKENDS = {"host": (".cpp", "compressors.hpp"), "cuda": (".cu", "cuda/compressors_cuda.cuh")}


def selectors():
    """The selectors' names, in the registry's order."""
    with open(REGISTRY) as f:
        text = f.read()
    block = re.search(r"#define GRADCOMP_SELECTORS\(X\)((?:[^\n]*\\\n)*[^\n]*)", text)
    return re.findall(r"X\((\w+)\)", block.group(1))


def write_units(backend, directory):
    """The units of `backend` under `directory`, written where their text changed."""
    extension, header = BACKENDS[backend]
    os.makedirs(directory, exist_ok=True)
    units = []
    for selector in selectors():
        path = os.path.join(directory, selector + extension)
        text = (f'#include "{header}"\n\nnamespace gradcomp_py {{\n'
                f"GRADCOMP_PY_BUILD(template, gc::backend::{backend}, {selector})\n}}  // namespace gradcomp_py\n")
        if not os.path.exists(path) or open(path).read() != text:
            with open(path, "w") as f:
                f.write(text)
        units.append(path)
    return units


if __name__ == "__main__":
    print("\n".join(write_units(sys.argv[1], sys.argv[2])))
