#!/usr/bin/env python3
"""Code comments state rules and reasons; measured speeds belong in docs/ (issue 34).

usage: house_comments.py SOURCE_DIR     the self-test, then core/, cuda/, app/ and widgets/
       house_comments.py --self-test    only check that the checker finds what it should

Flags a comment (// ..., /* ... */, or a CMake # line) that quotes a speed: a number followed by
MB/s, MiB/s, M/s, M symbols/s (or values, tokens), ns per X or ns/X, cycles per X, "x faster",
"x slower", "% faster" or "% slower". Such a figure is a benchmark log: it goes stale with the next
change, and the page that measures it (docs/results, docs/*.md) can be rerun. GB/s and kB/s are
left alone: in this code they name inputs of a model (datasheet bandwidths) or derived rates.
One line per hit on stderr ("file:line: figure"), exit 1 if any.
"""
import os
import re
import sys
import tempfile

FOLDERS = ['core', 'cuda', 'app', 'widgets']
SUFFIXES = ('.cpp', '.h', '.cu', '.cuh', '.c', '.cmake', '.txt', '.in')
FIGURE = re.compile(r'\d[\d.,]*\s*(?:-\s*\d[\d.,]*\s*)?'
                    r'(?:Mi?B/s|M/s|M ?(?:symbols?|values?|tokens?)/s|ns ?(?:per|/) ?\w+|cycles per \w+'
                    r'|x (?:faster|slower)|% (?:faster|slower))')
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def comments(path, text):
    """(line number, comment text) of every comment line; strings are blanked first."""
    cmake = path.endswith(('.cmake', '.txt'))
    in_block = False
    for number, line in enumerate(text.split('\n'), 1):
        if cmake:
            if line.lstrip().startswith('#'):
                yield number, line
            continue
        code = STRING.sub('""', line)
        if in_block:
            end = code.find('*/')
            yield number, code if end < 0 else code[:end]
            in_block = end < 0
            continue
        at = code.find('//')
        start = code.find('/*')
        if start >= 0 and (at < 0 or start < at):
            end = code.find('*/', start + 2)
            yield number, code[start:] if end < 0 else code[start:end]
            in_block = end < 0
        elif at >= 0:
            yield number, code[at:]


def check(root):
    problems = []
    for folder in FOLDERS:
        for here, dirs, files in os.walk(os.path.join(root, folder)):
            dirs.sort()
            for name in sorted(files):
                if not name.endswith(SUFFIXES):
                    continue
                path = os.path.join(here, name)
                with open(path, encoding='utf-8', errors='replace') as f:
                    text = f.read()
                for number, comment in comments(path, text):
                    for m in FIGURE.finditer(comment):
                        problems.append('%s:%d: %s' % (os.path.relpath(path, root), number, m.group(0)))
    return problems


def self_test():
    """Four figures in comments and three look-alikes outside them: exactly the four are found."""
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, 'core', 'codec'))
        with open(os.path.join(root, 'core', 'codec', 'x.cpp'), 'w') as f:
            f.write('// decodes 200-285 M symbols/s on one core\n'
                    'int a = 1;  /* 0.82 ns per symbol */\n'
                    'const char* s = "1580 MB/s";  // a rule, no figure\n'
                    '/* a block\n   20% faster than before */\n'
                    'double bw = 2039;  // 2,039 GB/s: the datasheet\n')
        with open(os.path.join(root, 'core', 'CMakeLists.txt'), 'w') as f:
            f.write('# about 3x faster with -O3\nset(X "5 MB/s")\n')
        got = check(root)
    want = ['core/CMakeLists.txt:1: 3x faster', 'core/codec/x.cpp:1: 200-285 M symbols/s',
            'core/codec/x.cpp:2: 0.82 ns per symbol', 'core/codec/x.cpp:5: 20% faster']
    if got != want:
        print('self-test: expected\n  %s\ngot\n  %s' % ('\n  '.join(want), '\n  '.join(got)), file=sys.stderr)
        return 1
    return 0


def main(argv):
    if argv[1:] == ['--self-test']:
        return self_test()
    if len(argv) != 2:
        print(__doc__.strip().split('\n\n')[1], file=sys.stderr)
        return 2
    if self_test():
        return 1
    problems = check(os.path.abspath(argv[1]))
    for p in problems:
        print(p, file=sys.stderr)
    print('%d speed figure(s) in comments under %s' % (len(problems), ', '.join(f + '/' for f in FOLDERS)))
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
