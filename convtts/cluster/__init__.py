"""Many nodes: the Ray driver that hands shards to slots anywhere in a cluster, and the actors it starts."""
