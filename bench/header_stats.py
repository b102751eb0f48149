#!/usr/bin/env python3
"""The header's shape, for reviews of its structure (bench/RESULTS.md, "The header's shape").

    python3 bench/header_stats.py [ddp.h] [--functions N]

Prints: lines per section (the >>markers of the implementation, and the manual before them),
the function-size distribution (median, 90th percentile, longest N), and the fields of
struct ddp_context (top level, and inside nested structs). Text only: no build, no run.
"""
import re
import sys


def sections(lines):
    """(name, first line, line count) for the manual and each >>section, in file order."""
    marks = [(0, "manual")]
    for i, line in enumerate(lines):
        m = re.match(r"^   >>([a-z][a-z0-9-]*)  ", line)
        if m:
            start = i - 1 if i and lines[i - 1].startswith("/* ----") else i
            marks.append((start, ">>" + m.group(1)))
    first_code = next((i for i, l in enumerate(lines) if l.startswith("#")), len(lines))
    marks[1:1] = [(first_code, "(declarations)")] if first_code < marks[1][0] else []
    out = []
    for k, (start, name) in enumerate(marks):
        end = marks[k + 1][0] if k + 1 < len(marks) else len(lines)
        out.append((name, start + 1, end - start))
    return out


def functions(lines):
    """(name, first line, line count) of every function definition at file scope."""
    out, i = [], 0
    head = re.compile(r"^(?:static |inline |DDP_API |DDPDEF |extern )*[A-Za-z_][\w \*]*?\b(\w+)\s*\([^;]*$")
    while i < len(lines):
        m = head.match(lines[i])
        if m and not lines[i].startswith(("typedef", "#", " ", "\t", "/*", "}")):
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith("{") and ";" not in lines[j]:
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{"):
                k = j + 1
                while k < len(lines) and not lines[k].startswith("}"):
                    k += 1
                out.append((m.group(1), i + 1, k - i + 1))
                i = k + 1
                continue
        i += 1
    return out


def context_fields(text):
    """Fields of struct ddp_context: (top-level count, nested count, nested struct names)."""
    m = re.search(r"^struct ddp_context \{\n(.*?)^\};", text, re.S | re.M)
    if not m:
        return 0, 0, []
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    top, nested, names, depth = 0, 0, [], 0
    for line in body.splitlines():
        s = line.strip()
        if not s:
            continue
        opens, closes = s.count("{"), s.count("}")
        if closes and depth:
            depth -= closes
            mm = re.match(r"\}\s*(\w+)", s)
            if mm:
                names.append(mm.group(1))
                top += 1
            continue
        if opens:
            depth += opens
            continue
        if s.endswith(";"):
            decl = s[:-1]
            decl = re.sub(r"\[[^\]]*\]", "", decl)
            count = len([d for d in re.split(r",", decl) if d.strip()])
            if depth:
                nested += count
            else:
                top += count
    return top, nested, names


def main(argv):
    path = next((a for a in argv[1:] if not a.startswith("--")), "ddp.h")
    longest = 12
    if "--functions" in argv:
        longest = int(argv[argv.index("--functions") + 1])
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")
    print(f"{path}: {len(lines)} lines")
    print("\nlines per section:")
    for name, start, count in sections(lines):
        print(f"  {name:<16} {count:>6}   (from line {start})")
    fns = functions(lines)
    sizes = sorted(n for _, _, n in fns)
    if sizes:
        med = sizes[len(sizes) // 2]
        p90 = sizes[min(len(sizes) - 1, int(len(sizes) * 0.9))]
        print(f"\nfunctions: {len(fns)}, median {med} lines, 90th percentile {p90}, longest {sizes[-1]}")
        for name, start, n in sorted(fns, key=lambda f: -f[2])[:longest]:
            print(f"  {n:>4}  {name} (line {start})")
    top, nested, names = context_fields(text)
    print(f"\nstruct ddp_context: {top} fields at the top level"
          + (f" ({len(names)} of them nested structs: {', '.join(names)}), {nested} fields inside them" if names else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
