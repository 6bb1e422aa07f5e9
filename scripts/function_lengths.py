#!/usr/bin/env python3
"""Lists the functions of C++/CUDA sources longer than a bound, longest first.

Usage: scripts/function_lengths.py [--over N] [PATH ...]   (default: --over 120 src)

A brace-matching scan (comments, strings and character literals blanked first): a `{` at
namespace or class scope whose preceding text looks like a signature (has a `(`, is not a
namespace/class/struct/enum/union or an initialiser `= {`) opens a function; its length is
the lines from the signature's first line to the closing `}`. Lambdas and local classes count
as part of the function that holds them. A comment line starting `// Long` in the comment block
right above a function (saying why it is long) marks it as explained.
"""
import os
import re
import sys

EXTS = ('.cpp', '.h', '.cu', '.cuh', '.cc', '.hpp')


def blank(text):
    """Replaces comments, string and char literals by spaces, keeping newlines."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(''.join(ch if ch == '\n' else ' ' for ch in text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            if m:
                end = text.find(')' + m.group(1) + '"', i)
                j = n if end < 0 else end + len(m.group(1)) + 2
                out.append(''.join(ch if ch == '\n' else ' ' for ch in text[i:j]))
                i = j
            else:
                out.append(c)
                i += 1
        elif c in '"\'':
            if c == "'" and i > 0 and (text[i - 1].isalnum()):  # digit separator 1'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(c + ' ' * (j - i - 2) + c if j - i >= 2 else ' ' * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return ''.join(out)


NOT_FUNC = re.compile(r'\b(namespace|class|struct|enum|union)\b')
CONTROL = re.compile(r'^\s*(if|for|while|switch|do|else|try|catch)\b')


def functions(path):
    text = open(path, encoding='utf-8', errors='replace').read()
    raw_lines = text.split('\n')
    code = blank(text)
    line_of = []
    ln = 1
    for ch in code:
        line_of.append(ln)
        if ch == '\n':
            ln += 1
    results = []
    # stack entries: 'scope' (namespace/class/extern) or 'other'
    stack = []
    head_start = 0  # index where the current declaration's text begins
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == '{':
            head = code[head_start:i]
            in_scope = all(s == 'scope' for s in stack)
            stripped = re.sub(r'\s+', ' ', head).strip()
            if in_scope and '(' in stripped and not NOT_FUNC.search(stripped.split('(')[0]) \
                    and not stripped.endswith('=') and not CONTROL.match(stripped) \
                    and not stripped.startswith('extern "'):
                # a function body: find its matching brace
                depth, j = 0, i
                while j < n:
                    if code[j] == '{':
                        depth += 1
                    elif code[j] == '}':
                        depth -= 1
                        if depth == 0:
                            break
                    j += 1
                first = head_start + (len(head) - len(head.lstrip()))
                start, end = line_of[min(first, n - 1)], line_of[min(j, n - 1)]
                name = re.findall(r'([~\w:]+(?:operator\s*\S+)?)\s*\(', stripped)
                name = name[0] if name else stripped[:40]
                k = start - 2  # the comment block right above the signature
                while k >= 0 and (raw_lines[k].strip().startswith('//') or
                                  raw_lines[k].strip().startswith('template')):
                    k -= 1
                above = raw_lines[k + 1:start - 1]
                explained = any(re.match(r'\s*// Long\b', l) for l in above)
                results.append((end - start + 1, start, end, name, explained))
                i = j + 1
                head_start = i
                continue
            stack.append('scope' if (in_scope and (NOT_FUNC.search(stripped) or
                                                   stripped.startswith('extern'))
                                     and not stripped.endswith('=')) else 'other')
            head_start = i + 1
        elif c == '}':
            if stack:
                stack.pop()
            head_start = i + 1
        elif c == ';':
            head_start = i + 1
        elif c == '#' and (i == 0 or code[i - 1] == '\n'):
            j = code.find('\n', i)
            while j > 0 and code[j - 1] == '\\':
                j = code.find('\n', j + 1)
            i = n if j < 0 else j
            head_start = i
            continue
        elif c == ':' and stack and stack[-1] == 'scope' and \
                re.search(r'\b(public|private|protected)\s*$', code[head_start:i]):
            head_start = i + 1
        i += 1
    return results


def main(argv):
    over = 120
    paths = []
    k = 0
    while k < len(argv):
        if argv[k] == '--over':
            over = int(argv[k + 1])
            k += 2
        else:
            paths.append(argv[k])
            k += 1
    paths = paths or ['src']
    files = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files += [os.path.join(root, f) for f in names if f.endswith(EXTS)]
        else:
            files.append(p)
    rows = []
    for f in sorted(files):
        for length, start, end, name, explained in functions(f):
            if length > over:
                rows.append((length, f, start, end, name, explained))
    rows.sort(key=lambda r: (-r[0], r[1]))
    for length, f, start, end, name, explained in rows:
        print(f'{length:5d}  {f}:{start}-{end}  {name}{"  (explained)" if explained else ""}')
    print(f'{len(rows)} functions over {over} lines'
          f' ({sum(1 for r in rows if not r[5])} without a comment saying why)')


if __name__ == '__main__':
    main(sys.argv[1:])
