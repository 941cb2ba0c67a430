# The suite's Celery app, imported as a Django project imports its own: it is Celery's current app.
from tests.celery_app import app as celery_app

__all__ = ["celery_app"]
