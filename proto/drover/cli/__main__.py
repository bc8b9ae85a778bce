"""``python -m drover.cli``: how the cluster launcher and the tests start agents and commands."""

import sys

from drover.cli import main

sys.exit(main())
