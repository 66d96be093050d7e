"""`python3 agent.pyz ...`: the zipapp's entry point (`main.main`)."""

import sys

from .main import main

sys.exit(main())
