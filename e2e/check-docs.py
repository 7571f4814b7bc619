#!/usr/bin/env python3
"""Checks that the docs cannot point outside the repository or at something gone:
- every relative Markdown link (and its #anchor) in README.md, BENCHMARKS.md, docs/**/*.md,
  deploy/**/*.md and crates/*/README.md resolves to a file inside the repository (a heading of it);
- every backticked repository path (src/..., crates/..., e2e/..., deploy/..., docs/..., tests/...,
  benches/...) in README.md, BENCHMARKS.md, docs/**/*.md and crates/*/README.md exists;
- no Markdown or Rust file (outside target/) links ../shared, names a tracker number ("issue 21") or
  says "this machine": a reader has neither the tracker nor the machine; name the hardware instead;
- no code block in README.md or docs/*.md opens without a language: trycmd (tests/docs.rs) would run
  it as a command;
- the README stays a first hour's read (at most README_MAX_LINES lines; the manual is docs/), and no
  doc speaks of a `/status` HTTP endpoint: the metrics server serves /metrics, /healthz and /readyz
  (`aether-replicator status` is the command).
One line per problem, file:line: what; exit 1 if there is any.
  python3 e2e/check-docs.py

It moves to the repository root first, so it runs from anywhere.
"""
import glob, os, re, sys

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

root = os.path.realpath(".")
problems = []

def say(path, line, msg):
    problems.append(f"{path}:{line}: {msg}")

def md_files(patterns):
    out = set()
    for p in patterns:
        out.update(f for f in glob.glob(p, recursive=True) if "/target/" not in f and not f.startswith("target/"))
    return sorted(out)

linked = md_files(["README.md", "BENCHMARKS.md", "docs/**/*.md", "deploy/**/*.md", "crates/*/README.md"])
path_checked = md_files(["README.md", "BENCHMARKS.md", "docs/**/*.md", "crates/*/README.md"])
trycmd_read = md_files(["README.md", "docs/*.md"])

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")

def lines_outside_code(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(2)
                continue
            yield n, line
        elif m and m.group(2).startswith(fence[0]) and len(m.group(2)) >= len(fence) and not m.group(3).strip():
            fence = None

def anchor(heading):
    """GitHub's anchor of a heading."""
    h = heading.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")

anchor_cache = {}
def anchors(path):
    if path not in anchor_cache:
        seen, out = {}, set()
        text = open(path, encoding="utf-8").read()
        for _, line in lines_outside_code(text):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            a = anchor(m.group(1))
            if a in seen:
                seen[a] += 1
                a = f"{a}-{seen[a]}"
            else:
                seen[a] = 0
            out.add(a)
        for m in re.finditer(r'<a\s+(?:name|id)="([^"]+)"', text):
            out.add(m.group(1))
        anchor_cache[path] = out
    return anchor_cache[path]

CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")

for path in linked:
    text = open(path, encoding="utf-8").read()
    base = os.path.dirname(path)
    for n, line in lines_outside_code(text):
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
                continue
            file_part, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(base, file_part)) if file_part else path
            real = os.path.realpath(dest)
            if real != root and not real.startswith(root + os.sep):
                say(path, n, f"link {target} leaves the repository")
                continue
            if not os.path.exists(dest):
                say(path, n, f"link {target}: {dest} does not exist")
                continue
            if frag and dest.endswith(".md") and frag not in anchors(dest):
                say(path, n, f"link {target}: {dest} has no heading #{frag}")

PATH_RE = re.compile(r"^(src|crates|e2e|deploy|docs|tests|benches)/[A-Za-z0-9_.\-/]*$")
for path in path_checked:
    text = open(path, encoding="utf-8").read()
    for n, line in lines_outside_code(text):
        for m in CODE_SPAN.finditer(line):
            span = m.group(2).strip()
            first = span.split()[0] if span.split() else ""
            first = first.split("#")[0].rstrip(":,;")
            if not PATH_RE.match(first):
                continue
            if not os.path.exists(first):
                say(path, n, f"`{first}` does not exist")

# Every Markdown and Rust file of the repository, outside target/ and .git.
tree = []
for dirpath, dirnames, filenames in os.walk("."):
    dirnames[:] = [d for d in dirnames if d not in (".git", "target") and not (dirpath == "." and d.startswith("."))]
    tree += [os.path.join(dirpath, f)[2:] for f in filenames if f.endswith((".md", ".rs"))]
TRACKER = re.compile(r"\b[Ii]ssues?\s+#?\d+|\bPR\s+#?\d+")
for path in sorted(tree):
    try:
        text = open(path, encoding="utf-8").read()
    except UnicodeDecodeError:
        continue
    for n, line in enumerate(text.split("\n"), 1):
        if "../shared" in line:
            say(path, n, "names ../shared, which is outside the repository")
        if TRACKER.search(line):
            say(path, n, f"names a tracker number ({TRACKER.search(line).group(0)}); say what it was instead")
        if re.search(r"this machine", line, re.I):
            say(path, n, "says \"this machine\"; name the hardware (e.g. \"a 2-core, 24 GiB VM\")")

for path in trycmd_read:
    text = open(path, encoding="utf-8").read()
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if not m or m.group(1):
            continue
        if fence is None:
            fence = m.group(2)
            if not m.group(3).strip():
                say(path, n, "a code block without a language (trycmd would run it): say ```text, ```sh, ...")
        elif m.group(2).startswith(fence[0]) and not m.group(3).strip():
            fence = None

README_MAX_LINES = 260
readme_lines = open("README.md", encoding="utf-8").read().count("\n")
if readme_lines > README_MAX_LINES:
    say("README.md", readme_lines, f"{readme_lines} lines, over {README_MAX_LINES}: move detail into docs/")
# An HTTP path, not the subcommand: "/status" right after a host, a quote or a space.
STATUS_PATH = re.compile(r"(?:[\w\]:]|[`'\" ])/status\b")
for path in linked:
    for n, line in enumerate(open(path, encoding="utf-8").read().split("\n"), 1):
        if STATUS_PATH.search(line):
            say(path, n, "speaks of a /status HTTP path; the server has /metrics, /healthz and /readyz")

for p in problems:
    print(p)
if problems:
    print(f"check-docs: {len(problems)} problem(s)", file=sys.stderr)
    sys.exit(1)
print(f"check-docs: {len(linked)} Markdown files, links, paths and wording ok")
