"""A job script for the CLI tests that ends at once: ``raise`` (an exception) or an exit code.

usage: server_cli_end.py raise | CODE
"""

import sys

if __name__ == "__main__":
    print(f"ending with {sys.argv[1]} (argv {sys.argv[1:]})", flush=True)
    if sys.argv[1] == "raise":
        raise RuntimeError("the script failed on purpose")
    sys.exit(int(sys.argv[1]))
