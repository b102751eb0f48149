"""svgkit.py — what tools/trace_svg.py and tools/sweep_svg.py share: the palette and font,
XML escaping, rough text widths and tick spacing (standard library only)."""
import math
import re

FONT = "'Helvetica Neue', Helvetica, Arial, 'DejaVu Sans', 'Liberation Sans', sans-serif"
INK = "#1f2937"       # titles, main text
MUTED = "#6b7280"     # secondary text
FAINT = "#9ca3af"     # brackets, ticks
GRID = "#e5e7eb"      # grid lines


_BAD_XML_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def esc(s):
    """Text or attribute value, escaped for XML (control characters dropped)."""
    s = _BAD_XML_CHARS.sub("", str(s))
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
             .replace('"', "&quot;"))


def num(v):
    """Compact number for SVG attributes."""
    r = round(v, 2)
    if r == int(r):
        return str(int(r))
    return ("%.2f" % r).rstrip("0").rstrip(".")


def text_w(s, size):
    """Rough width of s in px for a sans-serif font (no font metrics in the standard library)."""
    w = 0.0
    for ch in s:
        if ch in "il.,:;|!'":
            w += 0.3
        elif ch in "mwMW@%":
            w += 0.9
        elif ch.isupper() or ch.isdigit():
            w += 0.66
        elif ch == " ":
            w += 0.3
        else:
            w += 0.57
    return w * size


def nice_step(span, target):
    """A 1/2/2.5/5 x 10^k step giving about `target` intervals over span."""
    raw = span / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag * (1 + 1e-9):
            return m * mag
    return 10 * mag


def tick_decimals(step):
    d = max(0, -int(math.floor(math.log10(step) + 1e-9)))
    while d < 6 and abs(step * 10 ** d - round(step * 10 ** d)) > 1e-6:
        d += 1
    return d


def read_text(path, die):
    """The file as text (UTF-8, a BOM allowed), or die() with why not."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        die("cannot read %s: %s" % (path, e.strerror or e))
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        die("%s is not UTF-8 text" % path)


def svg_open(out, width, height, title):
    """Append the <svg> element's opening and the <title> (the caller closes it)."""
    out.append('<?xml version="1.0" encoding="UTF-8"?>')
    out.append('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
               'font-family="%s" font-size="12" fill="%s">' % (width, height, width, height, esc(FONT), INK))
    out.append('<title>%s</title>' % esc(title))
