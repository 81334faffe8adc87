"""The client libraries: families, errors, GLIDE, per-client state, the round trip, cluster rounds. No driver."""
