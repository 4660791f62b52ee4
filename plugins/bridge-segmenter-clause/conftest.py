"""Lets the tests import the plugin module from a checkout, installed or not."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
