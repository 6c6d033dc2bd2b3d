"""``python -m zerogr_core``: see :mod:`zerogr_core.cli`."""
from .cli import main

raise SystemExit(main())
