#!/usr/bin/env bash
# Static check of the container build: does the Dockerfile's build stage get every file that
# `cargo build` reads? No container engine is needed (none can pull base images on the machines
# this repository is built on), only cargo and python3.
#
# What the build needs, found rather than listed:
#   - Cargo.lock, and the workspace root's Cargo.toml;
#   - every workspace member's and path dependency's manifest (from `cargo metadata`);
#   - the sources of their lib, bin and build-script targets (every .rs file under the
#     directory of the target's root file);
#   - every target a manifest declares explicitly ([lib], [[bin]], [[example]], [[test]],
#     [[bench]]): cargo parses every member's manifest whatever it builds, and refuses one that
#     declares a target by name whose file is missing (a target declared with a `path` is
#     looked for only when it is built; it is required all the same, so the manifest is whole);
#   - every file a needed .rs file compiles in with include_str!, include_bytes!, include! or
#     #[path = "..."] (resolved against the source file's directory, or CARGO_MANIFEST_DIR);
#   - .cargo/config.toml and rust-toolchain(.toml) at the workspace root, when they exist.
#
# A needed path fails the check when it is missing from the repository, when the ignore file
# excludes it from the build context (BuildKit's rules: <Dockerfile>.dockerignore next to the
# Dockerfile, else .dockerignore at the context root; `!` re-includes, `**`, last match wins),
# or when no COPY/ADD of the stage that runs `cargo build` puts it at WORKDIR/<path>, where the
# build looks for it.
#
# Usage: scripts/check-image.sh [--dockerfile FILE] [--dockerignore FILE] [--context DIR]
#                               [--materialize DIR] [--list]
#   defaults: deploy/docker/Dockerfile, its ignore file as BuildKit picks it, the repository root.
#   --materialize DIR: also write the build stage's WORKDIR as the COPY lines would fill it into
#   DIR (which must not exist), so that `cd DIR && cargo build --locked --offline` can try the
#   real build without an engine.
#   --list: print every path the build needs, and why.
# Exit status: 0 when everything needed is covered, 1 when something is not (each missing path
# is named), 2 on a usage or setup error.
set -euo pipefail
cd "$(dirname "$0")/.." || exit 2

command -v python3 >/dev/null 2>&1 || { echo "check-image: python3 is required" >&2; exit 2; }
command -v cargo >/dev/null 2>&1 || { echo "check-image: cargo is required" >&2; exit 2; }

exec python3 - "$@" <<'PY'
import argparse
import glob as globmod
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tomllib


def die(msg):
    print(f"check-image: {msg}", file=sys.stderr)
    sys.exit(2)


ap = argparse.ArgumentParser(prog="check-image.sh")
ap.add_argument("--dockerfile", default="deploy/docker/Dockerfile")
ap.add_argument("--dockerignore")
ap.add_argument("--context", default=".")
ap.add_argument("--materialize")
ap.add_argument("--list", action="store_true", help="print every path the build needs, and why")
args = ap.parse_args()

context = os.path.realpath(args.context)
dockerfile = args.dockerfile
if not os.path.isfile(dockerfile):
    die(f"no Dockerfile at {dockerfile}")


def rel(path):
    """A path relative to the build context, with forward slashes."""
    return os.path.relpath(os.path.realpath(path), context).replace(os.sep, "/")


def show(path):
    """For messages: relative to the context when inside it, else as given."""
    r = rel(path)
    return path if r.startswith("../") else r


# --- .dockerignore (moby/patternmatcher semantics) -------------------------------------------

def pattern_regex(pattern):
    out = "^"
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*":
            if i + 1 < len(pattern) and pattern[i + 1] == "*":
                i += 1
                if i + 1 < len(pattern) and pattern[i + 1] == "/":
                    i += 1
                out += ".*" if i + 1 >= len(pattern) else "(.*/)?"
            else:
                out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        elif ch == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                out += re.escape(ch)
            else:
                cls = pattern[i + 1:j]
                if cls.startswith("^"):
                    cls = "^" + cls[1:]
                out += "[" + cls.replace("\\", "\\\\") + "]"
                i = j
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(out + "$")


def read_ignore(path):
    rules = []
    if not path:
        return rules
    with open(path) as f:
        for n, line in enumerate(f, 1):
            p = line.strip()
            if not p or p.startswith("#"):
                continue
            negate = p.startswith("!")
            if negate:
                p = p[1:].strip()
            p = posixpath.normpath(p)
            if len(p) > 1 and p.startswith("/"):
                p = p[1:]
            rules.append((p, negate, pattern_regex(p), n))
    return rules


def ignored_by(rules, path):
    """The last rule deciding `path` (a file or any directory above it), if it excludes."""
    parts = path.split("/")
    decided = None
    for pattern, negate, rx, n in rules:
        hit = rx.match(path) is not None
        if not hit:
            hit = any(rx.match("/".join(parts[:i])) for i in range(1, len(parts)))
        if hit:
            decided = None if negate else (pattern, n)
    return decided


if args.dockerignore:
    ignore_file = args.dockerignore
elif os.path.isfile(dockerfile + ".dockerignore"):
    ignore_file = dockerfile + ".dockerignore"
elif os.path.isfile(os.path.join(context, ".dockerignore")):
    ignore_file = os.path.join(context, ".dockerignore")
else:
    ignore_file = None
rules = read_ignore(ignore_file)

# --- Dockerfile ---------------------------------------------------------------------------------

def instructions(text):
    escape = "\\"
    lines = text.splitlines()
    for line in lines:
        m = re.match(r"#\s*escape\s*=\s*(\S)", line)
        if m:
            escape = m.group(1)
        if not line.startswith("#") or not re.match(r"#\s*\w+\s*=", line):
            break
    out, buf, start = [], "", 0
    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("#"):
            continue  # comments, also between continued lines
        if not stripped:
            continue  # blank lines, also inside a continued instruction
        if not buf:
            start = n
        if line.rstrip().endswith(escape):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip(), start))
        buf = ""
    if buf.strip():
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip(), start))
    return out


def copy_args(rest):
    flags, words = {}, []
    if rest.startswith("<<"):
        return None  # a heredoc writes a file; it copies nothing from the context
    toks = rest.split()
    while toks and toks[0].startswith("--"):
        k, _, v = toks.pop(0)[2:].partition("=")
        flags.setdefault(k, []).append(v)
    body = " ".join(toks)
    if body.startswith("["):
        try:
            words = json.loads(body)
        except json.JSONDecodeError:
            die(f"cannot read the JSON form: {rest}")
    else:
        words = body.split()
    if len(words) < 2:
        return None
    return flags, words[:-1], words[-1]


stages, current = [], None
for word, rest, line in instructions(open(dockerfile).read()):
    if word == "FROM":
        toks = rest.split()
        toks = [t for t in toks if not t.startswith("--")]
        name = toks[2] if len(toks) >= 3 and toks[1].lower() == "as" else str(len(stages))
        base = next((s for s in stages if s["name"] == toks[0]), None)
        current = {
            "name": name,
            "line": line,
            "workdir": base["workdir"] if base else "/",
            "copies": list(base["copies"]) if base else [],
            "build": None,
        }
        stages.append(current)
    elif current is None:
        continue
    elif word == "WORKDIR":
        current["workdir"] = posixpath.normpath(posixpath.join(current["workdir"], rest.strip()))
    elif word in ("COPY", "ADD"):
        parsed = copy_args(rest)
        if parsed is None:
            continue
        flags, srcs, dest = parsed
        if "from" in flags:
            continue
        current["copies"].append(
            {"line": line, "srcs": srcs, "dest": dest, "workdir": current["workdir"], "flags": flags}
        )
    elif word == "RUN" and re.search(r"\bcargo\s+(\+\S+\s+)?build\b", rest) and current["build"] is None:
        current["build"] = {"line": line, "workdir": current["workdir"], "copies": list(current["copies"])}

build_stage = next((s for s in stages if s["build"]), None)
if build_stage is None:
    die(f"{dockerfile}: no stage runs `cargo build`")
root = build_stage["build"]["workdir"]
copies = build_stage["build"]["copies"]
GLOB = re.compile(r"[*?\[]")


def copy_plans():
    """Each COPY line with its absolute destination and whether that names a directory: it ends
    in `/`, there are several sources or a wildcard, or an earlier line (or WORKDIR) made it one."""
    plans = []
    known_dirs = set()
    d = root
    while True:
        known_dirs.add(d)
        if d == "/":
            break
        d = posixpath.dirname(d)
    for c in copies:
        if any("$" in s for s in c["srcs"] + [c["dest"]]):
            print(f"check-image: warning: {show(dockerfile)}:{c['line']}: variables in COPY are not expanded", file=sys.stderr)
        dest = c["dest"]
        dest_abs = posixpath.normpath(posixpath.join(c["workdir"], dest))
        srcs = [posixpath.normpath(s.lstrip("/")) if s.strip("/.") else "." for s in c["srcs"]]
        many = len(srcs) > 1 or any(GLOB.search(s) for s in srcs)
        dir_src = any(s == "." or os.path.isdir(os.path.join(context, s)) for s in srcs)
        dir_dest = dest.endswith("/") or many or dest_abs in known_dirs
        plans.append({
            "line": c["line"],
            "srcs": srcs,
            "dest": dest_abs,
            "dir_dest": dir_dest,
            "excludes": [pattern_regex(posixpath.normpath(e)) for e in c["flags"].get("exclude", [])],
            "parents": "parents" in c["flags"],
        })
        if dir_dest or dir_src:
            d = dest_abs
            while d not in known_dirs:
                known_dirs.add(d)
                d = posixpath.dirname(d)
    return plans


def targets_of(path):
    """Where the build stage's COPY lines put the context file `path` (absolute paths)."""
    out = []
    for c in PLANS:
        for s in c["srcs"]:
            hit = None
            if c["parents"]:
                if s == "." or path == s or path.startswith(s + "/") or (GLOB.search(s) and pattern_regex(s).match(path)):
                    hit = posixpath.join(c["dest"], path)
            elif GLOB.search(s):
                rx = pattern_regex(s)
                parts = path.split("/")
                for i in range(len(parts), 0, -1):
                    if rx.match("/".join(parts[:i])):
                        # A matched file lands in the destination; a matched directory's contents do.
                        hit = posixpath.join(c["dest"], "/".join(parts[i:]) or parts[-1])
                        break
            elif s == path:
                hit = posixpath.join(c["dest"], posixpath.basename(path)) if c["dir_dest"] else c["dest"]
            elif s == ".":
                hit = posixpath.join(c["dest"], path)
            elif path.startswith(s + "/"):
                hit = posixpath.join(c["dest"], path[len(s) + 1:])
            if hit and not any(rx.match(path) for rx in c["excludes"]):
                out.append((posixpath.normpath(hit), c["line"]))
    return out


PLANS = copy_plans()


# --- What the build needs -----------------------------------------------------------------------

def metadata(manifest):
    r = subprocess.run(
        ["cargo", "metadata", "--offline", "--format-version", "1", "--no-deps", "--manifest-path", manifest],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        die(f"cargo metadata failed for {manifest}:\n{r.stderr}")
    return json.loads(r.stdout)


needs = {}  # path -> (why, group)


def need(path, why, group=None):
    needs.setdefault(path, (why, group))


def rs_files(directory):
    out = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if d != "target" and not d.startswith("."))
        out += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".rs")]
    return out


INCLUDE = re.compile(r"\b(include_str|include_bytes|include)!\s*\(\s*")
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"|r(#*)"(.*?)"\2')
PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\s*\]')
MANIFEST_DIR = re.compile(r'concat!\s*\(\s*env!\s*\(\s*"CARGO_MANIFEST_DIR"\s*\)\s*,\s*"([^"]+)"\s*\)')

unresolved = []


def scan_includes(rs, package_dir, package):
    text = open(rs, encoding="utf-8", errors="replace").read()
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("//", 1)[0] if not line.lstrip().startswith("//") else ""
        for m in INCLUDE.finditer(code):
            macro, arg = m.group(1), code[m.end():]
            lit = STRING.match(arg)
            md = MANIFEST_DIR.match(arg)
            if lit:
                literal = json.loads('"' + lit.group(1) + '"') if lit.group(1) is not None else lit.group(3)
                target = os.path.join(os.path.dirname(rs), literal)
            elif md:
                target = os.path.join(package_dir, md.group(1).lstrip("/"))
            else:
                unresolved.append(f"{rel(rs)}:{n}: {code[m.start():].strip()}")
                continue
            need(rel(target), f"{macro}! in {rel(rs)}:{n}")
        for m in PATH_ATTR.finditer(code):
            target = os.path.join(os.path.dirname(rs), m.group(1))
            need(rel(target), f"#[path] in {rel(rs)}:{n}")


seen_manifests = set()


def package_needs(manifest, meta=None, role="workspace member"):
    manifest = os.path.realpath(manifest)
    if manifest in seen_manifests:
        return
    seen_manifests.add(manifest)
    meta = meta or metadata(manifest)
    for pkg in meta["packages"]:
        if os.path.realpath(pkg["manifest_path"]) != manifest and role != "workspace member":
            continue
        pdir = os.path.dirname(os.path.realpath(pkg["manifest_path"]))
        name = pkg["name"]
        need(rel(pkg["manifest_path"]), f"manifest of {role} {name}")
        declared = tomllib.load(open(pkg["manifest_path"], "rb"))
        explicit = set()
        if "lib" in declared:
            explicit.add(("lib", declared["lib"].get("name", name.replace("-", "_"))))
        with_path = set()
        for section in ("bin", "example", "test", "bench"):
            for t in declared.get(section, []):
                explicit.add((section, t.get("name")))
                if "path" in t:
                    with_path.add((section, t.get("name")))
        for t in pkg["targets"]:
            kinds = set(t["kind"])
            src = t["src_path"]
            if kinds & {"lib", "rlib", "dylib", "cdylib", "staticlib", "proc-macro", "bin", "custom-build"}:
                tree = os.path.dirname(src)
                for rs in rs_files(tree) if "custom-build" not in kinds else [src]:
                    need(rel(rs), f"source of {name} ({'/'.join(sorted(kinds))} `{t['name']}`)", rel(tree) + "/")
                    scan_includes(rs, pdir, name)
                need(rel(src), f"root of {name}'s {'/'.join(sorted(kinds))} target `{t['name']}`")
            for kind in kinds:
                k = "lib" if kind in ("lib", "rlib", "dylib", "cdylib", "staticlib", "proc-macro") else kind
                if (k, t["name"]) in with_path:
                    need(rel(src), f"[[{k}]] `{t['name']}` declared with a path in {rel(pkg['manifest_path'])} (cargo 1.95 looks for it only when it builds that target; copied so that the manifest is whole)")
                elif (k, t["name"]) in explicit:
                    need(rel(src), f"[[{k}]] `{t['name']}` declared in {rel(pkg['manifest_path'])} (cargo refuses to parse the manifest without it)")
        for dep in pkg["dependencies"]:
            if dep.get("path"):
                dep_manifest = os.path.join(dep["path"], "Cargo.toml")
                need(rel(dep_manifest), f"path dependency {dep['name']} of {name}")
                if os.path.realpath(dep_manifest) not in members and os.path.isfile(dep_manifest):
                    package_needs(dep_manifest, role="path dependency")


root_manifest = os.path.join(context, "Cargo.toml")
if not os.path.isfile(root_manifest):
    die(f"no Cargo.toml in the context {context}")
meta = metadata(root_manifest)
ws = meta["workspace_root"]
need(rel(os.path.join(ws, "Cargo.toml")), "the workspace's root manifest")
need(rel(os.path.join(ws, "Cargo.lock")), "the lock file (`cargo build --locked`)")
for extra in (".cargo/config.toml", ".cargo/config", "rust-toolchain.toml", "rust-toolchain"):
    if os.path.isfile(os.path.join(ws, extra)):
        need(rel(os.path.join(ws, extra)), "cargo reads it at the workspace root")
members = {os.path.realpath(p["manifest_path"]) for p in meta["packages"]}
for pkg in meta["packages"]:
    need(rel(pkg["manifest_path"]), f"manifest of workspace member {pkg['name']}")
package_needs(root_manifest, meta)

# --- Judge --------------------------------------------------------------------------------------

problems = {}  # path -> (what went wrong, detail)
for path, (why, group) in sorted(needs.items()):
    want = posixpath.normpath(posixpath.join(root, path))
    if path.startswith("../"):
        problems[path] = ("outside the build context", "")
        continue
    if not os.path.exists(os.path.join(context, path)):
        problems[path] = ("missing from the repository", "")
        continue
    hit = ignored_by(rules, path)
    if hit:
        problems[path] = (f"excluded from the build context by `{hit[0]}` ({show(ignore_file)}:{hit[1]})", "")
        continue
    placed = targets_of(path)
    if any(t == want for t, _ in placed):
        continue
    if placed:
        where = ", ".join(f"{t} (line {ln})" for t, ln in placed)
        problems[path] = ("copied elsewhere", f"copied to {where}, but the build reads {want}")
    else:
        problems[path] = (f"not copied by any COPY line of stage `{build_stage['name']}`", f"the build reads {want}")

print(
    f"check-image: {show(dockerfile)}: stage `{build_stage['name']}` runs cargo build in {root} "
    f"(line {build_stage['build']['line']}) after {len(copies)} COPY line(s); ignore file: "
    f"{show(ignore_file) if ignore_file else 'none'}"
)
if args.list:
    for path, (why, group) in sorted(needs.items()):
        print(f"NEED     {path}: {why}")
for u in unresolved:
    print(f"check-image: warning: cannot resolve {u}; check by hand that the image gets it")

# One line for a source tree whose files all fail alike, else one line per file.
groups = {}
for path, (why, group) in needs.items():
    if group:
        groups.setdefault(group, []).append(path)
reported = set()
lines = []
for group, paths in sorted(groups.items()):
    failing = [p for p in paths if p in problems]
    if len(paths) > 1 and len(failing) == len(paths) and len({problems[p][0] for p in failing}) == 1:
        what = problems[failing[0]][0]
        detail = f"the build reads {posixpath.join(root, group)}; " if what.startswith("not copied") else ""
        if what == "copied elsewhere":
            what = f"copied elsewhere, e.g. {failing[0]}: {problems[failing[0]][1]}"
        lines.append(f"MISSING  {group} ({len(paths)} .rs files): {what} ({detail}{needs[failing[0]][0]})")
        reported.update(failing)
for path, (what, detail) in sorted(problems.items()):
    if path not in reported:
        if what == "copied elsewhere":
            what, detail = detail, ""
        lines.append(f"MISSING  {path}: {what} ({detail + '; ' if detail else ''}{needs[path][0]})")
for line in lines:
    print(line)

if args.materialize:
    out = args.materialize
    if os.path.exists(out):
        die(f"--materialize: {out} exists")
    written = 0
    for c in copies:
        for src in c["srcs"]:
            s = src.lstrip("/") or "."
            matches = []
            if GLOB.search(s):
                matches = [rel(m) for m in globmod.glob(os.path.join(context, s))]
            elif os.path.exists(os.path.join(context, s)):
                matches = [rel(os.path.join(context, s))]
            for m in matches:
                full = os.path.join(context, m)
                files = [full] if os.path.isfile(full) else [
                    os.path.join(dp, f) for dp, dn, fs in os.walk(full) for f in fs
                ]
                for f in files:
                    p = rel(f)
                    if ignored_by(rules, p):
                        continue
                    for t, _ in targets_of(p):
                        if t == root or t.startswith(root.rstrip("/") + "/"):
                            dst = os.path.join(out, posixpath.relpath(t, root))
                            os.makedirs(os.path.dirname(dst), exist_ok=True)
                            shutil.copy2(f, dst)
                            written += 1
    print(f"check-image: materialized {written} file(s) of {root} into {out}")

if problems:
    print(
        f"check-image: FAIL: {len(problems)} of {len(needs)} paths the build needs would be missing "
        f"from {root} in the image (fix the COPY lines of {show(dockerfile)} or its ignore file)"
    )
    sys.exit(1)
print(f"check-image: OK: all {len(needs)} paths the build needs are copied to {root}")
PY
