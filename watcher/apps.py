from django.apps import AppConfig


class WatcherConfig(AppConfig):
    name = "watcher"
    verbose_name = "Watcher"
