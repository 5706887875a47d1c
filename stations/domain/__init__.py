"""The domain: stations, the id window, producer sessions, the log, groups, the DLS and the
scheduler. It decides; the store (``stations.store``) speaks SQL and ``stations.api`` speaks HTTP."""
