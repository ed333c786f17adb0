"""`torchrun ... -m paraplan.run [flags | --config FILE]`: one worker rank."""

import os
import sys

if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:  # checked before torch loads
    sys.stderr.write("paraplan: error: python -m paraplan.run is a torchrun worker; start it with torchrun "
                     "(or use `paraplan run`, which does)\n")
    raise SystemExit(2)

from .worker import main  # noqa: E402

raise SystemExit(main())
