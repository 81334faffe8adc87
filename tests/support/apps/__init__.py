"""The real apps the tests serve and the real workers they start: Django, Flask and the job queues' apps."""
