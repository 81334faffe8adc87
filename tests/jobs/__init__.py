"""The job-queue doors under real workers (Celery, RQ, Dramatiq, arq), their shared rule, and stream consumers."""
