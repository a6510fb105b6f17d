#!/usr/bin/env python3
"""The documentation check: every link and every named source path points at something.

  check_docs.py --src ROOT      check the tree
  check_docs.py --self-test     plant a broken link, anchor and path in a scratch tree

Links: each relative `[text](path#anchor)` of a Markdown file must name an existing file,
and an anchor must be one of that Markdown file's headings (GitHub's slugs).

Paths: a repository path written in a Markdown file or a source file (`libcore/engine/gemm.h`,
`tests/golden/make_vae_golden.py`, `libcore/models/unet*.c`, `libcore/models/clip_tok.{h,c}`)
must name an existing file or match one: moving a file leaves no stale reference behind.
Paths under build folders and the raw run logs of docs/gpu-runs are not checked.

Exit 0 when clean, 1 with one line per problem.
"""
import argparse
import glob
import os
import re
import sys
import tempfile

SKIP_DIRS = {".git", "docs/gpu-runs", "examples/out"}
TEXT_EXT = (".md", ".c", ".h", ".cu", ".py", ".sh", ".cmake", ".txt")
TOP = r"(?:libcore|formats|trainer|tools|tests|bench|docs|scripts|examples)"
PATH_RE = re.compile(r"(?<![\w./-])(" + TOP + r"/[\w./*{},-]*\.(?:c|h|cu|py|sh|md|json|cmake))(?![\w])")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
HEADING_RE = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def text_files(root):
    """Markdown and source files of the tree, as paths relative to root."""
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel
        dirnames[:] = sorted(d for d in dirnames
                             if not d.startswith("build") and os.path.join(rel, d) not in SKIP_DIRS
                             and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(TEXT_EXT) or name == "CMakeLists.txt":
                yield os.path.join(rel, name)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return h.replace(" ", "-")


def anchors(path):
    """The anchors of a Markdown file's headings (outside code blocks)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    return {slug(m.group(1)) for m in HEADING_RE.finditer(text)}


def expand(path):
    """A path with {a,b} alternatives as the list of plain paths (globs kept)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    out = []
    for alt in m.group(1).split(","):
        out += expand(path[:m.start()] + alt + path[m.end():])
    return out


def check_links(root, rel, text):
    """Broken relative links of one Markdown file."""
    problems = []
    base = os.path.dirname(rel)
    for m in LINK_RE.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        line = text.count("\n", 0, m.start()) + 1
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(base, path)) if path else rel
        full = os.path.join(root, dest)
        if not os.path.exists(full):
            problems.append(f"{rel}:{line}: link to {target}: no such file {dest}")
        elif anchor and dest.endswith(".md") and anchor not in anchors(full):
            problems.append(f"{rel}:{line}: link to {target}: no heading #{anchor} in {dest}")
    return problems


def check_paths(root, rel, text):
    """Repository paths named in one file that match nothing."""
    problems = []
    for m in PATH_RE.finditer(text):
        named = m.group(1).rstrip(".,")
        if "NAME" in named or named.count("{") != named.count("}"):
            continue  # a placeholder (`tools/sd_NAME.c`) or a list cut by a space
        for path in expand(named):
            if "*" in path:
                found = glob.glob(os.path.join(root, path))
            else:
                found = os.path.exists(os.path.join(root, path))
            if not found:
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{rel}:{line}: names {path}, which does not exist")
    return problems


def comments(rel, text):
    """The text of a source file with everything but its comments (and, in Python, its
    docstrings) blanked out, lines kept: code may build scratch paths that are no
    references (a test's planted files)."""
    if rel.endswith((".c", ".h", ".cu")):
        pattern = r"/\*.*?\*/|//[^\n]*"
    elif rel.endswith(".py"):
        pattern = r'"""[\s\S]*?"""|#[^\n]*'
    else:
        return text
    kept = [(m.start(), m.end()) for m in re.finditer(pattern, text, re.S)]
    out, at = [], 0
    for start, end in kept:
        out.append(re.sub(r"[^\n]", " ", text[at:start]))
        out.append(text[start:end])
        at = end
    out.append(re.sub(r"[^\n]", " ", text[at:]))
    return "".join(out)


def check(root):
    """Every problem of the tree, one message each."""
    problems = []
    for rel in text_files(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        if rel.endswith(".md"):
            problems += check_links(root, rel, text)
        problems += check_paths(root, rel, comments(rel, text))
    return problems


def self_test():
    """A clean scratch tree passes; a broken link, a broken anchor and a stale path are
    each reported."""
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        def write(rel, text):
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        write("libcore/base/a.c", "/* see libcore/base/a.h and libcore/base/{a,b}.h */\n")
        write("libcore/base/a.h", "int a(void);\n")
        write("libcore/base/b.h", "int b(void);\n")
        write("docs/X.md", "# Top\n\n## The `a*.c` files (base)\n\nSee [Y](../README.md#top) and "
              "[here](#the-ac-files-base), libcore/base/a*.c.\n")
        top = "# Top\n\n"  # a heading, kept off the line below (its '#' reads as a comment)
        write("README.md", top + "[docs](docs/X.md#top)\n")
        if check(tmp):
            failures.append(f"clean tree reported: {check(tmp)}")
        cases = [
            ("docs/Z.md", "[gone](../nothing.md)\n", "no such file"),
            ("docs/Z.md", "[gone](X.md#nowhere)\n", "no heading #nowhere"),
            ("tests/t.c", "/* the engine (libcore/ops_conv.c) */\n", "names libcore/ops_conv.c"),
            ("tests/t.py", "# Golden files for libcore/models/vae*.c\n", "names libcore/models/vae*.c"),
        ]
        for rel, text, expect in cases:
            write(rel, text)
            got = check(tmp)
            if not any(expect in p for p in got):
                failures.append(f"planted {rel} ({expect}) not reported: {got}")
            os.remove(os.path.join(tmp, rel))
    for f in failures:
        print("self-test:", f)
    print(f"check_docs self-test: {5 - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", help="repository root")
    ap.add_argument("--self-test", action="store_true", help="check that planted problems are reported")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not args.src:
        ap.error("--src is needed")
    problems = check(args.src)
    for p in problems:
        print(p)
    print(f"check_docs: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
