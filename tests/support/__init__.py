"""What the tests run on: servers, the fault proxy, the nemesis, child-process work, the protocol's model."""
