"""A train-server job for the crash-point walk: records that it ran (its job id, one line per run, in
the marker file argv[1]), then waits for the gate file argv[2] ("-": no wait). Ctrl-C (the server's
stop) ends it as stopped."""

import os
import sys
import time

marker, gate = sys.argv[1], sys.argv[2]
with open(marker, "a") as f:
    f.write(os.environ["TRAINFORGE_JOB_ID"] + "\n")
while gate != "-" and not os.path.exists(gate):
    time.sleep(0.02)  # the test creates the gate file when the job may end
