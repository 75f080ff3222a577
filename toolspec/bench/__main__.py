import sys

from toolspec.bench.main import main

sys.exit(main())
