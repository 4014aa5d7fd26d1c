"""``python -m rawflux.tune``: the fused ops' ahead-of-time tuning (rawflux/bench/tune_ahead.py,
a tool above the ops; nothing in rawflux.tune imports it)."""
import sys

from rawflux.bench.tune_ahead import main

sys.exit(main())
