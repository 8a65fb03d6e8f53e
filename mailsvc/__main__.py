"""``python -m mailsvc``: the operator CLI."""

from .cli import main

raise SystemExit(main())
