#!/usr/bin/env python3
"""The CUDA build's own sources, compiled and matched on a machine without a GPU or a CUDA LibTorch.

Usage: check_cuda_build.py PROJECT_ROOT BUILD_DIR

A CUDA build differs from the CPU one by the files it swaps in: each src/ptrain/**/X_none.cpp has a CUDA
half (X_cuda.cpp, or X.cpp beside it), and src/ptrain/kernels/cuda/*.cu are compiled by nvcc. CPU CI builds
only the _none halves, so a CUDA half that no longer compiles, or that lacks a function its _none half
defines, or that calls a ptrain function nobody defines, would first show on a GPU machine, where device
time is scarce. This checker finds such breakage here:
  1. every .cu file (src/ptrain's kernels, bench/'s benchmarks) compiles with nvcc for sm_90 (the H100/H200 the GPU sessions use);
  2. every CUDA half compiles with the CPU build's own flags (taken from BUILD_DIR/compile_commands.json,
     precompiled header included) plus PTRAIN_WITH_CUDA=1, against the LibTorch headers installed here
     (Debian's libtorch-dev ships c10/cuda and ATen/cuda); test sources that test PTRAIN_WITH_CUDA are
     checked the same way;
  3. what the _none halves define in namespace ptrain, the CUDA halves define too;
  4. what the CUDA halves and .cu objects call in namespace ptrain is defined by them or by the CPU build's
     other objects (BUILD_DIR/src/ptrain/*/*.a, less the _none halves).
The C++ sources of one compile command compile as one unity batch (the CUDA halves, the test sources and the
_none halves each apart), as the CUDA build compiles them (PTRAIN_UNITY_BUILD=ON, the default, batches each
target's sources), because each compile pays seconds of LibTorch's template instantiations whatever the source
holds; a batch that fails compiles member by member, so that a broken source is named, and a symbol only a
_none half defines is named with that half (found by compiling its batch's members alone).
The LibTorch here is 1.13 and the GPU machines' is 2.x; the few calls that differ between them live in
core/torch_compat.h, so the halves compile against either.

Each compile is cached by content in BUILD_DIR/cuda_check_cache/: an object is reused when its command, the
compiler's version and the content of every file it read (the source, the headers its dependency file lists,
the precompiled header) are those of the run that made it, so that a check with nothing changed compiles
nothing and a change to a .cu file, a CUDA half or a header they include recompiles what read it. Steps 3
and 4 (nm over the objects and the CPU archives) run each time.

NVCC in the environment names the nvcc to use (else PATH's, else /usr/local/cuda/bin's).
Exit 0: all matched; 1: something did not (each problem names its file); 77: this machine cannot check
(no nvcc, no compile_commands.json, no LibTorch CUDA headers), with the reason on stdout.
"""

import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
# Mangled names in namespace ptrain: _ZN6ptrain..., _ZNK6ptrain... (const members), and the typeinfo and
# vtable symbols of its classes (_ZTIN6ptrain, _ZTVN6ptrain).
PTRAIN_SYMBOL = re.compile(r"^_Z(?:N|NK|TIN|TVN|TSN)6ptrain")
# Debian's libtorch-dev installs c10/cuda's headers but not the one CMake generates beside them in a CUDA
# build of PyTorch; it only says whether c10_cuda is a shared library.
GENERATED_MACROS = "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"


# nvcc's optimisation of the .cu files: the front end, cicc and ptxas all run, so that what does not compile for
# sm_90 (a template, an intrinsic, inline PTX) is found, with less of the optimisation that makes batch_norm.cu's
# compile most of this check's time (-O3: 59 s for the .cu files on two cores, this: 35 s).
NVCC_OPTIMISATION = ["-O0", "-Xcicc", "-O1", "-Xptxas", "-O0"]


class Problem(Exception):
    pass


def find_nvcc():
    if "NVCC" in os.environ:  # the CUDA toolkit of the caller's choice (or, naming none there, none)
        named = Path(os.environ["NVCC"])
        return named if named.exists() else None
    found = shutil.which("nvcc")
    if found:
        return Path(found)
    toolkit = Path("/usr/local/cuda/bin/nvcc")
    return toolkit if toolkit.exists() else None


def halves(project):
    """(none_half, cuda_half) pairs of src/ptrain, and the .cu files."""
    pairs = []
    for none_half in sorted((project / "src/ptrain").rglob("*_none.cpp")):
        stem = none_half.name[: -len("_none.cpp")]
        cuda_half = none_half.with_name(stem + "_cuda.cpp")
        if not cuda_half.exists():
            cuda_half = none_half.with_name(stem + ".cpp")
        if not cuda_half.exists():
            raise Problem(f"{none_half.relative_to(project)}: no CUDA half beside it "
                          f"({stem}_cuda.cpp or {stem}.cpp)")
        pairs.append((none_half, cuda_half))
    kernels = sorted((project / "src/ptrain").rglob("*.cu")) + sorted((project / "bench").rglob("*.cu"))
    return pairs, kernels


def tests_reading_the_cuda_macro(project):
    return sorted(p for p in (project / "tests").rglob("*.cpp") if "PTRAIN_WITH_CUDA" in p.read_text(errors="replace"))


def unity_source(path, members):
    """A source including each of members, as CMake's unity batches do; rewritten only when they change."""
    text = "".join(f'#include "{member}"\n' for member in members)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def compile_command_for(source, entries):
    """The compile command of source's target (its own entry, or that of the unity batch including it), and
    whether the CPU build compiles source at all."""
    source = source.resolve()
    for entry in entries:
        if Path(entry["directory"], entry["file"]).resolve() == source:
            return entry, True
    for entry in entries:
        batch = Path(entry["directory"], entry["file"])
        if batch.suffix == ".cxx" and batch.exists() and f'"{source}"' in batch.read_text(errors="replace"):
            return entry, True
    # A source that only CUDA builds compile (kernels/cudnn/conv_stats_graph_none.cpp, taken where cuDNN's backend
    # header is missing) gets the flags of its component's other sources.
    for entry in entries:
        if "/src/ptrain/" in entry["file"] and _component_of(Path(entry["file"])) == _component_of(source):
            return entry, False
    raise Problem(f"{source}: not in compile_commands.json, nor any source of its component")


def _component_of(path):
    """<component> of .../src/ptrain/<component>/...: a source's, or a unity batch's (BUILD/src/ptrain/<component>/CMakeFiles/...)."""
    parts = path.parts
    for index in range(1, len(parts) - 1):
        if parts[index - 1] == "src" and parts[index] == "ptrain":
            return parts[index + 1]
    return None


def flags_of(entry):
    words = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    flags, skip = [], False
    for word in words[1:]:
        if skip:
            skip = False
            continue
        if word in ("-o", "-c"):
            skip = True
            continue
        if word == entry["file"] or re.fullmatch(r"-O[0-3s]", word):
            continue
        flags.append(word)
    return words[0], flags


def include_dirs(entries):
    dirs = {Path("/usr/include")}
    for entry in entries:
        _, flags = flags_of(entry)
        for flag, following in zip(flags, flags[1:] + [""]):
            if flag == "-isystem":
                dirs.add(Path(following))
            elif flag.startswith("-I"):
                dirs.add(Path(flag[2:]))
    return dirs


def run(command, cwd):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    return result.returncode, (result.stdout + result.stderr).strip()


class CompileCache:
    """Objects by content: BUILD_DIR/cuda_check_cache/<key>.o and <key>.json, key the hash of the command (the
    object's path left out), its folder and the compiler's version; the .json lists every file the compile read,
    with its content's hash."""

    def __init__(self, folder):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.digests = {}
        self.versions = {}
        self.hits = 0
        self.used = set()

    def digest(self, path):
        path = str(path)
        if path not in self.digests:
            h = hashlib.sha256()
            try:
                with open(path, "rb") as f:
                    while block := f.read(1 << 22):
                        h.update(block)
                self.digests[path] = h.hexdigest()
            except OSError:
                self.digests[path] = None
        return self.digests[path]

    def version(self, compiler):
        if compiler not in self.versions:
            self.versions[compiler] = run([compiler, "--version"], None)[1]
        return self.versions[compiler]

    def key(self, command, cwd, obj):
        words = ["<object>" if obj is not None and word == str(obj) else word for word in command]
        text = json.dumps([self.version(command[0]), str(cwd), words])
        return hashlib.sha256(text.encode()).hexdigest()

    def lookup(self, key, obj):
        """Whether the cached result of key is current; copies its object to obj if so."""
        self.used.add(key)
        record = self.folder / f"{key}.json"
        if not record.exists():
            return False
        inputs = json.loads(record.read_text())["inputs"]
        if any(self.digest(path) != digest for path, digest in inputs.items()):
            return False
        if obj is not None:
            cached = self.folder / f"{key}.o"
            if not cached.exists():
                return False
            shutil.copyfile(cached, obj)
        self.hits += 1
        return True

    def store(self, key, command, cwd, depfile, obj):
        inputs = {}
        for path in dependencies(depfile, cwd) + precompiled_headers(command, cwd):
            inputs[str(path)] = self.digest(path)
        if obj is not None:
            shutil.copyfile(obj, self.folder / f"{key}.o")
        (self.folder / f"{key}.json").write_text(json.dumps({"command": command, "inputs": inputs}, indent=0))

    def prune(self):
        """Removes the results no compile of this check asked for (those of sources or flags since changed)."""
        for path in self.folder.glob("*.json"):
            if path.stem not in self.used:
                path.unlink()
                path.with_suffix(".o").unlink(missing_ok=True)


def dependencies(depfile, cwd):
    """The files a make-style dependency file (-MD -MF) lists, the target left out."""
    text = Path(depfile).read_text().replace("\\\n", " ")
    _, _, listed = text.partition(": ")
    return [Path(cwd, word) for word in listed.split()]


def precompiled_headers(command, cwd):
    """What -include brings in and GCC leaves out of the dependency file when it takes a precompiled header:
    the header and its .gch (rebuilt by the build whenever a header it holds changes)."""
    found = []
    for flag, following in zip(command, command[1:]):
        if flag == "-include":
            header = Path(cwd, following)
            found += [header] + ([Path(f"{header}.gch")] if Path(f"{header}.gch").exists() else [])
    return found


def ptrain_symbols(objects, which):
    """{symbol: the object defining it} of namespace ptrain in objects or archives: strong definitions for
    which="--defined-only", references for "--undefined-only"."""
    symbols = {}
    for obj in objects:
        code, out = run(["nm", which, "-P", str(obj)], None)
        if code != 0:
            raise Problem(f"nm {obj}: {out}")
        for line in out.splitlines():
            parts = line.split()
            strong = which == "--undefined-only" or (len(parts) >= 2 and parts[1] in "TDBR")
            if parts and strong and PTRAIN_SYMBOL.match(parts[0]):
                symbols.setdefault(parts[0], obj)
    return symbols


def demangle(symbols):
    if not symbols:
        return []
    out = subprocess.run(["c++filt"], input="\n".join(symbols), capture_output=True, text=True).stdout
    return out.splitlines()


def check(project, build):
    nvcc = find_nvcc()
    if nvcc is None:
        print("skipped: no nvcc on PATH or in /usr/local/cuda/bin (the CUDA toolkit), so the CUDA sources cannot be compiled here")
        return SKIP
    commands = build / "compile_commands.json"
    if not commands.exists():
        print(f"skipped: {commands} is missing (configure with CMAKE_EXPORT_COMPILE_COMMANDS=ON)")
        return SKIP
    cuda_include = nvcc.resolve().parent.parent / "include"
    # What the CUDA halves include beyond this build's own headers: the toolkit's runtime, cuDNN's backend
    # API and NCCL (in the toolkit's include folder here), and LibTorch's CUDA headers.
    for header in ("cuda_runtime_api.h", "cudnn_backend.h", "nccl.h"):
        if not (cuda_include / header).exists():
            print(f"skipped: {cuda_include / header} is missing, so the CUDA halves cannot be compiled here")
            return SKIP
    entries = json.loads(commands.read_text())
    torch_cuda_header = "c10/cuda/CUDAStream.h"
    if not any((d / torch_cuda_header).exists() for d in include_dirs(entries)):
        print(f"skipped: LibTorch's {torch_cuda_header} is not in this build's include folders")
        return SKIP
    archives = sorted((build / "src/ptrain").glob("*/*.a"))
    if not archives:
        print(f"skipped: no CPU build archives under {build / 'src/ptrain'} (build the project first)")
        return SKIP
    pairs, kernels = halves(project)
    tests = tests_reading_the_cuda_macro(project)

    with tempfile.TemporaryDirectory(prefix="ptrain-cuda-check-") as scratch:
        scratch = Path(scratch)
        cache = CompileCache(build / "cuda_check_cache")
        # The generated header lives beside the cache (not in the scratch folder), so that the commands naming
        # its folder, and the files they read, stay the same from one check to the next.
        generated = cache.folder / "include"
        macros = generated / "c10/cuda/impl/cuda_cmake_macros.h"
        macros.parent.mkdir(parents=True, exist_ok=True)
        if not macros.exists() or macros.read_text() != GENERATED_MACROS:
            macros.write_text(GENERATED_MACROS)
        # A job: (sources, command, cwd, object or None, kind); kind "cu" (an nvcc compile), "cuda" (CUDA halves),
        # "test" (test sources, checked with -fsyntax-only) or "none" (the _none halves, compiled for their symbols).
        jobs = []

        for index, kernel in enumerate(kernels):
            obj = scratch / f"cu{index}_{kernel.stem}.o"
            jobs.append(([kernel], [str(nvcc), "-std=c++17", *NVCC_OPTIMISATION, "-arch=sm_90", f"-I{project / 'src'}",
                                    "-c", str(kernel), "-o", str(obj)], project, obj, "cu"))
        cuda_extra = ["-O1", "-DPTRAIN_WITH_CUDA=1", "-DUSE_C10D_NCCL", "-isystem", str(cuda_include),
                      "-isystem", str(generated)]
        # The C++ sources of one command (CUDA halves, test sources, _none halves, each kind apart) compile as one
        # unity batch, as the CUDA build itself compiles them (PTRAIN_UNITY_BUILD=ON, the default, batches each
        # target's sources): each compile of a source here pays seconds of LibTorch's template instantiations on
        # top of the precompiled header, whatever the source holds. A batch that fails compiles member by member
        # (below), so that a broken source is named with its own compiler message.
        batches = {}  # (kind, compiler, flags, cwd) -> sources
        for none_half, cuda_half in pairs:
            # The CUDA half compiles with the flags its _none half has in the CPU build (same target).
            entry, in_cpu_build = compile_command_for(none_half, entries)
            compiler, flags = flags_of(entry)
            none_extra = ["-O1"] if in_cpu_build else cuda_extra
            batches.setdefault(("none", compiler, tuple([*flags, *none_extra]), entry["directory"]), []).append(none_half)
            batches.setdefault(("cuda", compiler, tuple([*flags, *cuda_extra]), entry["directory"]), []).append(cuda_half)
        for test in tests:
            entry, _ = compile_command_for(test, entries)
            compiler, flags = flags_of(entry)
            batches.setdefault(("test", compiler, tuple([*flags, *cuda_extra]), entry["directory"]), []).append(test)
        for index, ((kind, compiler, flags, cwd), members) in enumerate(batches.items()):
            source = members[0] if len(members) == 1 else unity_source(cache.folder / "batches" / f"{kind}{index}.cpp", members)
            if kind == "test":
                jobs.append((members, [compiler, *flags, "-fsyntax-only", str(source)], cwd, None, kind))
            else:
                obj = scratch / f"{kind}{index}_{source.stem}.o"
                jobs.append((members, [compiler, *flags, "-c", str(source), "-o", str(obj)], cwd, obj, kind))
        compiles, asked = [], []  # the compiles run (not taken from the cache), and all asked for

        def compile_job(job):
            _, command, cwd, obj, _ = job
            key = cache.key(command, cwd, obj)
            asked.append(key)
            if cache.lookup(key, obj):
                return 0, ""
            compiles.append(key)
            with tempfile.NamedTemporaryFile(dir=scratch, suffix=".d") as depfile:
                code, out = run([*command, "-MD", "-MF", depfile.name], cwd)
                if code == 0:
                    cache.store(key, command, cwd, depfile.name, obj)
            return code, out

        def alone(job):
            """A batch's compile as one job per member: the batch's command with the member in its place."""
            members, command, cwd, obj, kind = job
            batch = command[command.index("-fsyntax-only" if obj is None else "-c") + 1]
            split = []
            for i, member in enumerate(members):
                member_obj = None if obj is None else obj.with_name(f"{obj.stem}_{i}.o")
                replaced = {batch: str(member), str(obj): str(member_obj)}
                split.append(([member], [replaced.get(word, word) for word in command], cwd, member_obj, kind))
            return split

        failures = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            results = list(pool.map(compile_job, jobs))
            # A batch that fails is compiled member by member: a member that fails alone is named; members that
            # all compile alone (two of them clash only when batched) give their objects instead.
            for job, result in list(zip(jobs, results)):
                if result[0] != 0 and len(job[0]) > 1:
                    members = alone(job)
                    at = jobs.index(job)
                    del jobs[at], results[at]
                    jobs += members
                    results += list(pool.map(compile_job, members))
            for (sources, command, cwd, obj, _), (code, out) in zip(jobs, results):
                if code != 0:
                    failures.append(f"{sources[0].relative_to(project)} does not compile as the CUDA build compiles it:\n"
                                    f"  {shlex.join(command)}\n" + "\n".join("  " + l for l in out.splitlines()[-30:]))
            cache.prune()
            if failures:
                print("\n\n".join(failures))
                return 1

            none_jobs = [job for job in jobs if job[4] == "none"]
            none_objects = [obj for _, _, _, obj, _ in none_jobs]
            members_of = {obj: members for members, _, _, obj, _ in none_jobs}
            cuda_objects = [obj for _, _, _, obj, kind in jobs if kind in ("cu", "cuda")]

            def defining_half(symbol, obj):
                """The _none half defining symbol, which obj (a batch of them, or one) defines."""
                if len(members_of[obj]) == 1:
                    return members_of[obj][0]
                for member_job in alone(next(job for job in none_jobs if job[3] == obj)):
                    if compile_job(member_job)[0] == 0 and symbol in ptrain_symbols([member_job[3]], "--defined-only"):
                        return member_job[0][0]
                return members_of[obj][0]

            none_defined = ptrain_symbols(none_objects, "--defined-only")
            cuda_defined = ptrain_symbols(cuda_objects, "--defined-only")
            cuda_undefined = set(ptrain_symbols(cuda_objects, "--undefined-only"))
            # The CPU archives hold the _none halves too (in unity batches): what only those define does not
            # count as defined for the CUDA build.
            elsewhere = set(ptrain_symbols(archives, "--defined-only")) - set(none_defined)

            problems = []
            lacking = sorted(set(none_defined) - set(cuda_defined))
            for symbol, readable in zip(lacking, demangle(lacking)):
                none_half = defining_half(symbol, none_defined[symbol]).relative_to(project)
                problems.append(f"{readable}: defined by {none_half} but by no CUDA half or .cu file")
            unresolved = sorted(cuda_undefined - set(cuda_defined) - elsewhere)
            for readable in demangle(unresolved):
                problems.append(f"{readable}: called by the CUDA build's sources, defined nowhere in it")
            if problems:
                print("\n".join(problems))
                return 1
            print(f"CUDA build sources compile and link here: {len(kernels)} .cu files, {len(pairs)} CUDA halves "
                  f"({len(none_defined)} ptrain symbols of their CPU halves all defined), {len(tests)} test sources; "
                  f"{len(cuda_undefined)} ptrain symbols they call all defined; "
                  f"{len(compiles)} of {len(asked)} compiles run, the others unchanged since cached")
            return 0


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    try:
        return check(Path(argv[1]).resolve(), Path(argv[2]).resolve())
    except Problem as problem:
        print(problem)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
