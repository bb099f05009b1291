"""`python -m vanilla_transformer SUBCOMMAND ...`: the same as `vanilla-transformer SUBCOMMAND ...`."""

import sys

from vanilla_transformer.commands.main import main

sys.exit(main())
