import sys

from toolspec.cli import main

sys.exit(main())
