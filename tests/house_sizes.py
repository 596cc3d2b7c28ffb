#!/usr/bin/env python3
"""House rule of issue 35: no source file (.h/.cpp/.cu) under core/, app/ or widgets/ over 700
lines, and no function over 150 lines.

Usage: house_sizes.py ROOT ALLOW_FILE

Prints the longest file and the longest function (with its name), then fails listing every
offender that the allow-list does not name, and every allow-list entry that is no longer an
offender (so the list only shrinks). The allow-list (tests/house_allow.txt) holds one known
offender per line, `path` or `path:function`, each followed by `# reason`.

Functions are found by brace matching on the text with comments, string and character literals
and preprocessor lines blanked out: at namespace and class scope, a `{` after a parameter list
(and after a constructor's initialiser list) opens a function body, which runs to its matching
`}`; lambdas and local classes count as part of the function that holds them. A function's length
is from the line of its name to the line of its closing brace. Python 3 standard library only.
"""

import os
import re
import sys

MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 150
FOLDERS = ("core", "app", "widgets")
EXTENSIONS = (".h", ".cpp", ".cu")

SCOPE_KEYWORDS = {"namespace", "class", "struct", "union", "enum"}
ACCESS = {"public", "private", "protected", "signals", "slots", "Q_SIGNALS", "Q_SLOTS"}
# Parenthesised groups after these are not the parameter list that names a function.
NOT_A_NAME = {"noexcept", "throw", "decltype", "alignas", "__attribute__", "sizeof", "__declspec",
              "__launch_bounds__", "if", "for", "while", "switch", "catch", "return"}


def skip_block_comment(text, i, line):
    """Past the /* ... */ that starts at i (to the end of text when unclosed): (index, line)."""
    end = text.find("*/", i + 2)
    end = len(text) if end < 0 else end + 2
    return end, line + text.count("\n", i, end)


def tokenize(text):
    """Tokens (kind, value, line) of C++ text: 'id', 'num', 'str', 'chr', 'op'. Comments and
    preprocessor lines are dropped; string and character literals become one token each."""
    tokens = []
    i, n, line = 0, len(text), 1
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
            at_line_start = True
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if at_line_start and c == "#":
            # A preprocessor line, with its backslash continuations (and comments on it).
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    line += 1
                    i += 2
                    continue
                if text.startswith("/*", i):
                    i, line = skip_block_comment(text, i, line)
                    continue
                i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if text.startswith("/*", i):
            i, line = skip_block_comment(text, i, line)
            continue
        if c.isalpha() or c == "_":
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            if j < n and text[j] == '"' and word in ("R", "u8R", "uR", "UR", "LR"):
                # Raw string: R"delim( ... )delim"
                open_paren = text.find("(", j)
                delim = text[j + 1:open_paren]
                close = text.find(")" + delim + '"', open_paren)
                end = n if close < 0 else close + len(delim) + 2
                tokens.append(("str", "", line))
                line += text.count("\n", i, end)
                i = end
                continue
            if j < n and text[j] in "'\"" and word in ("u8", "u", "U", "L"):
                i = j  # the literal's prefix; the literal follows
                continue
            tokens.append(("id", word, line))
            i = j
            continue
        if c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] in "_.'" or
                             (text[j] in "+-" and text[j - 1] in "eEpP")):
                j += 1
            tokens.append(("num", text[i:j], line))
            i = j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                if text[j] == "\\":
                    j += 1
                elif text[j] == "\n":
                    break  # unterminated: stop at the line's end
                j += 1
            tokens.append(("str" if c == '"' else "chr", "", line))
            i = j + 1
            continue
        if text.startswith("::", i) or text.startswith("->", i):
            tokens.append(("op", text[i:i + 2], line))
            i += 2
            continue
        tokens.append(("op", c, line))
        i += 1
    return tokens


def skip_group(tokens, k, open_ch, close_ch):
    """Index after the group that opens at tokens[k] (open_ch) and its matching close_ch."""
    depth = 0
    while k < len(tokens):
        v = tokens[k][1] if tokens[k][0] == "op" else None
        if v == open_ch:
            depth += 1
        elif v == close_ch:
            depth -= 1
            if depth == 0:
                return k + 1
        k += 1
    return k


def top_level_indexed(decl):
    """(index, token) of the tokens of decl outside (), [] and {} groups and template <...>
    parameter lists; an opening bracket itself is at the outer level."""
    depth = 0
    k = 0
    while k < len(decl):
        t = decl[k]
        if t[0] == "id" and t[1] == "template" and depth == 0 and k + 1 < len(decl) and decl[k + 1][1] == "<":
            angle = 0
            k += 1
            while k < len(decl):
                if decl[k][1] == "<":
                    angle += 1
                elif decl[k][1] == ">":
                    angle -= 1
                    if angle == 0:
                        break
                k += 1
            k += 1
            continue
        if t[0] == "op" and t[1] in "([{":
            if depth == 0:
                yield k, t
            depth += 1
        elif t[0] == "op" and t[1] in ")]}":
            depth -= 1
        elif depth == 0:
            yield k, t
        k += 1


def top_level(decl):
    return [t for _, t in top_level_indexed(decl)]


def function_name(decl):
    """The name in a declaration's tokens (its head before any initialiser list): the identifier
    chain before the last parenthesised group that follows a name."""
    best = None
    k = 0
    while k < len(decl):
        kind, value, _ = decl[k]
        if kind == "op" and value == "(":
            end = skip_group(decl, k, "(", ")")
            if k > 0:
                name = name_before(decl, k)
                if name:
                    best = name
            k = end
            continue
        k += 1
    return best


def name_before(decl, k):
    """The (qualified) name whose last token is decl[k - 1], or None."""
    j = k - 1
    kind, value, line = decl[j]
    # operator(), operator==, operator[] ...: walk back to the keyword.
    m = j
    while m >= 0 and not (decl[m][0] == "id" and decl[m][1] == "operator") and k - m <= 3:
        m -= 1
    if m >= 0 and decl[m][1] == "operator" and decl[m][0] == "id":
        parts = ["operator" + "".join(t[1] for t in decl[m + 1:k])]
        j = m - 1
    elif kind == "id" and value not in NOT_A_NAME:
        parts = [value]
        j -= 1
        if j >= 0 and decl[j] == ("op", "~", decl[j][2]):
            parts[0] = "~" + parts[0]
            j -= 1
    else:
        return None
    # Qualifiers: Class::, ns::, Class<T>::
    while j >= 1 and decl[j][0] == "op" and decl[j][1] == "::":
        q = j - 1
        if decl[q][0] == "op" and decl[q][1] == ">":
            depth = 0
            while q >= 0:
                if decl[q][1] == ">":
                    depth += 1
                elif decl[q][1] == "<":
                    depth -= 1
                    if depth == 0:
                        break
                q -= 1
            q -= 1
        if q < 0 or decl[q][0] != "id":
            break
        parts.insert(0, decl[q][1])
        j = q - 1
    return ("::".join(parts), decl[k - 1][2] if parts else line)


def find_functions(text):
    """[(name, first_line, last_line)] of the function definitions in C++ text."""
    tokens = tokenize(text)
    found = []
    scopes = []  # class names ("" for namespaces) of the scopes we are in
    decl = []
    k = 0
    while k < len(tokens):
        tok = tokens[k]
        kind, value, line = tok
        if kind == "op" and value == ";":
            decl = []
            k += 1
            continue
        if kind == "op" and value == "}":
            if scopes:
                scopes.pop()
            decl = []
            k += 1
            continue
        if kind == "op" and value == ":" and decl and decl[-1][0] == "id" and decl[-1][1] in ACCESS:
            decl = []
            k += 1
            continue
        if kind == "op" and value == "(":
            end = skip_group(tokens, k, "(", ")")
            decl.extend(tokens[k:end])
            k = end
            continue
        if kind == "op" and value == "[":
            end = skip_group(tokens, k, "[", "]")
            decl.extend(tokens[k:end])
            k = end
            continue
        if kind == "op" and value == "{":
            top = top_level(decl)
            has_assign = any(t[1] == "=" for t in top) and not any(t[1] == "operator" for t in decl)
            # Where the head ends: a ':' after the parameter list starts an initialiser list.
            head_end = len(decl)
            seen_paren = False
            for idx, t in top_level_indexed(decl):
                if t[0] == "op" and t[1] == "(":
                    seen_paren = True
                elif seen_paren and t[0] == "op" and t[1] == ":":
                    head_end = idx
                    break
            head = decl[:head_end]
            has_params = any(t[0] == "op" and t[1] == "(" for t in top_level(head))
            scope_kw = None
            for idx, t in top_level_indexed(decl):
                if t[0] == "id" and t[1] in SCOPE_KEYWORDS:
                    if not any(u[0] == "op" and u[1] == "(" for u in top_level(decl[idx:])):
                        scope_kw = (idx, t[1])
                    break
            extern_c = len(decl) >= 2 and decl[-2][1] == "extern" and decl[-1][0] == "str"
            if scope_kw or extern_c or not decl:
                name = ""
                if scope_kw and scope_kw[1] in ("class", "struct", "union"):
                    rest = [t for t in decl[scope_kw[0] + 1:] if t[0] == "id"
                            and t[1] not in ("final", "alignas")]
                    name = rest[0][1] if rest else ""
                scopes.append(name)
                decl = []
                k += 1
                continue
            in_init_list = head_end < len(decl)
            if has_params and not has_assign and not (in_init_list and decl[-1][0] == "id") \
                    and not (in_init_list and decl[-1][1] in (">", "::")):
                end = skip_group(tokens, k, "{", "}")
                got = function_name(head)
                if got:
                    name, first = got
                    owner = [s for s in scopes if s]
                    if owner and "::" not in name:
                        name = "::".join(owner) + "::" + name
                    last = tokens[end - 1][2] if end - 1 < len(tokens) else tokens[-1][2]
                    found.append((name, first, last))
                decl = []
                k = end
                continue
            # A braced initialiser (= {...}, a member's {init}, T x{...}): part of the declaration.
            end = skip_group(tokens, k, "{", "}")
            decl.extend(tokens[k:end])
            k = end
            continue
        decl.append(tok)
        k += 1
    return found


SELF_TEST = r'''
namespace a {
// void commented() { a }
static const char* s = "{ not a body";
char c = '{';
struct S {
    S() : m_x{1}, m_y(2) {
        auto f = [this](int v) { return v + '}'; };
    }
    int m_x, m_y;
    bool operator==(const S& o) const { return m_x == o.m_x; }
};
template <typename T>
void Outer<T>::run(int n) noexcept(true)
{
    const char* raw = R"x(})x";
    if (n) { for (;;) {} }
}
}  // namespace a
extern "C" {
int cfun(void) { return 0; }
}
'''


def self_test():
    """The finder on a snippet whose comments, literals and initialisers hold braces."""
    got = find_functions(SELF_TEST)
    want = [("S::S", 7, 9), ("S::operator==", 11, 11), ("Outer::run", 14, 18), ("cfun", 21, 21)]
    if got != want:
        print("house_sizes.py: self-test: the function finder found %s, expected %s" % (got, want))
        return False
    return True


def read_allow(path):
    """{entry: reason}; raises ValueError naming the line of a malformed entry."""
    entries = {}
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            text = raw.strip()
            if not text or text.startswith("#"):
                continue
            entry, sep, reason = text.partition("#")
            entry = entry.strip()
            if not sep or not reason.strip():
                raise ValueError("%s:%d: '%s' has no '# reason'" % (path, n, entry))
            if entry in entries:
                raise ValueError("%s:%d: '%s' is listed twice" % (path, n, entry))
            entries[entry] = reason.strip()
    return entries


def main(argv):
    if len(argv) != 3:
        print("usage: house_sizes.py ROOT ALLOW_FILE")
        return 2
    root, allow_path = argv[1], argv[2]
    if not self_test():
        return 1
    try:
        allow = read_allow(allow_path)
    except (OSError, ValueError) as e:
        print("house_sizes.py: %s" % e)
        return 1

    files = []  # (lines, path)
    functions = []  # (lines, "path:name")
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames.sort()
            for fn in sorted(filenames):
                if not fn.endswith(EXTENSIONS):
                    continue
                full = os.path.join(dirpath, fn)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                with open(full, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                files.append((len(text.splitlines()), rel))
                for name, first, last in find_functions(text):
                    functions.append((last - first + 1, "%s:%s" % (rel, name)))
    if not files:
        print("house_sizes.py: no sources under %s" % ", ".join(FOLDERS))
        return 1

    longest_file = max(files)
    longest_function = max(functions)
    print("longest file: %s (%d lines; limit %d)" % (longest_file[1], longest_file[0], MAX_FILE_LINES))
    print("longest function: %s (%d lines; limit %d)"
          % (longest_function[1], longest_function[0], MAX_FUNCTION_LINES))
    print("%d files, %d functions" % (len(files), len(functions)))

    offenders = {}  # entry -> what it is
    for lines, path in files:
        if lines > MAX_FILE_LINES:
            offenders[path] = (lines, "%s: %d lines (file limit %d)" % (path, lines, MAX_FILE_LINES))
    for lines, where in sorted(functions):
        if lines > MAX_FUNCTION_LINES:  # overloads share an entry: the longest is reported
            offenders[where] = (lines, "%s: %d lines (function limit %d)" % (where, lines, MAX_FUNCTION_LINES))
    unlisted = sorted(k for k in offenders if k not in allow)
    stale = sorted(k for k in allow if k not in offenders)
    for k in sorted(k for k in offenders if k in allow):
        print("allowed for now: %s (%s)" % (offenders[k][1], allow[k]))
    ok = True
    if unlisted:
        ok = False
        print("FAIL: %d offender(s) not in %s:" % (len(unlisted), allow_path))
        for k in unlisted:
            print("  " + offenders[k][1])
    if stale:
        ok = False
        print("FAIL: %d entries of %s no longer offend (remove them):" % (len(stale), allow_path))
        for k in stale:
            print("  " + k)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
