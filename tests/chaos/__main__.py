import sys

from tests.chaos.storm import main

sys.exit(main())
