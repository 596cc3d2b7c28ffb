#!/usr/bin/env python3
"""The command-line grammar of docs/cli.md, checked on the binary.

usage: cli_grammar.py KVSCOPE_CLI

Every old spelling (a hidden alias kept for one release) is run next to its new spelling on the
same small real input (a synthetic KV; with the default model, its own KV and contexts): both
must give the same result (stdout JSON without timings, or the same one-line error), the old
one must print exactly one line `kvscope-cli: OLD is deprecated, use NEW` on stderr and the new
one none. Then: every command that loads a model offers the whole model group, every command's
--help ends with its example line, and no deprecated spelling shows in --help.
Python 3 standard library only; the model parts skip (with a note) when the default model is
absent.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

CLI = None
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAILURES = []
MODEL_GROUP = ['--model', '--tokenizer', '--threads', '--compute', '--kv-dtype', '--block', '--weights', '--decode-kernels']
MODEL_COMMANDS = ['info', 'generate', 'capture', 'bench model', 'eval', 'demo', 'sensitivity', 'sweep', 'tune', 'stream']


def run(args, expect_ok=True):
    r = subprocess.run([CLI] + args, capture_output=True, text=True, timeout=300)
    if expect_ok and r.returncode != 0:
        fail('%s: exit %d: %s' % (' '.join(args), r.returncode, r.stderr.strip()[-400:]))
    return r


def fail(msg):
    FAILURES.append(msg)
    print('FAIL: ' + msg, file=sys.stderr)


def deprecation_lines(stderr):
    return [l for l in stderr.splitlines() if 'is deprecated' in l]


def pick(j, keys):
    """The keys of a JSON object that do not depend on timing, with nested paths as a/b/c."""
    out = {}
    for k in keys:
        v = j
        for part in k.split('/'):
            v = v[int(part)] if isinstance(v, list) else v[part]
        out[k] = v
    return out


def same(name, old_args, new_args, renames, keys=None, expect_ok=True, error_has=None):
    """Runs both spellings; the results must match and only the old one must note its deprecation
    (one line per (old, new) pair of `renames`)."""
    old, new = run(old_args, expect_ok), run(new_args, expect_ok)
    want = ['kvscope-cli: %s is deprecated, use %s' % pair for pair in renames]
    if deprecation_lines(old.stderr) != want:
        fail('%s: the old spelling printed %r, not %r' % (name, deprecation_lines(old.stderr), want))
    if deprecation_lines(new.stderr):
        fail('%s: the new spelling printed %r' % (name, deprecation_lines(new.stderr)))
    if old.returncode != new.returncode:
        fail('%s: exit %d (old) against %d (new)' % (name, old.returncode, new.returncode))
    if not expect_ok:
        errors = [[l for l in r.stderr.splitlines() if l.startswith('error:')] for r in (old, new)]
        if errors[0] != errors[1] or len(errors[1]) != 1:
            fail('%s: errors differ or are not one line: %r against %r' % (name, errors[0], errors[1]))
        elif error_has and error_has not in errors[1][0]:
            fail('%s: %r does not name %r' % (name, errors[1][0], error_has))
        print('ok %s: same error (%s)' % (name, errors[1][0] if errors[1] else '-'))
        return
    if old.returncode or new.returncode:
        return
    a, b = json.loads(old.stdout), json.loads(new.stdout)
    if keys is not None:
        a, b = pick(a, keys), pick(b, keys)
    if a != b:
        fail('%s: outputs differ:\n  old %s\n  new %s' % (name, json.dumps(a)[:600], json.dumps(b)[:600]))
    else:
        print('ok %s: same output (%d keys compared)' % (name, len(a)))
    return b


def check_codec(tmp):
    kv = os.path.join(tmp, 'syn.h5')
    run(['synth', '--out', kv, '--layers', '2', '--kv-heads', '2', '--head-dim', '16', '--tokens', '256', '--seed', '7'])
    keys = ['kv', 'codec', 'level', 'fp16_MB', 'threads', 'runs', 'repeats', 'bits_per_value', 'zstd_bits_per_value',
            'entropy_bytes', 'htscodecs_bytes', 'entropy_symbols', 'results/0/bytes', 'results/1/bytes',
            'results/2/bytes', 'gpu']
    base = ['bench', 'codec', '--repeats', '1', '--threads', '1', '--json']
    j = same('bench codec --kv', base + ['--kv', kv], base + [kv], [('--kv', 'the positional KV file')], keys)
    if j and j['kv'] != kv:
        fail('bench codec: "kv" is %r, not %r' % (j['kv'], kv))
    j = same('bench codec --rounds', base + [kv, '--rounds', '2'], base + [kv, '--runs', '2'], [('--rounds', '--runs')], keys)
    if j and j['runs'] != 2:
        fail('bench codec --runs 2: "runs" is %r' % j['runs'])
    same('bench codec --gpu-device', base + [kv, '--gpu-device', '3'], base + [kv, '--device', 'cuda:3'],
         [('--gpu-device', '--device cuda:N')], keys)
    same('bench codec --gpu-device (bad)', base + [kv, '--gpu-device', 'x'], base + [kv, '--device', 'cuda:x'],
         [('--gpu-device', '--device cuda:N')], expect_ok=False, error_has="'cuda:x'")
    # A bad value through an old spelling is refused under the new name, as the new spelling is.
    same('bench codec --rounds (bad)', base + [kv, '--rounds', '0'], base + [kv, '--runs', '0'], [('--rounds', '--runs')],
         expect_ok=False, error_has='--runs: Value 0 not in range')
    r = run(base + [kv, '--device', 'cpu'])
    if r.returncode == 0 and json.loads(r.stdout)['gpu'] != 'gpu: left out (--device cpu)':
        fail('bench codec --device cpu: gpu is %r' % json.loads(r.stdout)['gpu'])
    r = run(['bench', 'codec', '--json'], expect_ok=False)
    if r.returncode != 2 or 'kv is required' not in r.stderr:
        fail('bench codec without a KV: exit %d, %r' % (r.returncode, r.stderr.strip()))
    return kv


def check_model(tmp, kv):
    text = os.path.join(tmp, 'short.txt')
    with open(text, 'w') as f:
        f.write('The lighthouse keeper of Wrenfield counted the ships that passed each night. In the winter of the '
                'great storm he counted forty-one, and every one of them reached the harbour safely. The town '
                'remembered him for it long after the lighthouse went dark, and the children still sing his '
                'song on the longest night of the year, when the harbour lights are lit one by one.\n')
    bm = ['bench', 'model', '--decode', '1', '--threads', '1', '--json']
    keys = ['model', 'runs/0/prefill_tokens', 'runs/0/decode_tokens', 'weights', 'key_block', 'query_block']
    j = same('bench model --tokens', bm + ['--tokens', '16'], bm + ['--prefill-tokens', '16'],
             [('--tokens', '--prefill-tokens')], keys)
    if j and j['runs/0/prefill_tokens'] != 16:
        fail('bench model --prefill-tokens 16: prefill_tokens is %r' % j['runs/0/prefill_tokens'])
    # stream reads the positional KV (a synthetic one, not this context's: the same one-line error),
    # and --context takes a sample id.
    st = ['stream', '--context', 'story', '--bandwidth', '1Gbit', '--slo', '5', '--policy', 'int8', '--threads', '1',
          '--json']
    same('stream --kv', st + ['--kv', kv], st + [kv], [('--kv', 'the positional KV file')], expect_ok=False,
         error_has=kv + ': tokens:')
    sw = ['sweep', '--context', text, '--holdout-tokens', '24', '--key-bins', '8', '--value-bins', '8', '--chunks', '32',
          '--no-baselines', '--threads', '1', '--json']
    j = same('sweep --key-quantizers', sw + ['--key-quantizers', 'token,channel', '--value-quantizers', 'channel'],
             sw + ['--key-quantizer', 'token,channel', '--value-quantizer', 'channel'],
             [('--key-quantizers', '--key-quantizer'), ('--value-quantizers', '--value-quantizer')], ['points/0/key_quantizer', 'points/1/key_quantizer', 'points/0/value_quantizer',
                                 'points/0/bits_per_value', 'points/1/bits_per_value', 'points/0/kl', 'points/1/kl'])
    if j and [j['points/0/key_quantizer'], j['points/1/key_quantizer']] != ['token', 'channel']:
        fail('sweep --key-quantizer token,channel: points are %r' % j)
    # tune --eval: held-out contexts; with --codec transform they are refused, naming the new spelling.
    tu = ['tune', '--contexts', text, '--holdout-tokens', '24', '--codec', 'transform', '--threads', '1', '--json']
    same('tune --eval', tu + ['--eval', 'story'], tu + ['--held-out', 'story'], [('--eval', '--held-out')],
         expect_ok=False, error_has='--held-out')


def check_context_ids(tmp):
    """--context takes a sample id wherever it takes a file: capture of `story` is the capture of
    samples/contexts/story.txt (the stream check above already runs `stream --context story`)."""
    story = os.path.join(SRC, 'samples', 'contexts', 'story.txt')
    cap = ['capture', '--threads', '1', '--json']
    a = run(cap + ['--context', 'story', '--out', os.path.join(tmp, 'id.h5')])
    b = run(cap + ['--context', story, '--out', os.path.join(tmp, 'file.h5')])
    if a.returncode or b.returncode:
        return
    a, b = json.loads(a.stdout), json.loads(b.stdout)
    if (a['num_tokens'], a['bytes_fp16']) != (b['num_tokens'], b['bytes_fp16']):
        fail('capture --context story: %d tokens, %d bytes; the file gives %d, %d'
             % (a['num_tokens'], a['bytes_fp16'], b['num_tokens'], b['bytes_fp16']))
    else:
        print('ok capture --context story: the sample file (%d tokens)' % a['num_tokens'])


def check_eta(tmp):
    """eval --suite's progress lines on stderr give a real ETA (they once said "ETA 0 s" at every
    reference and prefill step). Before the scoring starts, a line that has run S >= 1 s expects
    more than 0 s, and `reference d/n` with d < n at least S x (n - d) / n (the references left
    alone take that at the pace so far; 1 s of rounding allowed)."""
    # A small suite of our own: three parts of the story sample, one multiple-choice question each.
    with open(os.path.join(SRC, 'samples', 'contexts', 'story.txt'), encoding='utf-8') as f:
        story = f.read()
    third = len(story) // 3
    items = [{'id': 'part%d' % i, 'context': story[i * third:(i + 1) * third],
              'questions': [{'question': 'Is this text a story?', 'answer': 'yes', 'choices': ['yes', 'no']}]}
             for i in range(3)]
    suite = os.path.join(tmp, 'eta_suite.json')
    with open(suite, 'w') as f:
        json.dump({'name': 'eta', 'items': items}, f)
    r = run(['eval', '--suite', suite, '--levels', '1', '--baselines', 'none', '--no-suite-cache', '--threads', '1',
             '--json'])
    if r.returncode:
        return
    lines = [l.strip() for l in r.stderr.splitlines() if ' ETA ' in l]
    if not lines:
        fail('eval --suite: no progress line with an ETA on stderr')
        return
    judged, bad = 0, []
    for l in lines:
        words = l.replace('(', ' ').replace(')', ' ').replace(',', ' ').split()
        at = words.index('ETA')
        try:
            done, total = (int(x) for x in words[at - 3].split('/'))
            elapsed, eta = float(words[at - 2]), float(words[at + 1])
        except ValueError:
            fail('eval --suite: a progress line that does not parse: %r' % l)
            return
        if words[0] == 'score':
            break  # the references are done: from here an ETA of 0 s can be right
        if elapsed < 1:
            continue
        judged += 1
        low = elapsed * (total - done) / total - 1 if words[0] == 'reference' and done < total else 0.5
        if eta < low:
            bad.append(l)
    if bad:
        fail('eval --suite: ETAs too low before the scoring: %r' % bad[:3])
    elif not judged:
        print('note: eval --suite ran too fast to judge its ETA (no line after 1 s before the scoring)')
    else:
        print('ok eval --suite ETA: %d lines judged, e.g. %r' % (judged, lines[1] if len(lines) > 1 else lines[0]))


def check_help():
    top = run(['--help']).stdout.split('Subcommands:', 1)[1]
    commands = [l.split()[0] for l in top.splitlines() if l.startswith('  ') and l.split()]
    commands = [c for c in commands if c != 'bench'] + ['bench codec', 'bench model']
    # Each --help once, a few at a time (the binary takes seconds to start on a loaded machine).
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        helps = dict(zip(commands, pool.map(lambda c: run(c.split() + ['--help']).stdout, commands)))
    for command in MODEL_COMMANDS:
        text = helps[command]
        missing = [o for o in MODEL_GROUP if o not in text]
        if missing or '\nModel:' not in text:
            fail('%s --help: the model group lacks %s' % (command, missing or 'its heading'))
    for command in commands:
        text = helps[command].rstrip().splitlines()
        if len(text) < 2 or text[-2] != 'Example:' or not text[-1].startswith('  kvscope-cli ' + command + ' '):
            fail('%s --help: does not end with "Example:" and one kvscope-cli %s line' % (command, command))
    hidden = {'bench codec': ['--kv', '--rounds', '--gpu-device'], 'stream': ['--kv '], 'bench model': ['--tokens '],
              'sweep': ['--key-quantizers', '--value-quantizers'], 'tune': ['--eval ']}
    for command, names in hidden.items():
        text = helps[command]
        shown = [n for n in names if n in text]
        if shown:
            fail('%s --help shows the deprecated %s' % (command, shown))
    print('ok help: model group in %d commands, an example in %d, no deprecated spelling shown'
          % (len(MODEL_COMMANDS), len(commands)))


def check_refusals():
    # Options that one command takes and one of its modes would ignore are refused, not dropped.
    for extra in (['--transform-profile', 'other.json'], ['--only-transform']):
        r = run(['eval', '--suite', 'suite.json'] + extra, expect_ok=False)
        if r.returncode == 0 or 'apply to one --context' not in r.stderr:
            fail('eval --suite %s: not refused (exit %d: %s)' % (extra[0], r.returncode, r.stderr.strip()[-200:]))
    print('ok refusals: eval --suite refuses --transform-profile and --only-transform')


def have_model():
    r = subprocess.run([CLI, 'info', '--json'], capture_output=True, text=True, timeout=300)
    return r.returncode == 0


def main(argv):
    global CLI
    if len(argv) != 2:
        sys.exit(__doc__)
    CLI = argv[1]
    with tempfile.TemporaryDirectory(prefix='kvscope-grammar-') as tmp:
        check_help()
        check_refusals()
        kv = check_codec(tmp)
        if have_model():
            check_model(tmp, kv)
            check_context_ids(tmp)
            check_eta(tmp)
        else:
            print('note: no default model (installer/setup.sh): the model commands were not run')
    if FAILURES:
        print('%d failures' % len(FAILURES), file=sys.stderr)
        return 1
    print('all passed')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
