#!/usr/bin/env python3
"""Write the machine and the code a set of held-out rows is measured with (heldout_table.py prints
it in the page): machine_json.py OUT.json CLI"""
import json
import os
import subprocess
import sys
import time

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit + ("+dirty" if dirty else ""),
           "cpu": cpu, "cores": os.cpu_count(), "load_average": os.getloadavg()[0], "cli": sys.argv[2]},
          open(sys.argv[1], "w"), indent=1)
