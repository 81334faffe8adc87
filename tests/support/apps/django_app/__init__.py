"""A minimal Django project served under uvicorn behind IdempotencyMiddleware, for the disconnect tests."""
