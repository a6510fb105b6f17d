#!/usr/bin/env python3
"""The layering check: every include points down, and no files call each other in a circle.

  check_layers.py --src ROOT [--build DIR]   check the tree (and, with --build, its objects)
  check_layers.py --self-test                plant violations in a scratch tree: each must fail

Includes: each folder below has a rank; a file may include a header of its own folder or of
a folder of lower rank. Same-rank folders are siblings and may not use each other (image and
engine, models and engine/cuda, one tool's engine and another's). A header name found in two
folders is refused too, since `#include "x.h"` would then depend on the include path's order.

Calls: for every object file of the libraries and tools in the build (tests and benchmarks
left out), `nm` gives the symbols it defines and the ones it uses; a file that uses a symbol
another defines calls it. A strongly connected group of two or more files is a circle: one
of them must move the shared piece into a file below both.

Exit 0 when clean, 1 with one line per violation.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

# folder (relative to the repository) -> rank; a file may include only its own folder or lower ranks
RANKS = {
    "libcore/base": 0,
    "libcore/image": 1,
    "libcore/engine": 1,
    "libcore/engine/cuda": 2,
    "libcore/models": 2,
    "formats": 3,
    "trainer": 4,
    "tools/bucket": 5, "tools/latents": 5, "tools/pack": 5, "tools/sample": 5, "tools/selftest": 5, "tools/verify": 5,
    "tools": 6,
    "tests": 7, "tests/fuzz": 7, "bench": 7,
}
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def source_files(root):
    """Every C/CUDA source of a ranked folder, as (folder, path relative to root)."""
    for folder in RANKS:
        d = os.path.join(root, folder)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            if name.endswith(SOURCE_EXT) and os.path.isfile(os.path.join(d, name)):
                yield folder, f"{folder}/{name}"


def check_includes(root):
    """Violations of the include rule, one message each."""
    homes = collections.defaultdict(list)  # header name -> folders holding it
    files = list(source_files(root))
    for folder, rel in files:
        if rel.endswith((".h", ".cuh")):
            homes[os.path.basename(rel)].append(folder)
    problems = []
    for name, folders in sorted(homes.items()):
        if len(folders) > 1:
            problems.append(f"header {name} is in {len(folders)} folders ({', '.join(folders)}): names must be unique")
    for folder, rel in files:
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in INCLUDE_RE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            if "/" in inc:  # a path: resolve it against the including file's folder
                target = os.path.normpath(os.path.join(folder, os.path.dirname(inc)))
                if not os.path.isfile(os.path.join(root, folder, inc)):
                    continue
            elif os.path.isfile(os.path.join(root, folder, inc)):
                continue  # its own folder
            elif inc in homes:
                target = homes[inc][0]
            else:
                continue  # a system or generated header
            if target == folder:
                continue
            if target not in RANKS:
                problems.append(f"{rel}:{line}: includes {inc} from {target}, a folder outside the layers")
            elif RANKS[target] >= RANKS[folder]:
                how = "a sibling" if RANKS[target] == RANKS[folder] else "a higher layer"
                problems.append(f"{rel}:{line}: includes {inc} from {target}, {how} of {folder}")
    return problems


def target_dirs(build):
    """The folders of the targets the build defines now (CMake's TargetDirectories.txt),
    so a target an older layout left in the build folder is not read; a build folder
    without that list is walked whole."""
    listing = os.path.join(build, "CMakeFiles", "TargetDirectories.txt")
    if os.path.isfile(listing):
        with open(listing) as f:
            return [line.strip() for line in f if line.strip()]
    found = []
    for dirpath, dirnames, filenames in os.walk(build):
        if "link.txt" in filenames:
            found.append(dirpath)
    return found


def object_files(build):
    """The object files the build links into its libraries and tools (not tests or
    benchmarks), from CMake's link commands: a stale object of a removed source, or of
    a target the build no longer has, is not among them."""
    objs = set()
    for tdir in target_dirs(build):
        rel = os.path.relpath(tdir, build)
        if rel.split(os.sep)[0] in ("tests", "bench") or not os.path.isfile(os.path.join(tdir, "link.txt")):
            continue
        cwd = os.path.dirname(os.path.dirname(tdir))  # the target's build folder, where it links
        with open(os.path.join(tdir, "link.txt")) as f:
            words = f.read().split()
        for w in list(words):
            if w.startswith("@") and os.path.isfile(os.path.join(cwd, w[1:])):
                with open(os.path.join(cwd, w[1:])) as f:
                    words += f.read().split()
        for w in words:
            if w.endswith(".o"):
                objs.add(os.path.normpath(os.path.join(cwd, w)))
    return sorted(objs)


def symbols(obj):
    """(defined, used) global symbol sets of one object file, from nm."""
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        if parts[1] == "U":
            used.add(parts[0])
        elif parts[1] in ("T", "D", "B", "R", "G", "S", "V", "W"):
            defined.add(parts[0])
    return defined, used


def strongly_connected(nodes, edges):
    """Tarjan's algorithm, iterative: the groups of nodes that reach each other."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                groups.append(group)
    return groups


def source_name(obj, build):
    """The source a CMake object file was built from, for messages."""
    rel = os.path.relpath(obj, build)
    m = re.match(r"(.*?)/?CMakeFiles/[^/]+\.dir/(.*)\.o$", rel)
    if not m:
        return rel
    return os.path.normpath(os.path.join(m.group(1), m.group(2)))


def check_calls(build):
    """Circles of calls between object files, one message each."""
    objs = sorted(object_files(build))
    if not objs:
        return [f"no object files under {build}: build first"]
    syms = {o: symbols(o) for o in objs}
    owner = {}
    for o in objs:
        for s in syms[o][0]:
            owner.setdefault(s, o)
    edges = collections.defaultdict(set)
    why = collections.defaultdict(list)
    for o in objs:
        for s in sorted(syms[o][1]):
            t = owner.get(s)
            if t is not None and t != o:
                edges[o].add(t)
                why[(o, t)].append(s)
    problems = []
    for group in strongly_connected(objs, edges):
        if len(group) < 2:
            continue
        names = sorted(source_name(o, build) for o in group)
        links = []
        for a in sorted(group):
            for b in sorted(edges[a] & set(group)):
                links.append(f"{source_name(a, build)} -> {source_name(b, build)} ({', '.join(why[(a, b)][:3])})")
        problems.append(f"files call each other in a circle: {', '.join(names)}: " + "; ".join(links))
    return problems


def self_test():
    """Plant an upward include, a sibling include, a duplicate header and a call circle
    in a scratch tree; each must be reported, and the clean tree must pass."""
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        def write(rel, text):
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        write("libcore/base/low.h", "int low(void);\n")
        write("libcore/engine/mid.h", '#include "low.h"\nint mid(void);\n')
        write("libcore/image/pic.c", '#include "low.h"\nint pic(void) { return 0; }\n')
        write("trainer/top.c", '#include "mid.h"\n#include "pic.h"\n')
        write("libcore/image/pic.h", "int pic(void);\n")
        if check_includes(tmp):
            failures.append(f"clean tree reported: {check_includes(tmp)}")
        cases = [
            ("libcore/base/up.c", '#include "mid.h"\n', "a higher layer"),
            ("libcore/engine/side.c", '#include "pic.h"\n', "a sibling"),
            ("formats/low.h", "int low2(void);\n", "names must be unique"),
        ]
        for rel, text, expect in cases:
            write(rel, text)
            got = check_includes(tmp)
            if not any(expect in p for p in got):
                failures.append(f"planted {rel} ({expect}) not reported: {got}")
            os.remove(os.path.join(tmp, rel))
        # calls: a -> b -> a is a circle, c -> a is not
        objdir = os.path.join(tmp, "build", "libcore", "CMakeFiles", "x.dir")
        os.makedirs(objdir)
        srcs = {"a": "int b(void); int a(void) { return b(); }\n",
                "b": "int a(void); int b(void) { return 1; } int b2(void) { return a(); }\n",
                "c": "int a(void); int c(void) { return a(); }\n"}
        for name, text in srcs.items():
            write(f"build/{name}.c", text)
            subprocess.run(["cc", "-c", "-o", os.path.join(objdir, f"{name}.c.o"),
                            os.path.join(tmp, "build", f"{name}.c")], check=True)
        def link(names):
            write("build/libcore/CMakeFiles/x.dir/link.txt",
                  "ar qc libx.a " + " ".join(f"CMakeFiles/x.dir/{n}.c.o" for n in names) + "\n")
        link("abc")
        got = check_calls(os.path.join(tmp, "build"))
        if len(got) != 1 or "libcore/a.c" not in got[0] or "libcore/b.c" not in got[0] or "c.c" in got[0]:
            failures.append(f"planted call circle a<->b not reported exactly: {got}")
        link("ac")  # b no longer linked: its stale object must not count
        if check_calls(os.path.join(tmp, "build")):
            failures.append("a tree without a circle reported one")
        # a target an older layout left behind, linking b with a: read when the build has no
        # list of its targets, not read when CMake's list leaves it out
        write("build/libcore/CMakeFiles/old.dir/link.txt", "ar qc libold.a CMakeFiles/x.dir/b.c.o\n")
        if len(check_calls(os.path.join(tmp, "build"))) != 1:
            failures.append("without TargetDirectories.txt the old target's circle was not found")
        write("build/CMakeFiles/TargetDirectories.txt", os.path.join(tmp, "build/libcore/CMakeFiles/x.dir") + "\n")
        if check_calls(os.path.join(tmp, "build")):
            failures.append("a target missing from TargetDirectories.txt was read")
    for f in failures:
        print("self-test:", f)
    print(f"check_layers self-test: {7 - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", help="repository root")
    ap.add_argument("--build", help="CMake build folder whose object files are checked for call circles")
    ap.add_argument("--self-test", action="store_true", help="check that planted violations are reported")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not args.src:
        ap.error("--src is needed")
    problems = check_includes(args.src)
    if args.build:
        problems += check_calls(args.build)
    for p in problems:
        print(p)
    print(f"check_layers: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
