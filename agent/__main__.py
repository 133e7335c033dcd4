import sys

from agent.daemon import main

sys.exit(main())
