"""Run `kvscope-cli COMMAND ... --json` and return what it printed, for the scripts of this folder."""
import json
import subprocess


def cli_json(cli, *args):
    """The parsed JSON of `cli *args --json`; exits with the command's last stderr line when it fails."""
    r = subprocess.run([cli, *args, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        err = r.stderr.strip()
        raise SystemExit(f"kvscope-cli {args[0]} failed: {err.splitlines()[-1] if err else f'exit {r.returncode}'}")
    return json.loads(r.stdout)
