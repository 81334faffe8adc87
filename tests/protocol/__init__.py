"""The protocol and its implementations: the seed's table, the model, the module, the scripts, Valkey's owner checks."""
