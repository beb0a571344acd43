#!/usr/bin/env python
"""Django's command-line utility for the django-jobq test project."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    # Make django_jobq importable from a checkout without installing it.
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
