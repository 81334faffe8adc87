"""Client libraries beside redis-py (valkey-py, GLIDE) and the direct round trip."""
