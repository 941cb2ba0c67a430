#!/usr/bin/env python
"""Django's command-line utility for the demo project (and the test settings, via DJANGO_SETTINGS_MODULE)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
