"""``python -m flower_app.cli`` = the ``flower-app`` console script."""

import sys

from flower_app.cli import main

sys.exit(main())
