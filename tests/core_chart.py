#!/usr/bin/env python3
"""The stage table of core/README.md against core/CMakeLists.txt (issue 35: the chart matches the
CMake targets).

Usage: core_chart.py ROOT

The table is the rows after the `<!-- stages: ... -->` marker: | stage | `folder/` | what | links |
third-party |. Each row must name a kvscope_stage() target of core/CMakeLists.txt, the one folder
that holds that target's sources, and exactly the stages the target links (target_link_libraries,
kvscope_* stages only; the links column names them without the prefix, notes in parentheses). Every
stage must have a row, and every folder under core/ that holds sources (.h/.cpp/.cu) must be a
stage's folder. Fails naming each mismatch. Python 3 standard library only.
"""

import os
import re
import sys

SOURCE_EXTENSIONS = (".h", ".cpp", ".cu")
MARKER = "<!-- stages:"


def cmake_commands(text):
    """[(command, [arguments], line)] of a CMake file; comments dropped, quoted arguments unquoted,
    nested parentheses kept inside their argument."""
    out = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c.isalpha() or c == "_":
            m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\s*\(").match(text, i)
            if not m:
                i += 1
                continue
            name = m.group(0).rstrip("( \t\n").lower()
            start_line = line
            line += text.count("\n", i, m.end())
            i = m.end()
            args, cur, depth = [], "", 0
            while i < n:
                c = text[i]
                if c == '"':
                    j = i + 1
                    while j < n and text[j] != '"':
                        j += 2 if text[j] == "\\" else 1
                    cur += text[i + 1:j]
                    line += text.count("\n", i, j)
                    i = j + 1
                    continue
                if c == "#" and depth == 0 and not cur:
                    end = text.find("\n", i)
                    i = n if end < 0 else end
                    continue
                if c == "(":
                    depth += 1
                elif c == ")":
                    if depth == 0:
                        i += 1
                        break
                    depth -= 1
                if c.isspace() and depth == 0:
                    if cur:
                        args.append(cur)
                        cur = ""
                    if c == "\n":
                        line += 1
                else:
                    if c == "\n":
                        line += 1
                    cur += c
                i += 1
            if cur:
                args.append(cur)
            out.append((name, args, start_line))
        else:
            i += 1
    return out


def read_cmake(path):
    """{stage: {"folders": set, "links": set, "line": n}} from the kvscope_stage() calls and the
    target_link_libraries() of those stages."""
    with open(path, encoding="utf-8") as f:
        commands = cmake_commands(f.read())
    stages = {}
    for name, args, line in commands:
        if name == "kvscope_stage" and args:
            folders = {a.split("/")[0] for a in args[1:] if "/" in a and not a.startswith("$")}
            stages[args[0]] = {"folders": folders, "links": set(), "line": line}
    for name, args, line in commands:
        if name == "target_link_libraries" and args and args[0] in stages:
            stages[args[0]]["links"] |= {a for a in args[1:] if a in stages}
    return stages


def read_table(path):
    """[(stage, folder, {linked stages}, line)] of the rows after the marker."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = next((k for k, l in enumerate(lines) if l.strip().startswith(MARKER)), None)
    if start is None:
        raise ValueError("%s: no '%s' marker" % (path, MARKER))
    rows = []
    k = start + 1
    while k < len(lines) and not lines[k].strip().startswith("|"):
        k += 1
    for k in range(k, len(lines)):
        text = lines[k].strip()
        if not text.startswith("|"):
            break
        cells = [c.strip() for c in text.strip("|").split("|")]
        if len(cells) < 4 or cells[0] == "stage" or set(cells[0]) <= set("-: "):
            continue
        folder = cells[1].strip("`").rstrip("/")
        links_text = re.sub(r"\([^)]*\)", "", cells[3])
        links = set()
        for part in links_text.split(","):
            part = part.strip()
            if part and part != "-":
                links.add(part if part.startswith("kvscope_") else "kvscope_" + part)
        rows.append((cells[0], folder, links, k + 1))
    if not rows:
        raise ValueError("%s:%d: no table rows after the marker" % (path, start + 1))
    return rows


def source_folders(core):
    """Top-level folders of core/ that hold sources, anywhere below them."""
    out = set()
    for entry in sorted(os.listdir(core)):
        full = os.path.join(core, entry)
        if not os.path.isdir(full):
            continue
        for _, _, files in os.walk(full):
            if any(f.endswith(SOURCE_EXTENSIONS) for f in files):
                out.add(entry)
                break
    return out


def main(argv):
    if len(argv) != 2:
        print("usage: core_chart.py ROOT")
        return 2
    core = os.path.join(argv[1], "core")
    cmake_path = os.path.join(core, "CMakeLists.txt")
    readme_path = os.path.join(core, "README.md")
    try:
        stages = read_cmake(cmake_path)
        rows = read_table(readme_path)
    except (OSError, ValueError) as e:
        print("core_chart.py: %s" % e)
        return 1
    if not stages:
        print("core_chart.py: %s: no kvscope_stage() calls" % cmake_path)
        return 1

    problems = []
    seen = set()
    for stage, folder, links, line in rows:
        where = "core/README.md:%d: %s" % (line, stage)
        if stage in seen:
            problems.append("%s: a second row" % where)
            continue
        seen.add(stage)
        if stage not in stages:
            problems.append("%s: no kvscope_stage(%s) in core/CMakeLists.txt" % (where, stage))
            continue
        s = stages[stage]
        if s["folders"] != {folder}:
            problems.append("%s: folder '%s/' in the chart, its sources are in %s in core/CMakeLists.txt:%d"
                            % (where, folder, ", ".join(sorted(f + "/" for f in s["folders"])) or "no folder",
                               s["line"]))
        if links != s["links"]:
            extra = sorted(links - s["links"])
            missing = sorted(s["links"] - links)
            said = []
            if missing:
                said.append("CMake links %s, the chart does not" % ", ".join(missing))
            if extra:
                said.append("the chart links %s, CMake does not" % ", ".join(extra))
            problems.append("%s: links differ: %s" % (where, "; ".join(said)))
    for stage in sorted(set(stages) - seen):
        problems.append("core/CMakeLists.txt:%d: %s has no row in the core/README.md stage table"
                        % (stages[stage]["line"], stage))
    stage_folders = set()
    for s in stages.values():
        stage_folders |= s["folders"]
    for folder in sorted(source_folders(core) - stage_folders):
        problems.append("core/%s/: holds sources but is no stage's folder in core/CMakeLists.txt" % folder)

    print("%d stages in core/CMakeLists.txt, %d rows in the core/README.md table" % (len(stages), len(rows)))
    for stage, folder, links, _ in rows:
        print("  %-18s %-10s -> %s" % (stage, folder + "/", ", ".join(sorted(links)) or "-"))
    if problems:
        print("FAIL: %d mismatch(es):" % len(problems))
        for p in problems:
            print("  " + p)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
