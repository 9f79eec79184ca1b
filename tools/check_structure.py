"""Check spmdcnn's structure from its source (``ast``, nothing imported): import cycles between modules (imports
inside functions count), modules over 500 lines and functions over 80, and the layering rules below (the layers
are docs/architecture.md#layers-of-the-package). Prints one line per finding; exit status 1 on any.

    python tools/check_structure.py [PACKAGE_DIR] [--max-module 500] [--max-function 80]

Layering:
- only ``spmdcnn/comm/`` imports mpi4py, and nothing in it imports ``spmdcnn.ops``;
- a layer imports only from its own and the layers below it: the command line (``spmdcnn.cli*``), runtime,
  planner, cost, comm, tiling, graph, ops, io, then the rest of the top level (backend, counters, progress);
- CuPy (``cupy``, ``cupyx``) is imported inside functions only, so that the package imports without it.
"""

import argparse
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the layers, top to bottom (docs/architecture.md#layers-of-the-package); modules of the package's top level
# besides the command line (backend, counters, progress, the package itself) are the bottom layer
LAYERS = ("cli", "runtime", "planner", "cost", "comm", "tiling", "graph", "ops", "io", "")


def layer_of(module, top_package):
    """The index in :data:`LAYERS` of ``module``'s layer (None for a module outside the package)."""
    if not within(module, top_package):
        return None
    part = module[len(top_package) + 1:].split(".")[0]
    if part.startswith("cli"):
        return 0
    return LAYERS.index(part) if part in LAYERS else len(LAYERS) - 1


def modules(root):
    """``{dotted module name: path}`` of every ``.py`` file under the package directory ``root``."""
    base = os.path.dirname(os.path.abspath(root))
    found = {}
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


def statements(module, path, tree):
    """``(target, names, at module level)`` for every import statement of ``module``, relative targets made
    absolute: ``import a.b`` is ``("a.b", [])``, ``from a import b, c`` is ``("a", ["a.b", "a.c"])`` (``b`` and
    ``c`` may be modules or names defined in ``a``)."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = []

    def visit(node, top):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, [], top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    prefix = ".".join(parts[:len(parts) - child.level + 1])
                    target = f"{prefix}.{child.module}" if child.module else prefix
                else:
                    target = child.module or ""
                found.append((target, [f"{target}.{alias.name}" for alias in child.names], top))
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
    visit(tree, True)
    return found


def resolve(name, known):
    """The module of the package that ``name`` lies in (its longest known prefix), or None."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imported(target, names, known):
    """The modules one statement imports from, as its layering is judged: the submodules it names, and the
    target itself where it names anything else (or nothing); a name outside the package stays as written."""
    named = {name for name in names if name in known}
    if len(named) < len(names) or not names:
        named.add(resolve(target, known) or target)
    return sorted(named)


def within(name, package):
    return name == package or name.startswith(package + ".")


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(result)


def layering(module, name, top, top_package):
    """The finding for ``module`` importing ``name`` (at module level when ``top``), or None."""
    comm, ops = f"{top_package}.comm", f"{top_package}.ops"
    if within(name, "mpi4py") and not within(module, comm):
        return f"layering {module}: imports {name} (only {comm} imports mpi4py)"
    if within(module, comm) and within(name, ops):
        return f"layering {module}: imports {name} ({comm} imports nothing from {ops})"
    below, above = layer_of(module, top_package), layer_of(name, top_package)
    if above is not None and above < below:
        return f"layering {module}: imports {name} (a layer imports only from its own and the layers below it: " \
               f"{', '.join(layer or 'the rest' for layer in LAYERS)})"
    if top and (within(name, "cupy") or within(name, "cupyx")):
        return f"layering {module}: imports {name} at module level (CuPy is imported inside functions)"
    return None


def findings(root, max_module=500, max_function=80):
    """Every finding for the package directory ``root``, one line each: module by module its size, its functions'
    and its imports' layering, then the import cycles."""
    mods = modules(root)
    top_package = os.path.basename(os.path.abspath(root))
    graph, found = {}, []
    for module, path in sorted(mods.items()):
        source = open(path, encoding="utf-8").read()
        tree = ast.parse(source, path)
        lines = len(source.splitlines())
        if lines > max_module:
            found.append(f"module {module}: {lines} lines (limit {max_module})")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > max_function:
                    found.append(f"function {module}.{node.name} (line {node.lineno}): {length} lines "
                                 f"(limit {max_function})")
        deps = set()
        for target, names, top in statements(module, path, tree):
            for name in imported(target, names, mods):
                problem = layering(module, name, top, top_package)
                if problem and problem not in found:
                    found.append(problem)
            for name in [target, *names]:
                dep = resolve(name, mods)
                # a package importing its own submodules is the ordinary way a package exposes its API
                if dep and dep != module and not dep.startswith(module + "."):
                    deps.add(dep)
        graph[module] = deps
    found += [f"import cycle: {' <-> '.join(component)}" for component in cycles(graph)]
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("package", nargs="?", default=os.path.join(ROOT, "spmdcnn"))
    parser.add_argument("--max-module", type=int, default=500)
    parser.add_argument("--max-function", type=int, default=80)
    args = parser.parse_args(argv)
    found = findings(args.package, args.max_module, args.max_function)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
