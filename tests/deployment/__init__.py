"""How servers are deployed: clusters that reshape, failovers, Sentinel, replication, persistence, ACL users."""
