"""ext/'s layering, the C analogue of import-linter: every `#include "layer/name.h"`
goes to the file's own layer or a lower one (the order is written once, in
ext/layers.toml), and no component (name.c + name.h + a private name_int.h) reaches
itself through its includes. Also: no C file over 800 lines; and the Python package's import layers
(pyproject.toml [tool.importlinter]) hold."""
import os
import re
import subprocess
import sys
import tomllib

import pytest

EXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "ext")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
MAX_LINES = 800


def load_layers(ext=EXT):
    with open(os.path.join(ext, "layers.toml"), "rb") as f:
        return tomllib.load(f)["layer"]


def layer_of(path, layers):
    """Index of the layer of a path relative to ext/ (a file rule beats a folder rule)."""
    best = None
    for i, layer in enumerate(layers):
        for p in layer["paths"]:
            if path == p:
                return i
            if p.endswith("/") and path.startswith(p) and best is None:
                best = i
    return best


def sources(ext=EXT):
    """{path relative to ext: text} of every .c and .h under ext/."""
    out = {}
    for root, _, files in os.walk(ext):
        for name in files:
            if name.endswith((".c", ".h")):
                full = os.path.join(root, name)
                with open(full, encoding="utf-8") as f:
                    out[os.path.relpath(full, ext)] = f.read()
    return out


def component(path):
    """A file's component: name.c, name.h and its private name_int.h are one."""
    stem = os.path.splitext(path)[0]
    return stem[:-4] if stem.endswith("_int") else stem


def check(srcs, layers):
    """Problems found: files in no layer, includes of missing files or of a higher
    layer, and include cycles between components."""
    problems = []
    graph = {}  # component ("core/table") -> components it includes
    for path, text in sorted(srcs.items()):
        me = layer_of(path, layers)
        if me is None:
            problems.append(f"{path}: in no layer of ext/layers.toml")
            continue
        comp = component(path)
        for inc in INCLUDE.findall(text):
            if inc not in srcs:
                problems.append(f"{path}: includes {inc}, which is not a file under ext/ (write \"layer/name.h\")")
                continue
            to = layer_of(inc, layers)
            if to is not None and to > me:
                problems.append(f"{path} ({layers[me]['name']}) includes {inc}, of the higher layer "
                                f"{layers[to]['name']}")
            other = component(inc)
            if other != comp:
                graph.setdefault(comp, set()).add(other)
    problems += [f"include cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def cycles(graph):
    """Each elementary cycle found by a depth-first search (one per back edge)."""
    found, state, stack = [], {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return found


def test_every_include_goes_to_its_own_layer_or_lower_and_no_cycles():
    assert check(sources(), load_layers()) == []


def test_no_c_file_over_800_lines():
    long = {p: t.count("\n") for p, t in sources().items() if p.endswith(".c") and t.count("\n") > MAX_LINES}
    assert long == {}, f"split these along their sections (STYLE.md): {long}"


def test_the_check_finds_an_upward_include_and_a_cycle():
    """The checker itself: a lower layer including a higher one is caught, and so is
    a cycle between components of one layer; the real tree with one such edge added
    fails too."""
    layers = load_layers()
    srcs = sources()
    up = dict(srcs)
    up["core/table.c"] = srcs["core/table.c"] + '\n#include "server/server.h"\n'
    assert any("core/table.c (core) includes server/server.h" in p for p in check(up, layers))
    cyc = dict(srcs)
    cyc["core/list.h"] = srcs["core/list.h"] + '\n#include "core/fdq.h"\n'
    cyc["core/fdq.h"] = srcs["core/fdq.h"] + '\n#include "core/list.h"\n'
    # the cycle is reported from whichever of its files the walk reaches first
    assert any(p in ("include cycle: core/fdq -> core/list -> core/fdq", "include cycle: core/list -> core/fdq -> core/list")
               for p in check(cyc, layers))


@pytest.mark.parametrize("path,layer", [("core/table.c", "core"), ("engine/engine.h", "engine"),
                                        ("engine/session.c", "session"), ("cmd/dispatch.c", "cmd"),
                                        ("frontend/poller.c", "frontend"), ("server/server.c", "server")])
def test_layer_of(path, layer):
    layers = load_layers()
    assert layers[layer_of(path, layers)]["name"] == layer


# ---- the Python package: import-linter's contract in pyproject.toml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def lint_imports(config):
    exe = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    return subprocess.run([exe if os.path.exists(exe) else "lint-imports", "--config", config, "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_python_package_layers_hold():
    r = lint_imports(os.path.join(ROOT, "pyproject.toml"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_python_layer_check_fails_on_an_upward_import(tmp_path):
    """The same contract turned upside down must be broken: the checker looks."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        contract = tomllib.load(f)["tool"]["importlinter"]["contracts"][0]
    layers = "\n".join(f'    "{x}",' for x in reversed(contract["layers"]))
    cfg = tmp_path / "upside-down.toml"
    cfg.write_text(f'[tool.importlinter]\nroot_packages = ["kvstore"]\n\n[[tool.importlinter.contracts]]\n'
                   f'name = "upside down"\ntype = "layers"\nlayers = [\n{layers}\n]\n')
    r = lint_imports(str(cfg))
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout + r.stderr
