"""Settings for the django-jobq test project (the demo and the test suite).

The database comes from ``DATABASE_URL`` (default: PostgreSQL on 127.0.0.1:5432 as
``postgres``, database ``jobq``). ``scripts/demo`` and ``scripts/test`` set it.
"""

import os
from pathlib import Path

import dj_database_url
import django

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SECRET_KEY", "insecure-key-for-the-demo-only")
DEBUG = os.environ.get("DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobq",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "testproject.wsgi.application"

DATABASES = {
    "default": dj_database_url.config(
        default="postgres://postgres@127.0.0.1:5432/jobq",
        # The demo's workers run with 60, as a deployment would: with 0 (Django's default)
        # every job opens a new database connection.
        conn_max_age=int(os.environ.get("CONN_MAX_AGE", "0")),
    ),
}

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The shop's jobs (testproject/shop/jobs.py) send email and call a partner's webhook.
_EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.locmem.EmailBackend")
if django.VERSION >= (6, 1):  # MAILERS replaces EMAIL_BACKEND (deprecated in 6.1)
    MAILERS = {"default": {"BACKEND": _EMAIL_BACKEND}}
else:
    EMAIL_BACKEND = _EMAIL_BACKEND
DEFAULT_FROM_EMAIL = "shop@example.com"
SHOP_WEBHOOK_URL = os.environ.get("SHOP_WEBHOOK_URL", "http://127.0.0.1:8765/hook")

JOBQ = {
    # Short retry waits so the demo's flaky webhook calls recover within seconds.
    "RETRY_BACKOFF_BASE": 0.5,
    "RETRY_BACKOFF_CAP": 2,
}
