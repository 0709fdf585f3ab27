"""A broker's view of ZooKeeper: Kafka's znode layout (znodes.py) and an asyncio client (client.py)."""
