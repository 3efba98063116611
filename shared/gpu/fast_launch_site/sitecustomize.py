"""Put this directory on PYTHONPATH to run any cake process with shared/gpu/fast_launch.py
installed (CAKE_FAST_LAUNCH_CHECK=1: every hit also checked against Triton's own cache); the
counts of hits, misses and Triton-path launches go to stderr at exit."""
import atexit
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import fast_launch
except ImportError as e:  # no Triton in this interpreter: nothing to install
    print(f"fast_launch not installed: {e}", file=sys.stderr)
else:
    fast_launch.install(check=os.environ.get("CAKE_FAST_LAUNCH_CHECK") == "1")
    atexit.register(lambda: print(f"fast_launch: {fast_launch.STATS}", file=sys.stderr))
