"""``goblin-claim``: the operator's command line, one module per command group. Imports the drivers, never a door."""
