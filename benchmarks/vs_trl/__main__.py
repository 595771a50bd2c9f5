"""`python benchmarks/vs_trl ...` (a folder with a __main__.py) or, from benchmarks/,
`python -m vs_trl ...`: the parent, or with --worker one side's process (rounds.py starts them
so)."""

import sys
from pathlib import Path

# Run as a folder, Python puts the folder itself first on sys.path; the package and its siblings
# (cycle, realistic_workload, quickstart_workload) are imported from benchmarks/ instead, and no
# module of the package may shadow a top-level one.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from vs_trl.cli import main  # noqa: E402 - after the path above

main()
