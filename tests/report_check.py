#!/usr/bin/env python3
"""Checks of a `moetrain report` page for tests/report.sh (standard library + numpy only).

  report_check.py html PAGE.html MIN_PLOTS [SECTION_ID...]
      every <svg class="plot"> draws at least one data element (class="d"), at least MIN_PLOTS
      plots, every SECTION_ID is an <h2 id=...>, and the page is self-contained (no script, no
      link, no src/href/url(), no http other than the SVG namespace).
  report_check.py dom PAGE.html DOM.html
      the browser's DOM (chromium --dump-dom) holds as many plots and data elements as the page.
  report_check.py png SHOT.png
      the screenshot decodes, is not blank (> 3% of pixels not white) and shows plotted colour
      (> 0.2% of pixels saturated, i.e. lines and cells, not only black text).
"""
import re
import struct
import sys
import zlib

import numpy as np


def fail(msg):
    print("report_check: FAIL: " + msg)
    sys.exit(1)


def plots(text):
    return re.findall(r'<svg class="plot".*?</svg>', text, flags=re.S)


def check_html(path, min_plots, sections):
    text = open(path, encoding="utf-8").read()
    ps = plots(text)
    if len(ps) < min_plots:
        fail(f"{path}: {len(ps)} plots, expected at least {min_plots}")
    for i, p in enumerate(ps):
        title = re.search(r'font-weight="bold">(.*?)</text>', p)
        n = len(re.findall(r'class="d"', p))
        if n == 0:
            fail(f"{path}: plot {i} ({title.group(1) if title else '?'}) draws nothing")
    for s in sections:
        if f'<h2 id="{s}">' not in text:
            fail(f"{path}: no section {s}")
    for bad in ("<script", "<link", "src=", "href=", "url(", "@import", "<iframe", "<img"):
        if bad in text.lower():
            fail(f"{path}: not self-contained: holds {bad!r}")
    rest = text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    if "http:" in rest or "https:" in rest:
        fail(f"{path}: names a network address")
    print(f"{path}: {len(ps)} plots, each with data; sections {' '.join(sections)}; self-contained")


def check_dom(path, dom_path):
    page = open(path, encoding="utf-8").read()
    dom = open(dom_path, encoding="utf-8", errors="replace").read()
    want_svg, got_svg = len(plots(page)), len(plots(dom))
    want_d, got_d = page.count('class="d"'), dom.count('class="d"')
    if got_svg != want_svg or got_d != want_d:
        fail(f"{dom_path}: the browser's DOM has {got_svg} plots / {got_d} data elements, the page {want_svg} / {want_d}")
    print(f"{dom_path}: the browser parsed {got_svg} plots with {got_d} data elements")


def decode_png(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: not a PNG")
    pos, idat = 8, b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    if depth != 8 or ctype not in (2, 6) or interlace != 0:
        fail(f"{path}: PNG depth {depth} colour type {ctype} interlace {interlace} not handled")
    bpp = 3 if ctype == 2 else 4
    stride = w * bpp
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, stride + 1)
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:]
        if f == 0:
            cur = line.copy()
        elif f == 2:
            cur = line + prev  # uint8 wraps modulo 256, as the filter wants
        elif f == 1:  # Sub: a running sum per channel
            cur = (np.cumsum(line.reshape(w, bpp).astype(np.uint32), axis=0) & 255).astype(np.uint8).reshape(stride)
        else:  # Average (3) and Paeth (4) depend on the reconstructed left byte: one byte at a time
            cur = bytearray(line.tobytes())
            up = prev.tobytes()
            for i in range(stride):
                a = cur[i - bpp] if i >= bpp else 0
                b = up[i]
                if f == 3:
                    cur[i] = (cur[i] + ((a + b) >> 1)) & 255
                else:
                    c = up[i - bpp] if i >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                    cur[i] = (cur[i] + pr) & 255
            cur = np.frombuffer(bytes(cur), dtype=np.uint8)
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)[:, :, :3].astype(np.int16)


def check_png(path):
    img = decode_png(path)
    h, w, _ = img.shape
    not_white = (img.min(axis=2) < 235).mean()
    saturated = ((img.max(axis=2) - img.min(axis=2)) > 80).mean()
    if not_white < 0.03:
        fail(f"{path}: {100 * not_white:.2f}% of pixels not white: blank")
    if saturated < 0.002:
        fail(f"{path}: {100 * saturated:.3f}% coloured pixels: no plotted data visible")
    print(f"{path}: {w}x{h}, {100 * not_white:.1f}% not white, {100 * saturated:.2f}% coloured")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "html":
        check_html(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    elif len(sys.argv) == 4 and sys.argv[1] == "dom":
        check_dom(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "png":
        check_png(sys.argv[2])
    else:
        fail("usage: report_check.py html PAGE MIN_PLOTS [SECTION...] | dom PAGE DOM | png SHOT")
