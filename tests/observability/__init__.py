"""Events, logs and OpenTelemetry."""
