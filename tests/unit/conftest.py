import os
import sys

# unit test helpers (e.g. the offline CRD admission) live beside the tests
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "api"))
