import os

from django.core.asgi import get_asgi_application

from controlplane.startup import configuration_guard

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
application = configuration_guard(get_asgi_application)
