#!/usr/bin/env bash
# check_tree.sh [BUILD_DIR]: the words of the repository against the tree.
#
# Sections (each a function in the Python below, registered with @section):
#   references  every repository path that a Markdown file names, or a code comment names
#               (.h .cpp .cu .cuh .sh .py .cmake CMakeLists.txt .yaml .sbatch, and scripts without a
#               suffix that start with a shell or Python #!), exists.
#   docs_index  README.md names every docs/*.md and every folder below docs/.
#   private     no file sends a reader outside the repository: to a notes folder that is not in
#               it, to ../shared, or to /work/ (the development machine's own folders).
#   families    nothing in trainer/ (outside trainer/families/), parallel/ or data/ names a model
#               family: no include of a family's model folder, none of its types, no arch string.
#   test_count  every "N tests" that README.md states equals the number of tests: with BUILD_DIR,
#               ctest -N's "Total Tests" there; without it, a count by grep (see count_by_grep).
# Each failure prints FILE:LINE and what is wrong; the last line is
# "check_tree: N checks passed, M failed"; the exit status is 1 when any check failed.
# Files are the ones git knows or would add (tracked, and untracked but not ignored), so build
# folders, runs/ and other ignored outputs are never read. Needs bash, git and python3 only.
#
# Adding a section: write a function `def my_check(ctx):` under @section("name") that calls
# ctx.ok() for each check that holds and ctx.fail(path, line, message) for each that does not;
# ctx.files(*suffixes) lists the repository's files, ctx.lines(path) reads one, and
# ctx.grep(regex, under=("trainer/",), suffixes=(".h", ".cpp")) yields (path, line number, line)
# of every match, e.g. for a rule that a name appears only below one folder.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
exec python3 - "$root" "${1:-}" <<'PY'
import glob, os, re, subprocess, sys

ROOT, BUILD_DIR = sys.argv[1], sys.argv[2]
SELF = "scripts/check_tree.sh"

# ---------------------------------------------------------------------------------------------
# Framework
# ---------------------------------------------------------------------------------------------
class Context:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self._files = None
        self._lines = {}

    def ok(self, n=1):
        self.passed += n

    def fail(self, path, line, message):
        self.failed += 1
        print(f"{path}:{line}: {message}" if line else f"{path}: {message}")

    def all_files(self):
        if self._files is None:
            try:
                out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                                      "--exclude-standard"], check=True, capture_output=True).stdout
                names = [n for n in out.decode().split("\0") if n]
            except (OSError, subprocess.CalledProcessError):
                # Not a git checkout (an exported tree): walk it, leaving out build outputs.
                names = []
                for d, dirs, files in os.walk(ROOT):
                    dirs[:] = [x for x in dirs if x != ".git" and not x.startswith("build") and x != "runs"]
                    names += [os.path.relpath(os.path.join(d, f), ROOT) for f in files]
            # A tracked file the working tree has deleted is not part of the tree.
            self._files = sorted(n for n in set(names) if os.path.isfile(os.path.join(ROOT, n)))
        return self._files

    def files(self, *suffixes):
        return [f for f in self.all_files() if any(f.endswith(s) for s in suffixes)]

    def lines(self, path):
        if path not in self._lines:
            try:
                with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                    self._lines[path] = f.read().split("\n")
            except (UnicodeDecodeError, OSError):
                self._lines[path] = None  # binary or unreadable: nothing to check
        return self._lines[path]

    def grep(self, regex, under=(), suffixes=()):
        rx = re.compile(regex)
        for path in self.all_files():
            if under and not path.startswith(tuple(under)):
                continue
            if suffixes and not path.endswith(tuple(suffixes)):
                continue
            for i, line in enumerate(self.lines(path) or [], 1):
                if rx.search(line):
                    yield path, i, line

SECTIONS = []

def section(name):
    def register(fn):
        SECTIONS.append((name, fn))
        return fn
    return register

# ---------------------------------------------------------------------------------------------
# Section: references
# ---------------------------------------------------------------------------------------------
# What counts as a repository path: text whose first component is a top-level source folder,
# and which is not the tail of a longer path (no word character, '.', '/', '-', '<', '>', '$',
# '}', '~', ':' or '@' right before it: /usr/share/data/..., $OUT/data/..., <out_dir>/data/...,
# https://host/tests/... are not references). Paths under runs/, build/, /tmp and other outputs
# never start with one of these folders, so they are examples, not references.
TOP = ["trainer", "models", "parallel", "data", "configs", "scripts", "tests", "docs", "bench",
       "cmake", r"\.ci"]
PATH_RE = re.compile(r"(?<![\w./\-<>$}~:@])(?:%s)/[\w.*?{},/\-]*" % "|".join(TOP))

# Paths that are named on purpose and do not exist. Keep it short; say why for each. An entry
# ending in "/" also allows every path below it.
ALLOWED = [
    # README.md, Slurm: a user's own config in the sbatch example.
    "configs/my_run.yaml",
    # Data sets that `flowtrain data make-compositions` / `make-moving-fashion` write into data/,
    # where configs/fashion_t2i.yaml and configs/fashion_video.yaml read them.
    "data/fashion_compositions/",
    "data/moving_fashion/",
]

def allowed(ref):
    return any(ref == a or ref == a.rstrip("/") or (a.endswith("/") and ref.startswith(a))
               for a in ALLOWED)

# Code files whose comments are checked, and how a comment starts in each (files without a
# suffix: see references()).
SLASH_COMMENTS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
HASH_COMMENTS = (".sh", ".py", ".cmake", "CMakeLists.txt", ".yaml", ".yml", ".sbatch")

def comment_text(path, lines):
    """(line number, comment text) of every comment line of a code file."""
    out = []
    if path.endswith(SLASH_COMMENTS):
        in_block = False
        for i, line in enumerate(lines, 1):
            text = ""
            rest = line
            while rest:
                if in_block:
                    end = rest.find("*/")
                    text += " " + (rest if end < 0 else rest[:end])
                    if end < 0:
                        rest = ""
                    else:
                        rest, in_block = rest[end + 2:], False
                else:
                    m = re.search(r'//|/\*|"', rest)
                    if not m:
                        break
                    if m.group() == "//":
                        text += " " + rest[m.end():]
                        break
                    if m.group() == "/*":
                        rest, in_block = rest[m.end():], True
                        continue
                    # A string literal: skip it (a "//" inside it is no comment).
                    s = re.match(r'"(?:[^"\\]|\\.)*"', rest[m.start():])
                    rest = rest[m.start() + (s.end() if s else 1):]
            if text.strip():
                out.append((i, text))
    else:
        for i, line in enumerate(lines, 1):
            # A '#' that starts a comment: at the line start or after a space (not ${#x}, not "a#b").
            m = re.search(r"(?:^|\s)#", line)
            if m and not line.lstrip().startswith("#!"):
                out.append((i, line[m.end():]))
    return out

def expand_braces(p):
    """data/safetensors.{h,cpp} -> [data/safetensors.h, data/safetensors.cpp]; a {A..B} range
    becomes a wildcard."""
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    inner = m.group(1)
    alts = ["*"] if ".." in inner else inner.split(",")
    return [q for a in alts for q in expand_braces(p[:m.start()] + a + p[m.end():])]

PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # an ALL-CAPS component: tests/LABEL/*.cpp

def resolve(ref):
    """True when the path, or for a pattern at least one file, exists."""
    for p in expand_braces(ref):
        is_dir = p.endswith("/")
        parts = [("*" if PLACEHOLDER.match(c) else c) for c in p.rstrip("/").split("/")]
        q = os.path.join(ROOT, *parts)
        if any(ch in q for ch in "*?["):
            hits = glob.glob(q)
            if is_dir:
                hits = [h for h in hits if os.path.isdir(h)]
            if not hits:
                return False
        elif not (os.path.isdir(q) if is_dir else os.path.exists(q)):
            return False
    return True

def clean(ref):
    # Trailing sentence punctuation is not part of the path; an unclosed brace is cut off.
    ref = ref.rstrip(".,:;")
    if ref.count("{") != ref.count("}"):
        ref = ref[:ref.rfind("{")] if ref.count("{") > ref.count("}") else ref
        ref = ref[:ref.rfind("/") + 1] if "{" in ref or "}" in ref else ref
    return ref

MD_LINK = re.compile(r"\]\(([^)\s]+)\)")

def check_ref(ctx, path, line_no, ref):
    ref = clean(ref)
    if allowed(ref):
        ctx.ok()
    elif resolve(ref):
        ctx.ok()
    else:
        ctx.fail(path, line_no, f"names {ref}, which is not in the tree")

@section("references")
def references(ctx):
    for path in ctx.files(".md"):
        lines = ctx.lines(path)
        if lines is None:
            continue
        for i, line in enumerate(lines, 1):
            for m in PATH_RE.finditer(line):
                check_ref(ctx, path, i, m.group())
            # Relative Markdown links ([text](file)) resolve from the file's own folder.
            for m in MD_LINK.finditer(line):
                target = m.group(1).split("#")[0]
                if not target or re.match(r"^[a-z]+:", target) or target.startswith("/"):
                    continue
                full = os.path.normpath(os.path.join(os.path.dirname(path), target))
                if os.path.exists(os.path.join(ROOT, full)):
                    ctx.ok()
                else:
                    ctx.fail(path, i, f"links to {target}, which is not in the tree")
    # Scripts without a suffix (.ci/run) count when their first line is a shell or Python shebang.
    scripts = [f for f in ctx.all_files() if "." not in os.path.basename(f)
               and re.match(r"#!.*\b(ba)?sh\b|#!.*python", (ctx.lines(f) or [""])[0])]
    for path in ctx.files(*SLASH_COMMENTS, *HASH_COMMENTS) + scripts:
        if path == SELF:
            continue
        lines = ctx.lines(path)
        if lines is None:
            continue
        for i, text in comment_text(path, lines):
            for m in PATH_RE.finditer(text):
                check_ref(ctx, path, i, m.group())

# ---------------------------------------------------------------------------------------------
# Section: docs_index
# ---------------------------------------------------------------------------------------------
# README.md lists the documentation: every docs/*.md and every docs/ subfolder is named in it.
@section("docs_index")
def docs_index(ctx):
    readme = "\n".join(ctx.lines("README.md") or [])
    entries = sorted({f if f.count("/") == 1 else f.split("/")[0] + "/" + f.split("/")[1] + "/"
                      for f in ctx.files(".md") if f.startswith("docs/")})
    for entry in entries:
        if entry in readme:
            ctx.ok()
        else:
            ctx.fail("README.md", 0, f"does not list {entry} (its documentation table)")

# ---------------------------------------------------------------------------------------------
# Section: private
# ---------------------------------------------------------------------------------------------
# A reader of the repository has only the repository. The patterns are built from pieces so
# that this script does not match itself.
PRIVATE = [
    (re.compile(r"(?<![\w-])" + "notes" + r"/"), "a notes folder that is not in the repository"),
    (re.compile(r"\.\./" + "shared" + r"\b"), "../shared, a folder outside the repository"),
    (re.compile(r"/" + "work" + r"/"), "/work/, a folder of the development machine"),
]

@section("private")
def private(ctx):
    for path in ctx.all_files():
        if path == SELF:
            continue
        lines = ctx.lines(path)
        if lines is None:
            continue
        bad = False
        for i, line in enumerate(lines, 1):
            for rx, what in PRIVATE:
                if rx.search(line):
                    ctx.fail(path, i, f"points to {what}: {rx.search(line).group()}")
                    bad = True
        if not bad:
            ctx.ok()

# ---------------------------------------------------------------------------------------------
# Section: families
# ---------------------------------------------------------------------------------------------
# The seam of trainer/family.h: a family's spec (trainer/families/<name>/) is the only code that
# names it. What a family is, is read from the tree, so a new family is covered as it lands:
#   - its model folders: the models/<dir>/ that trainer/families/ includes;
#   - its types: the struct/class/TORCH_MODULE names those folders' headers declare, and those its
#     own folder's headers declare (trainer/families/<name>/: its keys' struct);
#   - its arch string: the `spec.arch = "…"` of its spec.
SEAM_SCOPE = ("trainer/", "parallel/", "data/")
SEAM_OWNER = "trainer/families/"
CODE = (".h", ".cpp", ".cu", ".cuh")

# Lines that name a family on purpose, each with its reason: (path, text on the line).
SEAM_EXCEPTIONS = [
    # The default of model.arch: a config that names no family gets this one.
    ("trainer/config/config.h", 'std::string arch = "dit";'),
]

def strip_comment(line):
    return re.sub(r"//.*", "", line)

def strip_strings(code):
    return re.sub(r'"(\\.|[^"\\])*"', '""', code)

@section("families")
def families(ctx):
    folders, archs = set(), set()
    for path, _, line in ctx.grep(r'#include "models/\w+/', under=(SEAM_OWNER,), suffixes=CODE):
        folders.add(re.search(r'#include "(models/\w+/)', line).group(1))
    for path, _, line in ctx.grep(r'\.arch\s*=\s*"', under=(SEAM_OWNER,), suffixes=CODE):
        archs.add(re.search(r'\.arch\s*=\s*"([^"]+)"', line).group(1))
    if not folders or not archs:
        ctx.fail(SEAM_OWNER, 0, "found no family (no models/<dir>/ include or spec.arch under it): "
                 "has the registry moved? update this section")
        return
    types = set()
    family_folders = tuple(sorted({os.path.dirname(p) + "/" for p in ctx.files(".h")
                                   if p.startswith(SEAM_OWNER) and p.count("/") > 2}))
    for path in ctx.files(".h"):
        if path.startswith(tuple(folders) + family_folders):
            for line in ctx.lines(path) or []:
                m = re.match(r"\s*(?:struct|class)\s+(\w+)\s*[:{]", line) or \
                    re.match(r"\s*TORCH_MODULE\((\w+)\)", line)
                if m:
                    types.add(m.group(1))
    rules = [
        (re.compile(r'#include "(%s)' % "|".join(re.escape(f) for f in sorted(folders))),
         "includes a family's model folder", None),
        (re.compile(r'#include "(%s)' % "|".join(re.escape(f) for f in family_folders)),
         "includes a family's own folder", None),
        (re.compile(r"\b(%s)\b" % "|".join(sorted(types))), "names a family's type", strip_strings),
        (re.compile(r'"(%s)"' % "|".join(re.escape(a) for a in sorted(archs))), "names a family's arch", None),
        (re.compile(r"model\.arch (%s)\b" % "|".join(re.escape(a) for a in sorted(archs))),
         "names a family's arch", None),
    ]
    for path in ctx.files(*CODE):
        if not path.startswith(SEAM_SCOPE) or path.startswith(SEAM_OWNER):
            continue
        clean = True
        for i, line in enumerate(ctx.lines(path) or [], 1):
            if any(path == p and text in line for p, text in SEAM_EXCEPTIONS):
                continue
            code = strip_comment(line)
            for rx, what, prepare in rules:
                m = rx.search(prepare(code) if prepare else code)
                if m:
                    ctx.fail(path, i, f"{what} ({m.group(0)}): only its spec under {SEAM_OWNER} may")
                    clean = False
        if clean:
            ctx.ok()

# ---------------------------------------------------------------------------------------------
# Section: test_count
# ---------------------------------------------------------------------------------------------
def count_by_grep(ctx):
    """The ctest count from the sources: one ctest test per TEST / TEST_F in tests/ (what
    gtest_discover_tests registers), plus every add_test in tests/ CMake files. Parameterised and
    typed tests are instantiated at run time and cannot be counted this way: None then."""
    n, why = 0, None
    for path in ctx.files(".cpp", ".cc", ".cu"):
        if not path.startswith("tests/"):
            continue
        for line in ctx.lines(path) or []:
            if re.match(r"\s*(TEST|TEST_F)\s*\(.*\)\s*\{\s*GTEST_SKIP\(\)", line):
                # A one-line placeholder that only skips, compiled in the build configuration
                # where its real tests are not (tests/gpu/test_cuda_fused.cpp without CUDA):
                # this machine kind builds the real ones.
                continue
            if re.match(r"\s*(TEST|TEST_F)\s*\(", line):
                n += 1
            elif re.match(r"\s*(TEST_P|TYPED_TEST|TYPED_TEST_P)\s*\(", line):
                why = f"{path} has parameterised or typed tests"
    for path in ctx.files("CMakeLists.txt", ".cmake"):
        if path.startswith("tests/"):
            n += sum(1 for line in ctx.lines(path) or [] if re.match(r"\s*add_test\s*\(", line))
    return n, why

@section("test_count")
def test_count(ctx):
    grep_n, why = count_by_grep(ctx)
    if BUILD_DIR:
        try:
            out = subprocess.run(["ctest", "-N"], cwd=BUILD_DIR, capture_output=True, text=True,
                                 timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            ctx.fail(BUILD_DIR, 0, f"cannot run ctest -N: {e}")
            return
        m = re.search(r"Total Tests:\s*(\d+)", out)
        if not m:
            ctx.fail(BUILD_DIR, 0, "ctest -N printed no 'Total Tests' (not a configured build dir?)")
            return
        if "_NOT_BUILT" in out:
            # gtest_discover_tests lists a test binary that is not built as one placeholder test.
            ctx.fail(BUILD_DIR, 0, "ctest -N lists test binaries that are not built (*_NOT_BUILT): "
                     f"build them first, or run without a build dir to count by grep ({grep_n})")
            return
        count, how = int(m.group(1)), f"ctest -N in {BUILD_DIR}"
        print(f"check_tree: {count} tests by ctest -N; {grep_n} by grep of tests/")
    else:
        if why:
            ctx.fail("tests", 0, f"cannot count tests by grep ({why}): pass the build dir")
            return
        count, how = grep_n, "grep: TEST/TEST_F in tests/ + add_test in tests/ CMake files"
        print(f"check_tree: {count} tests by grep of tests/ (no build dir given; ctest -N is authoritative)")
    stated = []
    for i, line in enumerate(ctx.lines("README.md") or [], 1):
        for m in re.finditer(r"\b(\d[\d,]*) tests\b", line):
            stated.append((i, int(m.group(1).replace(",", ""))))
    if not stated:
        ctx.fail("README.md", 0, "states no test count ('N tests')")
    for i, n in stated:
        if n == count:
            ctx.ok()
        else:
            ctx.fail("README.md", i, f"says {n} tests; the suite has {count} ({how})")

# ---------------------------------------------------------------------------------------------
ctx = Context()
for name, fn in SECTIONS:
    before = ctx.failed
    fn(ctx)
    if ctx.failed > before:
        print(f"check_tree: section {name}: {ctx.failed - before} failed")
print(f"check_tree: {ctx.passed} checks passed, {ctx.failed} failed")
sys.exit(1 if ctx.failed else 0)
PY
