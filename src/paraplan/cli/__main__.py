"""`python -m paraplan.cli ...`: the same as the `paraplan` command."""

from .main import main

raise SystemExit(main())
