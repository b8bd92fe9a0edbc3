"""A script that knows nothing of spotnb and ends by itself after argv[1] seconds."""

import sys
import time

time.sleep(float(sys.argv[1]))
print("done", flush=True)
