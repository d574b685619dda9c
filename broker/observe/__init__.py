"""Observability, read only: the Prometheus endpoint (metrics, building its
families in scrape, families and exporter; a cluster node's in
cluster_families) and a cluster node's view (cluster_view). The verbs that
write (`shoal ctl`, `shoal policy`) are broker/operate/."""
