"""``python -m server.cli``: how the cluster launcher and the tests start agents and commands."""

import sys

from server.cli import main

sys.exit(main())
