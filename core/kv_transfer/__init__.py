"""KV transfer between engines: the KVConnector interface and connectors."""
