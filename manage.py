#!/usr/bin/env python
"""Django's command-line utility for Gantry."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from django.core.management import execute_from_command_line

    from controlplane.startup import configuration_guard

    def start() -> None:
        import django
        from django.conf import settings

        # Load settings here, so a configuration mistake is one line, not a traceback.
        settings.INSTALLED_APPS  # noqa: B018
        django.setup()
        execute_from_command_line(sys.argv)

    configuration_guard(start)


if __name__ == "__main__":
    main()
