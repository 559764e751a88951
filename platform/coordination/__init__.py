"""Cluster metadata in ZooKeeper (through kazoo): brokers, topics, partition state, configs."""
