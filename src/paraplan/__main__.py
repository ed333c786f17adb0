"""`python -m paraplan ...`: the same as the `paraplan` command."""

from .cli import main

raise SystemExit(main())
