"""python -m mltorch.importers: mltorch-import (as run in MACE's environment)."""
import sys

from . import main

sys.exit(main())
