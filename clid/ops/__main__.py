"""python -m clid.ops build"""
import sys

from clid.ops.build import main

sys.exit(main())
