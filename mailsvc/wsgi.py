"""The module gunicorn loads (``mailsvc.wsgi:app``): the service on the environment's settings.

Building the app opens nothing; ``gunicorn.conf.py`` starts delivery in each worker after fork.
"""

from . import create_app

app = create_app()
