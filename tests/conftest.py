"""Test-session settings that must precede the first `import jaxsched`."""

import os

# xdist already runs one worker per core (`make test`), so each worker takes one CPU device
# rather than one per core (`jaxsched.engine.devices`); subprocesses inherit it.
# tests/test_sharding.py and tests/test_batch_chunks.py check the multi-device paths.
os.environ.setdefault("JAXSCHED_CPU_DEVICES", "1")
