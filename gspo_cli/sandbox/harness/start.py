"""The harness's entry script, kept tiny: a script is compiled at every start, while runner.py
and the other modules load from their cached bytecode (see sandbox.precompile_harness)."""

import sys

sys.path.insert(0, __file__.rpartition("/")[0])
import runner

runner.start()
