"""Test configuration: ``tests/`` on the import path (strategies, twin), and GPU tests skipped cleanly."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
