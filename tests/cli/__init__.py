"""The goblin-claim command: doctor, inspect, forget, scan, stats, in a shell."""
