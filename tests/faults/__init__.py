"""Faults: re-sent commands and lost replies on every backend, real faults on real servers, the fault proxy."""
