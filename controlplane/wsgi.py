import os

from django.core.wsgi import get_wsgi_application

from controlplane.startup import configuration_guard

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
application = configuration_guard(get_wsgi_application)
