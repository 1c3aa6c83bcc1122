#!/usr/bin/env python3
"""include/gradcomp's headers include one way: no header includes one that includes it
back, directly or through others, and none needs an #error guard to be included in
order (docs/design.md, "Layout"). Prints each cycle found and exits 1; run by ctest."""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*<(gradcomp/[^>]+)>', re.M)


def graph(root):
    """Each header (relative to root) and the gradcomp headers it includes."""
    return {str(p.relative_to(root)): INCLUDE.findall(p.read_text())
            for p in sorted(root.glob('gradcomp/**/*')) if p.suffix in ('.hpp', '.cuh')}


def cycle_through(edges, start):
    """A path start -> ... -> start, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in edges.get(node, []):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def main(root):
    edges = graph(root)
    problems = []
    for header, includes in edges.items():
        problems += [f'{header} includes {i}, which does not exist' for i in includes if i not in edges]
        cycle = cycle_through(edges, header)
        if cycle:
            problems.append('cycle: ' + ' -> '.join(cycle))
        if re.search(r'^\s*#\s*error', (root / header).read_text(), re.M):
            problems.append(f'{header} has an #error guard')
    for p in problems:
        print(p)
    print(f'{len(edges)} headers, {sum(map(len, edges.values()))} includes, {len(problems)} problems')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else 'include')))
