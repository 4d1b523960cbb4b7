#!/usr/bin/env python3
"""Fails when a source of libptrain includes a header of a component its CMake DEPS do not name.

Each src/ptrain/<folder>/CMakeLists.txt declares components with ptrain_component(NAME n SOURCES ... DEPS ...).
A file belongs to the component that lists it (x.cpp, or x_cuda.cpp / x_none.cpp for the build-specific halves);
a header to the component of its x.cpp; anything else in a folder to the folder's own component (the one named
after the folder, or its only one). A file may include its own component's headers and those of the components
its DEPS name directly: DEPS are what docs/architecture.md calls "what it may use", so a header used without
being named there is a dependency the build files and the docs do not show, even where a named component
happens to link it.

Usage: check_component_includes.py ROOT (the directory holding src/ptrain). Prints one line per violation
(file, line, the included header, its component, and the DEPS) and exits 1 when there is any; exits 2 when the
CMake files cannot be read as ptrain_component calls.

Some folders below a component may not include a component its DEPS name, directly or through the headers they
include: FOLDERS_WITHOUT lists them.
"""

import re
import sys
from pathlib import Path

COMPONENT_CALL = re.compile(r"ptrain_component\s*\((.*?)\)", re.S)
SET_CALL = re.compile(r"\bset\s*\(\s*(\w+)\s+([^)]*)\)", re.S)
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](ptrain/[^">]+)[">]')
KEYWORDS = ("NAME", "SOURCES", "DEPS", "LIBS")
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
# Folders below src/ptrain whose files may not include the components named, whatever their component's DEPS say,
# nor any header that includes one of them (at any depth): a header that brings the config along lets a file use it
# without naming it. The run's parts (train/run/) are built from the Plan's resolved sections, never from the config
# they came from: a part that read the config could decide again what make_plan decided.
FOLDERS_WITHOUT = {"train/run": ("config",)}


class Component:
    def __init__(self, name, folder, sources, deps):
        self.name, self.folder, self.sources, self.deps = name, folder, sources, deps


def strip_comments(text):
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def parse_folder(cmake_file):
    """The ptrain_component calls of one CMakeLists.txt, with ${var} expanded from its set() calls (every
    branch's values: a file belongs to its component whichever build picks it)."""
    text = strip_comments(cmake_file.read_text())
    variables = {}
    for name, values in SET_CALL.findall(text):
        variables.setdefault(name, []).extend(values.split())
    components = []
    for body in COMPONENT_CALL.findall(text):
        fields, key = {k: [] for k in KEYWORDS}, None
        for word in body.split():
            if word in KEYWORDS:
                key = word
            elif key is None:
                raise ValueError(f"{cmake_file}: ptrain_component argument '{word}' before NAME")
            else:
                expanded = re.fullmatch(r"\$\{(\w+)\}", word)
                fields[key].extend(variables.get(expanded.group(1), []) if expanded else [word])
        if len(fields["NAME"]) != 1:
            raise ValueError(f"{cmake_file}: ptrain_component without exactly one NAME")
        components.append(Component(fields["NAME"][0], cmake_file.parent.name, fields["SOURCES"], fields["DEPS"]))
    return components


def stem_of_source(source):
    stem = Path(source).stem
    for suffix in ("_cuda", "_none"):
        if stem.endswith(suffix):
            return stem[: -len(suffix)]
    return stem


def load(root):
    library = root / "src" / "ptrain"
    by_folder, by_name = {}, {}
    for cmake_file in sorted(library.glob("*/CMakeLists.txt")):
        components = parse_folder(cmake_file)
        if components:
            by_folder[cmake_file.parent.name] = components
            for c in components:
                by_name[c.name] = c
    if not by_name:
        raise ValueError(f"{library}: no ptrain_component in any */CMakeLists.txt")
    return library, by_folder, by_name


def owner(relative, by_folder):
    """The component a path below src/ptrain belongs to, or None for a folder without components."""
    parts = Path(relative).parts
    components = by_folder.get(parts[0])
    if not components:
        return None
    if len(parts) == 2:
        name = parts[1]
        for c in components:
            if name in c.sources:
                return c
        for c in components:
            if any(stem_of_source(s) == Path(name).stem for s in c.sources):
                return c
    own = [c for c in components if c.name == parts[0]]
    return own[0] if own else (components[0] if len(components) == 1 else None)


def includes_of(path):
    """(line number, header) of each #include "ptrain/..." of a file."""
    found = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        match = INCLUDE.match(line)
        if match:
            found.append((number, match.group(1)))
    return found


def chain_to_refused(header, refused, library, by_folder, memo, visiting=frozenset()):
    """The headers from `header` to the first one (at any depth of its includes) of a component in refused, as a
    list ending with it; None when there is none."""
    if header in memo:
        return memo[header]
    included = owner(Path(header).relative_to("ptrain"), by_folder)
    if included is not None and included.name in refused:
        return [header]
    path = library / Path(header).relative_to("ptrain")
    chain = None
    if path.is_file() and header not in visiting:
        for _, inner in includes_of(path):
            rest = chain_to_refused(inner, refused, library, by_folder, memo, visiting | {header})
            if rest:
                chain = [header] + rest
                break
    memo[header] = chain
    return chain


def violations(root):
    library, by_folder, by_name = load(root)
    for name, c in by_name.items():
        for dep in c.deps:
            if dep not in by_name:
                yield f"src/ptrain/{c.folder}/CMakeLists.txt: component {name} names DEPS {dep}, which no ptrain_component declares"
    refused_chains = {}  # folder -> header -> its chain_to_refused
    for path in sorted(p for p in library.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
        relative = path.relative_to(library)
        including = owner(relative, by_folder)
        if including is None:
            continue
        allowed = {including.name, *including.deps}
        for number, header in includes_of(path):
            included = owner(Path(header).relative_to("ptrain"), by_folder)
            shown = f"src/ptrain/{relative}:{number}: includes {header}"
            for folder, refused in FOLDERS_WITHOUT.items():
                if not relative.is_relative_to(folder):
                    continue
                if included is not None and included.name in refused:
                    yield f"{shown} (component {included.name}): no file under src/ptrain/{folder}/ may include it"
                    continue
                chain = chain_to_refused(header, refused, library, by_folder, refused_chains.setdefault(folder, {}))
                if chain:
                    reached = owner(Path(chain[-1]).relative_to("ptrain"), by_folder).name
                    yield (f"{shown}, which includes {' -> '.join(chain[1:])} (component {reached}): no file under "
                           f"src/ptrain/{folder}/ may include it, directly or through the headers it includes")
            if included is None:
                if (library / Path(header).relative_to("ptrain")).exists():
                    yield f"{shown}, which belongs to no ptrain_component"
                continue
            if included.name not in allowed:
                yield (f"{shown} (component {included.name}), but the DEPS of component {including.name} name only: "
                       f"{' '.join(including.deps) or 'nothing'}")


def main(argv):
    if len(argv) != 2:
        print("usage: check_component_includes.py ROOT", file=sys.stderr)
        return 2
    try:
        found = list(violations(Path(argv[1])))
    except (OSError, ValueError) as e:
        print(f"check_component_includes: error: {e}", file=sys.stderr)
        return 2
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} include(s) of a component the including component's DEPS do not name", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
