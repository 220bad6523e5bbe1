#!/usr/bin/env python3
"""Run by `meson install`: says where the Python module went and whether this python3 imports it from there."""
import os
import sys

where = os.path.normpath(sys.argv[1])
searched = {os.path.realpath(p) for p in sys.path[1:] if p}
if os.path.realpath(where) in searched:
    print(f"retort: Python module installed in {where}, which {sys.executable} searches")
else:
    print(f"retort: Python module installed in {where}; {sys.executable} does not search there. Use:\n"
          f"  export PYTHONPATH={where}${{PYTHONPATH:+:$PYTHONPATH}}")
