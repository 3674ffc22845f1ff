"""``python -m moesd.cli``: the ``moesd`` command."""

import sys

from moesd.cli import main

sys.exit(main())
