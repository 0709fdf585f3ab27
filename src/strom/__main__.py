import sys

from strom.cli.main import main

sys.exit(main())
