#!/usr/bin/env python3
"""Every relative link in README.md and docs/**/*.md must resolve.

usage: check_links.py SOURCE_DIR     the self-test, then the repository's documentation
       check_links.py --self-test    only check that the checker finds what it should

A link is [text](target), ![alt](target), [label]: target, or an HTML src="..."/href="...",
outside code spans and fenced blocks. http(s)/mailto targets are not checked. A target must name
an existing file or folder relative to the page that links it; a #fragment on a Markdown target
(or alone, for the page itself) must be one of that page's headings as GitHub makes their
anchors. One line per broken link on stderr ("page:line: target: reason"), exit 1 if any.

README.md's "Headline results" table quotes generated pages: each of its rows must link into
docs/results/, and every number in a link's text must appear on the page it links to (so a
figure that a rerun changed cannot stay behind in the README).
"""
import os
import re
import sys
import tempfile

INLINE = re.compile(r'!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
REFDEF = re.compile(r'^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+["(].*)?$')
HTML = re.compile(r'\b(?:src|href)\s*=\s*"([^"]+)"')
HEADING = re.compile(r'^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$')
FENCE = re.compile(r'^\s{0,3}(```|~~~)')
CODE_SPAN = re.compile(r'(`+)(?:(?!\1).)+?\1')


def prose_lines(text):
    """(line number, line) outside fenced code blocks, with code spans blanked."""
    fence = None
    for number, line in enumerate(text.split('\n'), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield number, CODE_SPAN.sub(lambda s: ' ' * len(s.group(0)), line)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # a link keeps its text
    text = re.sub(r'<[^>]+>', '', text).replace('`', '').lower()
    text = ''.join(c for c in text if c.isalnum() or c in ' -_')
    return text.replace(' ', '-')


def anchors(path, cache={}):
    if path not in cache:
        seen, found = {}, set()
        with open(path, encoding='utf-8') as f:
            text = f.read()
        fence = None
        for line in text.split('\n'):
            m = FENCE.match(line)
            if m:
                fence = m.group(1) if fence is None else (None if m.group(1) == fence else fence)
                continue
            h = HEADING.match(line) if fence is None else None
            if h:
                base = slug(h.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else '%s-%d' % (base, n))
        cache[path] = found
    return cache[path]


def check_page(page, root):
    problems = []
    with open(page, encoding='utf-8') as f:
        text = f.read()
    here = os.path.dirname(page)
    for number, line in prose_lines(text):
        targets = [m.group(1) for m in INLINE.finditer(line)]
        targets += [m.group(1) for m in HTML.finditer(line)]
        m = REFDEF.match(line)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if re.match(r'^[a-z][a-z0-9+.-]*:', target, re.I):
                continue  # http:, https:, mailto:
            where = '%s:%d: %s' % (os.path.relpath(page, root), number, target)
            path, _, fragment = target.partition('#')
            if path.startswith('/'):
                problems.append(where + ': absolute path; use a path relative to the page')
                continue
            resolved = os.path.normpath(os.path.join(here, path)) if path else page
            if not os.path.exists(resolved):
                problems.append(where + ': no such file')
            elif fragment and resolved.endswith('.md') and fragment not in anchors(resolved):
                problems.append(where + ': no heading with the anchor #' + fragment)
    return problems


NUMBER = re.compile(r'(?<![\w.])\d+(?:[.,]\d+)*')


def check_headline(root):
    """README.md's headline table: rows link into docs/results/, link texts quote their pages."""
    readme = os.path.join(root, 'README.md')
    if not os.path.isfile(readme):
        return []
    with open(readme, encoding='utf-8') as f:
        lines = f.read().split('\n')
    problems, inside = [], False
    for number, line in enumerate(lines, 1):
        h = HEADING.match(line)
        if h:
            inside = h.group(2).strip().lower() == 'headline results'
            continue
        if not inside or not line.startswith('|') or set(line) <= set('|-: '):
            continue
        links = [(m.group(0), m.group(1)) for m in INLINE.finditer(line)]
        where = 'README.md:%d' % number
        if line.split('|')[1].strip() == 'what':
            continue  # the header row
        if not any(t.startswith('docs/results/') for _, t in links):
            problems.append(where + ': headline row: no link into docs/results/')
        for whole, target in links:
            path = os.path.normpath(os.path.join(root, target.partition('#')[0]))
            if not target.startswith('docs/results/') or not os.path.isfile(path):
                continue
            with open(path, encoding='utf-8') as f:
                page = f.read()
            text = whole[whole.index('[') + 1:whole.rindex('](')]
            for n in NUMBER.findall(text):
                if not re.search(r'(?<![\d.])' + re.escape(n) + r'(?![\d])', page):
                    problems.append('%s: %s: %s is not on the page' % (where, target, n))
    return problems


def pages(root):
    found = [os.path.join(root, 'README.md')]
    for folder, dirs, files in os.walk(os.path.join(root, 'docs')):
        dirs.sort()
        found += [os.path.join(folder, f) for f in sorted(files) if f.endswith('.md')]
    return [p for p in found if os.path.isfile(p)]


def check(root):
    problems = []
    for page in pages(root):
        problems += check_page(page, root)
    return problems + check_headline(root)


def self_test():
    """A small tree with good and broken links and headline rows: the checker must report exactly
    the broken ones."""
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, 'docs', 'results'))
        with open(os.path.join(root, 'docs', 'results', 'speed.md'), 'w') as f:
            f.write('# Codec speed (one thread)\n\n## Codec speed (one thread)\n')
        with open(os.path.join(root, 'README.md'), 'w') as f:
            f.write('# kvscope\n\n'
                    '[ok](docs/results/speed.md#codec-speed-one-thread-1) and [web](https://x.org/a)\n'
                    '`[in code](nowhere.md)` ![img](docs/missing.png)\n'
                    '```\n[fenced](nowhere.md)\n```\n'
                    '[self](#kvscope) [bad anchor](#no-such) [gone](docs/gone.md)\n'
                    '[ref]: docs/results/speed.md#codec-speed-two\n'
                    '## Headline results\n| what | figure |\n|---|---|\n'
                    '| decode, 4 genres | [1.63x, 3.324 bits](docs/results/speed.md) |\n'
                    '| encode | [0.86x](docs/results/speed.md) |\n'
                    '| elsewhere | [2x](docs/gone.md) |\n')
        with open(os.path.join(root, 'docs', 'results', 'speed.md'), 'a') as f:
            f.write('| ours | 1.63x | 3.324 | 10.86x |\n')
        got = [p.split(': ', 1)[0] + ': ' + p.rsplit(': ', 1)[1] for p in check(root)]
    want = ['README.md:4: no such file',
            'README.md:8: no heading with the anchor #no-such',
            'README.md:8: no such file',
            'README.md:9: no heading with the anchor #codec-speed-two',
            'README.md:15: no such file',
            'README.md:14: 0.86 is not on the page',
            'README.md:15: no link into docs/results/']
    if got != want:
        print('self-test: expected\n  %s\ngot\n  %s' % ('\n  '.join(want), '\n  '.join(got)),
              file=sys.stderr)
        return 1
    return 0


def main(argv):
    if argv[1:] == ['--self-test']:
        return self_test()
    if len(argv) != 2:
        print(__doc__.strip().split('\n\n')[1], file=sys.stderr)
        return 2
    if self_test():
        return 1  # a checker that misses broken links must not pass the repository
    root = os.path.abspath(argv[1])
    problems = check(root)
    for p in problems:
        print(p, file=sys.stderr)
    checked = len(pages(root))
    print('%d page(s) checked, %d broken link(s)' % (checked, len(problems)))
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
