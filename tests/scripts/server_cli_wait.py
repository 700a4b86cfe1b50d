"""A job script for the CLI tests: prints ``waiting for GO_FILE``, polls until that file exists
(the test creates it to end the job), prints ``line 0`` .. ``line N-1`` and ``released``.
``--child``: first starts a child process that sleeps (a process of the job that stop must end).

usage: server_cli_wait.py GO_FILE [--lines N] [--child]
"""

import argparse
import os
import subprocess
import sys
import time

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("go_file")
    parser.add_argument("--lines", type=int, default=0)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"child pid {child.pid}", flush=True)
    print(f"waiting for {args.go_file}", flush=True)
    while not os.path.exists(args.go_file):
        time.sleep(0.05)
    for i in range(args.lines):
        print(f"line {i}")
    print("released", flush=True)
