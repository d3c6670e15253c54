#!/usr/bin/env python
"""Django's command-line utility for Gantry.

In development it also reads the env file ``make run`` writes (``var/dev.env``, or the
file ``GANTRY_DEV_ENV_FILE`` names), so the README's management commands work in a shell
of their own; see ``controlplane.env.development_env`` for when it is (not) read.
"""

import os
import sys
from pathlib import Path

DEV_ENV_FILE = Path(__file__).resolve().parent / "var" / "dev.env"


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from django.core.management import execute_from_command_line

    from controlplane.startup import configuration_guard

    def start() -> None:
        import django
        from django.conf import settings

        from controlplane.env import development_env

        path = Path(os.environ.get("GANTRY_DEV_ENV_FILE") or DEV_ENV_FILE)
        os.environ.update(development_env(path))
        # Load settings here, so a configuration mistake is one line, not a traceback.
        settings.INSTALLED_APPS  # noqa: B018
        django.setup()
        execute_from_command_line(sys.argv)

    configuration_guard(start)


if __name__ == "__main__":
    main()
