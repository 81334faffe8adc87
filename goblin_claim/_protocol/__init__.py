"""The wire protocol as plain values: scripts, records, checks, the probe, timing. Imports no client library."""
