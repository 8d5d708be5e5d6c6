"""``python -m companion.course``: the same as ``python -m companion course``."""

import sys

from companion.course import main

sys.exit(main())
