"""`python -m scalelab.cli ...`: how launchers start worker processes."""

import sys

from scalelab.cli import main

sys.exit(main())
