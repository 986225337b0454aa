"""python -m torch_ort: what this installation is and whether it trains (torch_ort/configure.py)."""
import sys

from torch_ort.configure import main

sys.exit(main(sys.argv[1:]))
